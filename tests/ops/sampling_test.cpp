// ops::RowSampler (the CPU reference of row sampling) against the float64 reference written from
// the definition (tests/common/sampling_reference.h), on random rows of every kind (continuous,
// many ties, -inf and NaN entries, one dominant logit) and every filter combination with the edge
// values: the kept set and its draw order equal the reference's (unless top_p * total lies within
// 1e-9 of a prefix boundary: counted, must be rare), the drawn token equals the reference's
// inverse CDF for the generator's number and for 20 other numbers per row unless the number lies
// within 1e-6 of a boundary (counted, rare), the logprob is the raw log-softmax (1e-5), and the
// margin RowSampler reports is the reference's. Plus the greedy rule (ties, NaN),
// the generator's definition, and parameter errors.
#include "pagedattn/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "common/sampling_reference.h"
#include "common/test_util.h"
#include "pagedattn/error.h"

namespace pagedattn::ops {
namespace {

using testing::to_row_sampling;

TEST(RowSampling, MatchesFloat64Reference) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  RowSampler sampler;
  int rows = 0, near_top_p = 0, near_draw = 0, draws = 0, sorted_rows = 0, id_rows = 0;
  std::vector<float> work;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t vocab = trial % 10 == 0 ? 1 + static_cast<int64_t>(rng() % 8)
                                          : 1 + static_cast<int64_t>(rng() % 3000);
    const int kind = static_cast<int>(rng() % 4);
    const std::vector<float> logits = testing::random_sampling_row(rng, vocab, kind);
    const testing::SamplingSpec spec = testing::random_sampling_spec(rng, vocab);
    const RowSampling row = to_row_sampling(spec);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " vocab " << vocab << " kind " << kind
                                      << " T " << spec.temperature << " k " << spec.top_k << " p "
                                      << spec.top_p << " min_p " << spec.min_p);
    bool any_finite = false;
    for (const float x : logits) any_finite |= std::isfinite(x);
    if (!any_finite) continue;
    const testing::SamplingReference ref = testing::sampling_reference(logits, spec);
    ++rows;
    const RowDraw got = sampler.sample(logits, row);
    const bool has_nan = kind == 2;
    if (!has_nan) {
      EXPECT_NEAR(got.logprob, ref.logprob, 1e-5 * (1 + std::abs(ref.logprob)));
    }
    if (ref.greedy) {
      EXPECT_EQ(got.token, ref.token);
      continue;
    }
    if (ref.top_p_margin < 1e-9) {
      ++near_top_p;
      continue;
    }
    // The kept set in draw order.
    work.assign(logits.begin(), logits.end());
    const RowFilter filter = row_filter(row);
    sampler.filter(work, filter);
    const std::span<const int32_t> kept = sampler.candidates();
    ASSERT_EQ(std::vector<int32_t>(kept.begin(), kept.end()), ref.kept);
    for (size_t t = 0; t < logits.size(); ++t) {
      const bool is_kept =
          std::find(ref.kept.begin(), ref.kept.end(), int32_t(t)) != ref.kept.end();
      ASSERT_EQ(work[t] > -std::numeric_limits<float>::infinity(), is_kept) << "token " << t;
    }
    (filter.sorted_draw ? sorted_rows : id_rows) += 1;
    EXPECT_EQ(filter.uniform, ref.uniform);
    // The generator's number, then others.
    for (int i = 0; i <= 20; ++i) {
      const double u = i == 0 ? ref.uniform : std::uniform_real_distribution<double>(0, 1)(rng);
      double margin = 0;
      const int32_t want = ref.draw(u, &margin);
      ++draws;
      if (margin < 1e-6) {
        ++near_draw;
        continue;
      }
      ASSERT_EQ(sampler.draw(work, u), want) << "u " << u;
      const double expected = std::min(margin, ref.top_p_margin);
      EXPECT_NEAR(sampler.margin(), expected, 1e-12 + 1e-6 * expected);
    }
    if (ref.draw_margin >= 1e-6) {
      EXPECT_EQ(got.token, ref.token);
      EXPECT_GT(got.margin, 0.0);
    }
  }
  std::printf(
      "%d rows (%d value-order, %d id-order draws): %d top-p cuts within 1e-9, %d of %d "
      "draws within 1e-6 of a boundary\n",
      rows, sorted_rows, id_rows, near_top_p, near_draw, draws);
  EXPECT_GT(rows, 2500);
  EXPECT_GT(sorted_rows, 300);
  EXPECT_GT(id_rows, 300);
  EXPECT_LT(near_top_p, rows / 50) << "top_p boundaries hit too often: the test is not decisive";
  EXPECT_LT(near_draw, draws / 100);
}

TEST(RowSampling, GreedyRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(greedy_token(std::vector<float>{1, 3, 3, -2}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{nan, 2, nan, 2}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{nan, nan, nan}), 2);
  EXPECT_EQ(greedy_token(std::vector<float>{-inf, -inf}), 0);
  EXPECT_EQ(greedy_token(std::vector<float>{-0.0f, 0.0f}), 0);
  RowSampler sampler;
  RowSampling row;
  row.temperature = 0.0;
  const std::vector<float> logits = {0.5f, 4.0f, 4.0f};
  const RowDraw draw = sampler.sample(logits, row);
  EXPECT_EQ(draw.token, 1);
  const double lse = std::log(std::exp(0.5) + 2 * std::exp(4.0));
  EXPECT_NEAR(draw.logprob, 4.0 - lse, 1e-6);
}

TEST(RowSampling, EdgeFilters) {
  RowSampler sampler;
  const std::vector<float> logits = {1.0f, 5.0f, 5.0f, 2.0f, 5.0f, -1.0f};
  RowSampling row;
  row.seed = 3;
  // top_k 1 keeps the three tied maxima; top_p tiny keeps the lowest id of them; min_p 1 keeps
  // exactly the maxima.
  for (uint64_t position = 0; position < 64; ++position) {
    row.position = position;
    row.top_k = 1;
    const int32_t k1 = sampler.sample(logits, row).token;
    EXPECT_TRUE(k1 == 1 || k1 == 2 || k1 == 4);
    row.top_k = -1;
    row.top_p = 1e-12;
    EXPECT_EQ(sampler.sample(logits, row).token, 1);
    row.top_p = 1.0;
    row.min_p = 1.0;
    const int32_t m1 = sampler.sample(logits, row).token;
    EXPECT_TRUE(m1 == 1 || m1 == 2 || m1 == 4);
    row.min_p = 0.0;
  }
  std::vector<float> work = logits;
  RowSampling all;
  all.top_k = static_cast<int32_t>(logits.size());
  sampler.filter(work, row_filter(all));
  EXPECT_EQ(sampler.candidates().size(), logits.size());
}

TEST(RowSampling, GeneratorAndErrors) {
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(sampling_uniform(i * 7, i % 3, i), testing::reference_uniform(i * 7, i % 3, i));
  }
  RowSampler sampler;
  const std::vector<float> dead = {-std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN()};
  RowSampling row;
  EXPECT_THROW(sampler.sample(dead, row), Error);
  row.top_p = 0.0;
  EXPECT_THROW(sampler.sample(std::vector<float>{1.0f}, row), Error);
  row.top_p = 1.0;
  row.min_p = 1.5;
  EXPECT_THROW(sampler.sample(std::vector<float>{1.0f}, row), Error);
  row.min_p = 0.0;
  row.temperature = -1.0;
  EXPECT_THROW(sampler.sample(std::vector<float>{1.0f}, row), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{}, RowSampling{}), Error);
}

}  // namespace
}  // namespace pagedattn::ops
