// The model runtime against transformers: every fixture under tests/data/model/ (tiny random
// Llama 3, Llama with linear RoPE and sharded f16 files, Qwen2, Qwen3, DeepSeek-V2, DeepSeek-V3
// and DeepSeek-V3 with the real 512 + 64 latent widths; see its README.md) is loaded with
// Checkpoint::open and run through Model::forward over a paged KV pool with shuffled page ids:
// each prompt as one prefill (every row's logits kept), then the fixture's 32 greedy tokens fed
// as decode steps. Compared per row: |log_softmax(ours) - log_softmax(transformers)| for every
// vocabulary entry, and the greedy token of every row.
//
// Bounds:
//  - f32 KV cache: 1e-4. Both sides compute in f32 from the same stored weights (bf16/f16 values
//    are exact in f32); they differ in summation order (OpenBLAS vs torch GEMMs, the backend's
//    online softmax vs eager softmax) and in RoPE angles (ours from float64 position·inv_freq,
//    transformers' float32), each ~1e-6 relative. transformers' own cached vs uncached paths
//    differ by ~5e-6 (the README's floor); measured here: <= 8.5e-6 on every fixture (printed).
//    Greedy tokens must be identical.
//  - f16 KV cache: 1e-2. Rounding K/V to f16 perturbs each by <= 2^-11 relative; measured <= 5e-3.
//  - bf16 KV cache (the engine default): 5e-2 per row (SGLang's bound for bf16), every row for the
//    dense models. For the MoE models a 2^-9 perturbation can flip a top-k choice among near-tied
//    router scores (a discrete step): that token's output, and every later row attending to its
//    K/V, moves by O(1) (measured: up to 4.2 on a few rows of the DeepSeek-V3 fixtures, none with
//    f16 KV). There the bound is: the median row within 2e-2 and at least 85% of rows within 5e-2.
//    A greedy token may differ only where transformers' token is in our top 5 (vLLM's rule); for
//    the MoE models, on the rows within 5e-2 (a flipped row can lose it: measured once in each
//    DeepSeek-V3 fixture). How often is printed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"

namespace pagedattn::model {
namespace {

using testing::Fixture;

struct Comparison {
  double max_diff = 0;
  std::vector<double> row_max;  // per row: max over the vocabulary of |dlogprob|
  int64_t rows = 0, token_mismatches = 0, top5_misses = 0;
  int64_t top5_misses_within_bound = 0;  // on rows within 5e-2
  bool moe = false;
  double median() const {
    std::vector<double> v = row_max;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  double fraction_within(double bound) const {
    int64_t n = 0;
    for (double d : row_max) n += d <= bound;
    return static_cast<double>(n) / static_cast<double>(row_max.size());
  }
};

Comparison compare_fixture(const Fixture& fixture, DType kv_dtype, int32_t page_size) {
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  EXPECT_NEAR(checkpoint.config().softmax_scale(), fixture.softmax_scale, 1e-6);
  Model model(checkpoint.config(), checkpoint.weights(), testing::cpu_options());
  KvPoolConfig pool_config;
  pool_config.alloc_page_size = page_size;
  pool_config.dtype = kv_dtype;
  pool_config.num_pages = 4 * (128 + page_size - 1) / page_size + 8;
  KvPool pool = model.make_kv_pool(pool_config);
  testing::PageSource pages(pool.num_pages(), 7);
  Comparison result;
  result.moe = checkpoint.config().moe.has_value();
  for (const testing::FixturePrompt& prompt : fixture.prompts) {
    const auto rows = testing::run_sequence(model, pool, pages, prompt.prompt, prompt.generated);
    const int64_t prefill = static_cast<int64_t>(prompt.prompt.size());
    EXPECT_EQ(static_cast<int64_t>(rows.size()), prefill + 32);
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto expected_row = fixture.row(prompt.first_row + static_cast<int64_t>(r));
      const auto ours = testing::log_softmax(rows[r]);
      const auto theirs = testing::log_softmax(expected_row);
      double row_max = 0;
      for (size_t v = 0; v < ours.size(); ++v)
        row_max = std::max(row_max, std::abs(ours[v] - theirs[v]));
      result.max_diff = std::max(result.max_diff, row_max);
      result.row_max.push_back(row_max);
      ++result.rows;
      const int32_t expected_token = testing::argmax(expected_row);
      if (testing::argmax(rows[r]) != expected_token) {
        ++result.token_mismatches;
        if (!testing::in_top_k(rows[r], expected_token, 5)) {
          ++result.top5_misses;
          if (row_max <= 5e-2) ++result.top5_misses_within_bound;
        }
      }
    }
    // The greedy chain itself: the last prefill row picks generated[0], decode row i picks
    // generated[i + 1], the last one next_token.
    for (size_t i = 0; i < 32; ++i) {
      const int32_t want = i + 1 < 32 ? prompt.generated[i + 1] : prompt.next_token;
      if (kv_dtype == DType::kF32) {
        EXPECT_EQ(testing::argmax(rows[static_cast<size_t>(prefill) + i]), want)
            << fixture.name << " decode row " << i;
      }
    }
    if (kv_dtype == DType::kF32) {
      EXPECT_EQ(testing::argmax(rows[static_cast<size_t>(prefill) - 1]), prompt.generated[0])
          << fixture.name << " last prefill row";
    }
  }
  return result;
}

class ForwardVsTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardVsTransformers, F32KvMatchesLogprobsAndGreedyTokens) {
  const Fixture fixture = Fixture::load(GetParam());
  const Comparison c = compare_fixture(fixture, DType::kF32, 16);
  fmt::print("{}: f32 KV, {} rows, max |dlogprob| {:.3g}, greedy mismatches {}\n", fixture.name,
             c.rows, c.max_diff, c.token_mismatches);
  EXPECT_LE(c.max_diff, 1e-4) << fixture.name;
  EXPECT_EQ(c.token_mismatches, 0) << fixture.name;
}

TEST_P(ForwardVsTransformers, F16KvWithinBound) {
  const Fixture fixture = Fixture::load(GetParam());
  const Comparison c = compare_fixture(fixture, DType::kF16, 16);
  fmt::print("{}: f16 KV, {} rows, max |dlogprob| {:.3g}, greedy mismatches {}\n", fixture.name,
             c.rows, c.max_diff, c.token_mismatches);
  EXPECT_LE(c.max_diff, 1e-2) << fixture.name;
  EXPECT_EQ(c.top5_misses, 0) << fixture.name;
}

TEST_P(ForwardVsTransformers, Bf16KvWithinBound) {
  const Fixture fixture = Fixture::load(GetParam());
  const Comparison c = compare_fixture(fixture, DType::kBF16, 16);
  fmt::print(
      "{}: bf16 KV, {} rows, max |dlogprob| {:.3g}, median row {:.3g}, {:.1f}% of rows "
      "within 5e-2, greedy mismatches {} ({} outside our top 5)\n",
      fixture.name, c.rows, c.max_diff, c.median(), 100 * c.fraction_within(5e-2),
      c.token_mismatches, c.top5_misses);
  if (c.moe) {
    EXPECT_LE(c.median(), 2e-2) << fixture.name;
    EXPECT_GE(c.fraction_within(5e-2), 0.85) << fixture.name;
    // A flipped row may lose transformers' token from our top 5; every other row keeps it.
    EXPECT_EQ(c.top5_misses_within_bound, 0) << fixture.name;
  } else {
    EXPECT_LE(c.max_diff, 5e-2) << fixture.name;
    EXPECT_EQ(c.top5_misses, 0) << fixture.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardVsTransformers,
                         ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedattn::model
