// Invariances of Model::forward that an engine relies on, on the transformers fixtures' tiny
// models (f32 KV, so differences are only summation order): the attention page size (1, 16, 64,
// and 4 inside allocation pages of 16) does not change the logits; a prompt run in chunks of 1, 7
// and 64 tokens over the cached prefix equals one prefill; a batch (all prefills together, then
// all decodes together, and a mixed step of decodes beside a prefill chunk) equals its requests
// run alone. Every logit of every row is compared.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"

namespace pagedattn::model {
namespace {

using testing::Fixture;
using Rows = std::vector<std::vector<float>>;

// f32 throughout; only the order of sums differs (e.g. split KV chunks), ~1e-6 relative.
constexpr double kTolerance = 2e-5;

std::string compare_rows(const Rows& got, const Rows& expected, const std::string& what) {
  if (got.size() != expected.size()) {
    return fmt::format("{}: {} rows, expected {}", what, got.size(), expected.size());
  }
  for (size_t r = 0; r < got.size(); ++r) {
    for (size_t v = 0; v < got[r].size(); ++v) {
      const double diff = std::abs(double{got[r][v]} - expected[r][v]);
      if (!(diff <= kTolerance * (1 + std::abs(expected[r][v])))) {
        return fmt::format("{}: row {} logit {}: {} vs {}", what, r, v, got[r][v], expected[r][v]);
      }
    }
  }
  return "";
}

struct Loaded {
  Checkpoint checkpoint;
  Model model;
  Fixture fixture;
  explicit Loaded(const std::string& name)
      : checkpoint(Checkpoint::open(Fixture::load(name).directory)),
        model(checkpoint.config(), checkpoint.weights(), testing::cpu_options()),
        fixture(Fixture::load(name)) {}
  KvPool pool(int32_t alloc, int32_t page_size) {
    KvPoolConfig c;
    c.alloc_page_size = alloc;
    c.page_size = page_size;
    c.dtype = DType::kF32;
    c.num_pages = 3 * (80 + alloc - 1) / alloc + 8;
    return model.make_kv_pool(c);
  }
};

class ForwardInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardInvariance, PageSizeDoesNotChangeLogits) {
  Loaded m(GetParam());
  const auto& prompt = m.fixture.prompts[2];  // 40 tokens + 32 decode steps
  const std::vector<std::pair<int32_t, int32_t>> layouts = {{16, 16}, {1, 1}, {64, 64}, {16, 4}};
  Rows reference;
  for (const auto& [alloc, page_size] : layouts) {
    KvPool pool = m.pool(alloc, page_size);
    testing::PageSource pages(pool.num_pages(), 11);
    const Rows rows = testing::run_sequence(m.model, pool, pages, prompt.prompt, prompt.generated);
    if (reference.empty()) {
      reference = rows;
    } else {
      EXPECT_EQ(compare_rows(rows, reference, fmt::format("alloc {} / P {}", alloc, page_size)),
                "");
    }
  }
}

TEST_P(ForwardInvariance, ChunkedPrefillEqualsOnePrefill) {
  Loaded m(GetParam());
  const auto& prompt = m.fixture.prompts[2];
  const std::span<const int32_t> decode(prompt.generated.data(), 4);
  Rows reference;
  for (int64_t chunk : {0, 1, 7, 64}) {
    KvPool pool = m.pool(16, 16);
    testing::PageSource pages(pool.num_pages(), 5);
    const Rows rows = testing::run_sequence(m.model, pool, pages, prompt.prompt, decode, chunk);
    if (chunk == 0) {
      reference = rows;
    } else {
      EXPECT_EQ(compare_rows(rows, reference, fmt::format("chunks of {}", chunk)), "");
    }
  }
}

TEST_P(ForwardInvariance, BatchEqualsRequestsAlone) {
  Loaded m(GetParam());
  const size_t n = m.fixture.prompts.size();
  const int decode_steps = 6;
  std::vector<Rows> alone(n);
  for (size_t p = 0; p < n; ++p) {
    KvPool pool = m.pool(16, 16);
    testing::PageSource pages(pool.num_pages(), 3 + p);
    const auto& fp = m.fixture.prompts[p];
    alone[p] = testing::run_sequence(m.model, pool, pages, fp.prompt,
                                     std::span<const int32_t>(fp.generated.data(), decode_steps));
  }
  KvPool pool = m.pool(16, 16);
  testing::PageSource pages(pool.num_pages(), 99);
  std::vector<testing::Sequence> seqs(n);
  std::vector<Rows> batched(n);
  // A step of one request per sequence; tokens[p] are its new tokens.
  const auto run_step = [&](const std::vector<std::vector<int32_t>>& tokens, LogitsRows rows) {
    Step step;
    step.rows = rows;
    for (size_t p = 0; p < n; ++p) {
      if (tokens[p].empty()) continue;
      seqs[p].reserve(static_cast<int64_t>(seqs[p].tokens.size() + tokens[p].size()), 16, pages);
      step.requests.push_back(
          {tokens[p], static_cast<int32_t>(seqs[p].tokens.size()), {}, seqs[p].block_table});
    }
    const Logits logits = m.model.forward(step, pool);
    int64_t row = 0;
    for (size_t p = 0; p < n; ++p) {
      if (tokens[p].empty()) continue;
      const int64_t count = rows == LogitsRows::kAll ? static_cast<int64_t>(tokens[p].size()) : 1;
      for (int64_t i = 0; i < count; ++i, ++row) {
        batched[p].emplace_back(logits.row(row).begin(), logits.row(row).end());
      }
      seqs[p].tokens.insert(seqs[p].tokens.end(), tokens[p].begin(), tokens[p].end());
    }
  };
  // Step 1: prompt 0 whole and the first 7 tokens of prompt 1; prompt 2 waits.
  const auto& p0 = m.fixture.prompts[0].prompt;
  const auto& p1 = m.fixture.prompts[1].prompt;
  const auto& p2 = m.fixture.prompts[2].prompt;
  run_step({p0, {p1.begin(), p1.begin() + 7}, {}}, LogitsRows::kAll);
  // Step 2 (mixed): prompt 0's first decode token beside prompt 1's rest and prompt 2 whole.
  run_step({{m.fixture.prompts[0].generated[0]}, {p1.begin() + 7, p1.end()}, p2}, LogitsRows::kAll);
  // Then decode steps; prompt 0 is one token ahead and stops one step early.
  for (int i = 0; i < decode_steps; ++i) {
    std::vector<std::vector<int32_t>> tokens(n);
    if (i + 1 < decode_steps) tokens[0] = {m.fixture.prompts[0].generated[i + 1]};
    tokens[1] = {m.fixture.prompts[1].generated[i]};
    tokens[2] = {m.fixture.prompts[2].generated[i]};
    run_step(tokens, LogitsRows::kLastOfEachRequest);
  }
  for (size_t p = 0; p < n; ++p) {
    EXPECT_EQ(compare_rows(batched[p], alone[p], fmt::format("prompt {} in a batch", p)), "");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardInvariance,
                         ::testing::Values("llama3_bf16", "qwen3_bf16", "deepseek_v2_f16",
                                           "deepseek_v3_bf16"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedattn::model
