// RequestStep::wants_logits: a request that does not want logits (an engine's prefill chunk that
// does not reach the end of its prompt) gets no row, and the other rows are what they are when
// every request wants its logits. On every transformers fixture (f32 KV), one mixed step of three
// requests is run twice over two pools with the same page ids: once with every request wanting
// logits (the reference run), once with the middle request's chunk not wanting them; in both row
// modes (last row of each request, every row). Checked:
//  - the second run returns exactly the wanted requests' rows, in request order, each equal to the
//    reference run's row for every vocabulary entry (f32; only the lm_head GEMM's row count
//    differs, which may change OpenBLAS's blocking: bound 2e-5 relative, as the invariance tests);
//  - those rows agree with transformers' logits (log-softmax within 1e-4, forward_transformers_
//    test's f32-KV bound), and so does the skipped request's last row once its next chunk runs:
//    its K/V were written although its rows never reached the lm_head;
//  - a step in which no request wants logits returns 0 rows and still writes the K/V.
// RequestStep::num_logit_rows (the last k rows of a request, an engine's prompt-logprobs prefill):
// prompts fed in chunks beside each other, each request asking for a different k per step (1, a
// few, every row of the chunk); each returned row is transformers' row of that prompt position
// (log-softmax within 1e-4), in request order and token order.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"

namespace pagedattn::model {
namespace {

using testing::Fixture;

constexpr double kSameRunTolerance = 2e-5;   // relative, f32 summation order
constexpr double kTransformersBound = 1e-4;  // |dlogprob|, f32 KV (forward_transformers_test)

std::string compare_row(std::span<const float> got, std::span<const float> expected,
                        const std::string& what) {
  if (got.size() != expected.size()) {
    return fmt::format("{}: {} logits, expected {}", what, got.size(), expected.size());
  }
  for (size_t v = 0; v < got.size(); ++v) {
    const double diff = std::abs(double{got[v]} - expected[v]);
    if (!(diff <= kSameRunTolerance * (1 + std::abs(expected[v])))) {
      return fmt::format("{}: logit {}: {} vs {}", what, v, got[v], expected[v]);
    }
  }
  return "";
}

double max_logprob_diff(std::span<const float> ours, std::span<const float> theirs) {
  const std::vector<double> a = testing::log_softmax(ours);
  const std::vector<double> b = testing::log_softmax(theirs);
  double worst = 0;
  for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
  return worst;
}

struct PoolRun {
  KvPool pool;
  testing::PageSource pages;
  std::vector<testing::Sequence> seqs;
  PoolRun(const Model& model, int64_t num_pages, size_t requests)
      : pool(model.make_kv_pool(
            {.alloc_page_size = 16, .dtype = DType::kF32, .num_pages = num_pages})),
        pages(num_pages, 17),
        seqs(requests) {}

  // One step: tokens[r] are request r's new tokens (none: not in the step), wants[r] whether it
  // wants logits, last_rows[r] (if given) how many of its last rows.
  Logits step(Model& model, const std::vector<std::vector<int32_t>>& tokens,
              const std::vector<bool>& wants, LogitsRows rows,
              const std::vector<int32_t>& last_rows = {}) {
    Step step;
    step.rows = rows;
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (tokens[r].empty()) continue;
      seqs[r].reserve(static_cast<int64_t>(seqs[r].tokens.size() + tokens[r].size()), 16, pages);
      RequestStep request{
          tokens[r], static_cast<int32_t>(seqs[r].tokens.size()), {}, seqs[r].block_table};
      request.wants_logits = wants[r];
      if (!last_rows.empty()) request.num_logit_rows = last_rows[r];
      step.requests.push_back(request);
    }
    Logits logits = model.forward(step, pool);
    for (size_t r = 0; r < tokens.size(); ++r) {
      seqs[r].tokens.insert(seqs[r].tokens.end(), tokens[r].begin(), tokens[r].end());
    }
    return logits;
  }
};

class ForwardLogitRows : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardLogitRows, OnlyWantedRowsEqualToTheAllRowsRun) {
  const Fixture fixture = Fixture::load(GetParam());
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  Model model(checkpoint.config(), checkpoint.weights());
  ASSERT_GE(fixture.prompts.size(), 3u);
  const auto& p0 = fixture.prompts[0];
  const auto& p1 = fixture.prompts[1];
  const auto& p2 = fixture.prompts[2];
  ASSERT_GE(p1.prompt.size(), 2u);
  const size_t half = p1.prompt.size() / 2;
  // Step 1: prompt 0 whole, the first half of prompt 1 (a chunk: no logits wanted), prompt 2 whole.
  const std::vector<std::vector<int32_t>> step1 = {
      p0.prompt,
      {p1.prompt.begin(), p1.prompt.begin() + static_cast<std::ptrdiff_t>(half)},
      p2.prompt};
  const std::vector<bool> all = {true, true, true}, mixed = {true, false, true};
  const int64_t num_pages = 64;

  for (LogitsRows mode : {LogitsRows::kLastOfEachRequest, LogitsRows::kAll}) {
    const bool every_row = mode == LogitsRows::kAll;
    SCOPED_TRACE(every_row ? "every row" : "last row");
    PoolRun reference(model, num_pages, 3), run(model, num_pages, 3);
    const Logits expected = reference.step(model, step1, all, mode);
    const Logits got = run.step(model, step1, mixed, mode);

    // The rows of each request in the reference run: [first, first + count).
    std::vector<int64_t> first(3), count(3);
    int64_t next = 0;
    for (size_t r = 0; r < 3; ++r) {
      count[r] = every_row ? static_cast<int64_t>(step1[r].size()) : 1;
      first[r] = next;
      next += count[r];
    }
    ASSERT_EQ(expected.rows, next);
    ASSERT_EQ(got.rows, count[0] + count[2]) << "the skipped request still has rows";
    ASSERT_EQ(got.vocab, fixture.vocab);
    ASSERT_EQ(static_cast<int64_t>(got.values.size()), got.rows * got.vocab);
    int64_t row = 0;
    for (size_t r : {size_t{0}, size_t{2}}) {
      for (int64_t i = 0; i < count[r]; ++i, ++row) {
        EXPECT_EQ(compare_row(got.row(row), expected.row(first[r] + i),
                              fmt::format("request {} row {}", r, i)),
                  "");
      }
    }
    // Against transformers: the last prompt row of requests 0 and 2.
    const int64_t last0 = every_row ? count[0] - 1 : 0;
    const int64_t last2 = count[0] + count[2] - 1;
    EXPECT_LE(
        max_logprob_diff(got.row(last0),
                         fixture.row(p0.first_row + static_cast<int64_t>(p0.prompt.size()) - 1)),
        kTransformersBound);
    EXPECT_LE(
        max_logprob_diff(got.row(last2),
                         fixture.row(p2.first_row + static_cast<int64_t>(p2.prompt.size()) - 1)),
        kTransformersBound);

    // Step 2: the rest of prompt 1 (wants logits) beside decode tokens of 0 and 2 that want none:
    // request 1's K/V from step 1 must be there although its rows skipped the lm_head.
    const std::vector<std::vector<int32_t>> step2 = {
        {p0.generated[0]},
        {p1.prompt.begin() + static_cast<std::ptrdiff_t>(half), p1.prompt.end()},
        {p2.generated[0]}};
    const Logits second = run.step(model, step2, {false, true, false}, mode);
    const int64_t rows1 = every_row ? static_cast<int64_t>(step2[1].size()) : 1;
    ASSERT_EQ(second.rows, rows1);
    EXPECT_LE(
        max_logprob_diff(second.row(rows1 - 1),
                         fixture.row(p1.first_row + static_cast<int64_t>(p1.prompt.size()) - 1)),
        kTransformersBound);
    if (every_row) {
      for (int64_t i = 0; i < rows1; ++i) {
        const int64_t position = static_cast<int64_t>(half) + i;
        EXPECT_LE(max_logprob_diff(second.row(i), fixture.row(p1.first_row + position)),
                  kTransformersBound)
            << "prompt 1 position " << position;
      }
    }

    // Step 3: no request wants logits: no rows, and the K/V still written (the next decode of
    // prompt 0 is transformers' second decode row).
    const Logits none = run.step(model, {{p0.generated[1]}, {}, {}}, {false, false, false}, mode);
    EXPECT_EQ(none.rows, 0);
    EXPECT_TRUE(none.values.empty());
    const Logits after = run.step(model, {{p0.generated[2]}, {}, {}}, {true, false, false}, mode);
    ASSERT_EQ(after.rows, 1);
    // Prompt 0's decode rows follow its prompt rows; generated[2] is its third decode input.
    EXPECT_LE(
        max_logprob_diff(after.row(0),
                         fixture.row(p0.first_row + static_cast<int64_t>(p0.prompt.size()) + 2)),
        kTransformersBound);
  }
}

TEST_P(ForwardLogitRows, LastKRowsOfEachChunkEqualTransformers) {
  const Fixture fixture = Fixture::load(GetParam());
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  Model model(checkpoint.config(), checkpoint.weights());
  ASSERT_GE(fixture.prompts.size(), 3u);
  PoolRun run(model, 64, 3);
  std::vector<size_t> fed(3, 0);  // prompt tokens fed so far, per request
  // Per step and request: (chunk length, rows wanted); chunk 0: not in the step. The chunk
  // lengths are cut to what is left of each prompt (5, 17 and 40 tokens in the fixtures).
  const std::vector<std::vector<std::pair<size_t, int32_t>>> plan = {
      {{3, 3}, {7, 1}, {16, 16}},
      {{2, 2}, {6, 4}, {10, 2}},
      {{0, 0}, {2, 2}, {14, 14}},
      {{0, 0}, {100, 100}, {100, 3}},
  };
  for (size_t s = 0; s < plan.size(); ++s) {
    std::vector<std::vector<int32_t>> tokens(3);
    std::vector<bool> wants(3, false);
    std::vector<int32_t> last_rows(3, 1);
    for (size_t r = 0; r < 3; ++r) {
      const std::vector<int32_t>& prompt = fixture.prompts[r].prompt;
      const size_t length = std::min(plan[s][r].first, prompt.size() - fed[r]);
      tokens[r].assign(prompt.begin() + static_cast<std::ptrdiff_t>(fed[r]),
                       prompt.begin() + static_cast<std::ptrdiff_t>(fed[r] + length));
      wants[r] = length > 0;
      last_rows[r] = static_cast<int32_t>(
          std::min<size_t>(static_cast<size_t>(plan[s][r].second), std::max<size_t>(length, 1)));
    }
    const Logits got = run.step(model, tokens, wants, LogitsRows::kLastOfEachRequest, last_rows);
    int64_t row = 0;
    for (size_t r = 0; r < 3; ++r) {
      const size_t length = tokens[r].size();
      if (length == 0) continue;
      for (size_t i = length - static_cast<size_t>(last_rows[r]); i < length; ++i, ++row) {
        ASSERT_LT(row, got.rows) << "step " << s;
        const int64_t position = static_cast<int64_t>(fed[r] + i);
        EXPECT_LE(
            max_logprob_diff(got.row(row), fixture.row(fixture.prompts[r].first_row + position)),
            kTransformersBound)
            << "step " << s << " request " << r << " position " << position;
      }
      fed[r] += length;
    }
    EXPECT_EQ(got.rows, row) << "step " << s;
  }
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(fed[r], fixture.prompts[r].prompt.size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardLogitRows, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedattn::model
