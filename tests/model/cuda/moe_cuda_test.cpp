// MoE on the device (src/model/cuda/moe.h) against independent references:
// - routing: moe_route_device against ops::moe_route (the CPU model's routing, itself tested
//   against transformers through the DeepSeek fixtures) for the three methods, with and without
//   norm_topk_prob: the same experts in the same order for every token, and weights within 1e-6
//   relative (the device's expf may differ from the host's exp in the last bit; the logits are
//   spread so that no choice is that close to a tie);
// - the counting sort + grouped GEMM: random assignments with empty experts, one expert with more
//   rows than a tile (several tiles), one with all tokens in a second case; the rows gathered by
//   expert through the model's own gather kernel, both grouped GEMMs' outputs compared element by
//   element with a float64 product of the same bf16 / f16 values, within
//   4 * K * 2^-24 * sum |a||w| (f32 accumulation of K terms); and the sort's invariants (every
//   pair has one row, each row's token is the pair's, rows of an expert contiguous, tiles cover
//   each expert's rows once).
// Skips without a GPU; scripts/gpu-check runs it with PAGEDATTN_REQUIRE_GPU=1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_backend.h"
#include "model/cuda/device_array.h"
#include "model/cuda/kernels.h"
#include "model/cuda/moe.h"
#include "pagedattn/moe.h"

namespace pagedattn::model {
namespace {

using ::pagedattn::testing::DeviceArray;

// ---- routing ----

struct RouteCase {
  std::string name;
  ops::MoeRouting method;
  int32_t experts, top_k, groups, topk_groups;
  bool norm;
  bool ties = false;  // logits on a grid of 5 values: most choices tie, the lower expert wins
};
void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class MoeRouteDevice : public ::testing::TestWithParam<RouteCase> {};

TEST_P(MoeRouteDevice, SameExpertsAndWeightsAsTheHostRouting) {
  REQUIRE_GPU();
  const RouteCase& c = GetParam();
  ops::MoeRouterConfig config;
  config.method = c.method;
  config.num_experts = c.experts;
  config.top_k = c.top_k;
  config.num_groups = c.groups;
  config.topk_groups = c.topk_groups;
  config.norm_topk_prob = c.norm;
  config.routed_scaling_factor = 2.5f;
  constexpr int64_t kTokens = 300;
  std::mt19937 rng(41);
  // Logits spread over [-4, 4) in steps of 1/64 plus a distinct offset per expert, so no two
  // experts of a token tie within far more than exp's rounding; with c.ties, 5 levels instead.
  std::vector<float> logits(static_cast<size_t>(kTokens * c.experts));
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(c.experts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int32_t e = 0; e < c.experts; ++e) {
      const float spread =
          8.0f * static_cast<float>(order[static_cast<size_t>(e)]) / static_cast<float>(c.experts);
      logits[static_cast<size_t>(t * c.experts + e)] =
          c.ties ? std::floor(spread * 5.0f / 8.0f) - 2.0f : -4.0f + spread;
    }
  }
  std::vector<float> bias(static_cast<size_t>(c.experts));
  std::uniform_int_distribution<int> step(-32, 32);
  for (float& b : bias) b = static_cast<float>(step(rng)) / 256.0f;
  const bool sigmoid = c.method == ops::MoeRouting::kSigmoidNoAuxTc;

  ops::MoeAssignment expected;
  std::vector<float> host_logits = logits;  // moe_route computes its scores in place
  ops::moe_route(
      TensorView::contiguous(host_logits.data(), DType::kF32, {kTokens, c.experts}), config,
      sigmoid ? TensorView::contiguous(bias.data(), DType::kF32, {c.experts}) : TensorView{},
      expected);

  DeviceArray<float> d_logits(logits), d_bias(bias);
  DeviceArray<int32_t> d_ids(static_cast<size_t>(kTokens * c.top_k));
  DeviceArray<float> d_weights(static_cast<size_t>(kTokens * c.top_k));
  cuda::moe_route_device(d_logits.data, kTokens, config, sigmoid ? d_bias.data : nullptr,
                         d_ids.data, d_weights.data, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> ids = d_ids.host();
  const std::vector<float> weights = d_weights.host();
  int64_t wrong_ids = 0;
  double worst = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    wrong_ids += ids[p] != expected.experts[p];
    const double want = expected.weights[p];
    worst = std::max(worst, std::abs(weights[p] - want) / std::max(std::abs(want), 1e-30));
  }
  EXPECT_EQ(wrong_ids, 0) << c.name << ": expert ids differing from the host routing";
  EXPECT_LE(worst, 1e-6) << c.name << ": worst relative weight difference";
}

INSTANTIATE_TEST_SUITE_P(
    Methods, MoeRouteDevice,
    ::testing::Values(
        RouteCase{"softmax_greedy_v2_lite", ops::MoeRouting::kSoftmaxGreedy, 64, 6, 1, 1, false},
        RouteCase{"softmax_greedy_norm", ops::MoeRouting::kSoftmaxGreedy, 64, 6, 1, 1, true},
        RouteCase{"softmax_group_limited_v2", ops::MoeRouting::kSoftmaxGroupLimited, 160, 6, 8, 3,
                  false},
        RouteCase{"sigmoid_noaux_tc_v3", ops::MoeRouting::kSigmoidNoAuxTc, 256, 8, 8, 4, true},
        RouteCase{"sigmoid_top1", ops::MoeRouting::kSigmoidNoAuxTc, 32, 1, 4, 2, true},
        RouteCase{"softmax_greedy_ties", ops::MoeRouting::kSoftmaxGreedy, 64, 6, 1, 1, true, true},
        RouteCase{"sigmoid_noaux_tc_ties", ops::MoeRouting::kSigmoidNoAuxTc, 256, 8, 8, 4, true,
                  true}),
    [](const auto& info) { return info.param.name; });

// ---- the sort and the grouped GEMM ----

float round_to(DType dtype, float v) {
  return dtype == DType::kBF16 ? __bfloat162float(__float2bfloat16_rn(v))
                               : __half2float(__float2half_rn(v));
}

// A raw 16-bit word of `dtype` as a double.
double bf16_or_half_to_double(DType dtype, uint16_t word) {
  if (dtype == DType::kBF16) {
    __nv_bfloat16 b;
    std::memcpy(&b, &word, 2);
    return __bfloat162float(b);
  }
  __half h;
  std::memcpy(&h, &word, 2);
  return __half2float(h);
}

// Host values in `dtype` as raw 16-bit words.
std::vector<uint16_t> to_words(DType dtype, const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBF16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(values[i]);
      std::memcpy(&out[i], &b, 2);
    } else {
      const __half h = __float2half_rn(values[i]);
      std::memcpy(&out[i], &h, 2);
    }
  }
  return out;
}

// The tile height's rule (moe.h): 128-row tiles from an average of 64 rows an expert. Host code:
// runs without a GPU. (PAGEDATTN_MOE_TILE_ROWS forces one height for the whole process.)
TEST(MoeTileRows, LargeTilesFromSixtyFourRowsAnExpert) {
  if (std::getenv("PAGEDATTN_MOE_TILE_ROWS") != nullptr) GTEST_SKIP() << "a forced tile height";
  EXPECT_EQ(cuda::moe_tile_rows(64 * 6, 64), cuda::kMoeTileRows);         // decode B 64, top 6
  EXPECT_EQ(cuda::moe_tile_rows(64 * 64 - 1, 64), cuda::kMoeTileRows);    // just under 64 an expert
  EXPECT_EQ(cuda::moe_tile_rows(64 * 64, 64), cuda::kMoeLargeTileRows);   // 64 an expert
  EXPECT_EQ(cuda::moe_tile_rows(2048 * 6, 64), cuda::kMoeLargeTileRows);  // prefill 1 x 2048
  EXPECT_EQ(cuda::moe_tile_rows(256 * 8, 256), cuda::kMoeTileRows);       // V3's 256 experts
  EXPECT_EQ(cuda::moe_tile_rows(0, 64), cuda::kMoeTileRows);
  // The table a height needs: one entry per full or partial tile of each expert at most.
  EXPECT_EQ(cuda::moe_max_tiles(300, 4, cuda::kMoeLargeTileRows), 3 + 4);
  EXPECT_EQ(cuda::moe_max_tiles(300, 4, cuda::kMoeTileRows), 10 + 4);
}

struct GemmCase {
  std::string name;
  DType dtype;
  int32_t tokens, top_k, experts;
  int64_t n, k;
  bool all_to_one;  // every token's first choice is expert 3
  int32_t tile_rows = cuda::kMoeTileRows;
  // moe_grouped_gemm_silu: the weights' rows read as blocks of 16 gates then 16 ups, the output
  // act = silu(gate) * up [pairs, n / 2] in the dtype, row stride n / 2 + 2.
  bool silu = false;
};
void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name; }

class MoeGroupedGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(MoeGroupedGemm, SortedRowsTimesEachExpertEqualFloat64) {
  REQUIRE_GPU();
  const GemmCase& c = GetParam();
  const int64_t pairs = int64_t{c.tokens} * c.top_k;
  std::mt19937 rng(53);
  // Assignments: distinct experts per token, drawn from the first 3/4 of the experts (the last
  // quarter stays empty), with expert 5 in most tokens' choices (more rows than one tile).
  std::vector<int32_t> ids(static_cast<size_t>(pairs));
  std::uniform_int_distribution<int32_t> pick(0, c.experts * 3 / 4 - 1);
  for (int32_t t = 0; t < c.tokens; ++t) {
    std::vector<int32_t> chosen;
    if (c.all_to_one) chosen.push_back(3);
    if (t % 4 != 0 && std::find(chosen.begin(), chosen.end(), 5) == chosen.end())
      chosen.push_back(5);
    while (static_cast<int32_t>(chosen.size()) < c.top_k) {
      const int32_t e = pick(rng);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    std::shuffle(chosen.begin() + (c.all_to_one ? 1 : 0), chosen.end(), rng);
    std::copy(chosen.begin(), chosen.end(), ids.begin() + int64_t{t} * c.top_k);
  }
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(int64_t{c.tokens} * c.k));
  for (float& v : x) v = round_to(c.dtype, uniform(rng));
  std::vector<std::vector<float>> w(static_cast<size_t>(c.experts));
  for (auto& matrix : w) {
    matrix.resize(static_cast<size_t>(c.n * c.k));
    for (float& v : matrix) v = round_to(c.dtype, uniform(rng));
  }

  // Device: sort, gather x's rows by expert, the grouped GEMM.
  const int64_t max_tiles = cuda::moe_max_tiles(pairs, c.experts, c.tile_rows);
  DeviceArray<int32_t> d_ids(ids), d_position(static_cast<size_t>(pairs)),
      d_source(static_cast<size_t>(pairs)), d_tiles(static_cast<size_t>(max_tiles * 3));
  cuda::moe_sort_device(d_ids.data, pairs, c.top_k, c.experts, d_position.data, d_source.data,
                        d_tiles.data, max_tiles, nullptr, c.tile_rows);
  DeviceArray<uint16_t> d_x(to_words(c.dtype, x)), d_sorted(static_cast<size_t>(pairs * c.k));
  cuda::gather_rows(d_x.data, d_source.data, d_sorted.data, pairs, c.k * 2, nullptr);
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> d_w;
  std::vector<const void*> pointers;
  for (const auto& matrix : w) {
    d_w.push_back(std::make_unique<DeviceArray<uint16_t>>(to_words(c.dtype, matrix)));
    pointers.push_back(d_w.back()->data);
  }
  DeviceArray<const void*> d_pointers(pointers);
  DeviceArray<float> d_out(c.silu ? 1 : static_cast<size_t>(pairs * c.n));
  ASSERT_EQ(cudaMemset(d_out.data, 0xff, d_out.count * sizeof(float)), cudaSuccess);  // NaN
  const int64_t half = c.n / 2, ld_act = half + 2;
  constexpr uint16_t kUnwritten = 0x7fc1;  // a NaN in both 16-bit types
  DeviceArray<uint16_t> d_act(
      std::vector<uint16_t>(c.silu ? static_cast<size_t>(pairs * ld_act) : size_t{1}, kUnwritten));
  if (c.silu) {
    cuda::moe_grouped_gemm_silu(d_sorted.data, c.k, d_pointers.data, c.dtype, c.n, c.k,
                                d_tiles.data, max_tiles, d_act.data, ld_act, nullptr, c.tile_rows);
  } else {
    cuda::moe_grouped_gemm(d_sorted.data, c.k, d_pointers.data, c.dtype, c.n, c.k, d_tiles.data,
                           max_tiles, d_out.data, c.n, nullptr, c.tile_rows);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> position = d_position.host(), source = d_source.host(),
                             tiles = d_tiles.host();
  const std::vector<float> out = d_out.host();
  const std::vector<uint16_t> act = d_act.host();

  // The sort: a permutation whose rows hold each pair's token, experts in ascending runs.
  std::vector<int32_t> row_expert(static_cast<size_t>(pairs), -1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t row = position[static_cast<size_t>(p)];
    ASSERT_GE(row, 0);
    ASSERT_LT(row, pairs);
    ASSERT_EQ(row_expert[static_cast<size_t>(row)], -1) << "row " << row << " holds two pairs";
    row_expert[static_cast<size_t>(row)] = ids[static_cast<size_t>(p)];
    EXPECT_EQ(source[static_cast<size_t>(row)], p / c.top_k) << "pair " << p;
  }
  EXPECT_TRUE(std::is_sorted(row_expert.begin(), row_expert.end()));
  // The tiles: each expert's rows exactly once, in tiles of at most tile_rows.
  std::vector<int32_t> covered(static_cast<size_t>(pairs), 0);
  int64_t used = 0;
  for (int64_t i = 0; i < max_tiles; ++i) {
    const int32_t e = tiles[static_cast<size_t>(i * 3)];
    if (e < 0) continue;
    ++used;
    const int32_t first = tiles[static_cast<size_t>(i * 3 + 1)],
                  rows = tiles[static_cast<size_t>(i * 3 + 2)];
    ASSERT_GE(rows, 1);
    ASSERT_LE(rows, c.tile_rows);
    for (int32_t r = first; r < first + rows; ++r) {
      ASSERT_EQ(row_expert[static_cast<size_t>(r)], e) << "tile " << i << " row " << r;
      ++covered[static_cast<size_t>(r)];
    }
  }
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), pairs) << "rows covered once";
  std::map<int32_t, int64_t> rows_of;
  for (int32_t e : ids) ++rows_of[e];
  EXPECT_GT(rows_of[5], c.tile_rows) << "the case has an expert over several tiles";
  // A large-tile case has a last tile that fills whole 16-row slices of some warps and none of
  // others (rows past the tile skip their products): some expert's row count mod 128 in (0, 64).
  if (c.tile_rows == cuda::kMoeLargeTileRows) {
    EXPECT_TRUE(std::any_of(rows_of.begin(), rows_of.end(), [&](const auto& entry) {
      const int64_t rest = entry.second % c.tile_rows;
      return rest > 0 && rest < c.tile_rows / 2;
    })) << "no expert ends in a tile less than half full";
  }

  // Every element against float64. A dot product in f32 is within 4 k 2^-24 of the sum of the
  // terms' magnitudes.
  const auto dot = [&](int64_t token, int32_t e, int64_t j, double& magnitude) {
    double sum = 0;
    magnitude = 0;
    for (int64_t q = 0; q < c.k; ++q) {
      const double term = double{x[static_cast<size_t>(token * c.k + q)]} *
                          w[static_cast<size_t>(e)][static_cast<size_t>(j * c.k + q)];
      sum += term;
      magnitude += std::abs(term);
    }
    return sum;
  };
  const double dot_error = 4.0 * static_cast<double>(c.k) * std::ldexp(1.0, -24);
  const double ulp = c.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  int64_t bad = 0, stray = 0;
  double worst = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[static_cast<size_t>(p)];
    const int64_t token = p / c.top_k, row = position[static_cast<size_t>(p)];
    for (int64_t j = 0; j < (c.silu ? half : c.n); ++j) {
      double sum = 0, got = 0, bound = 0;
      if (c.silu) {
        // act column j = 16 b + i: gate row 32 b + i, up row 32 b + 16 + i. silu's slope is
        // within 1.1 in magnitude; then one rounding to the dtype (and expf's few ulp).
        const int64_t gate_row = j / 16 * 32 + j % 16;
        double gate_magnitude = 0, up_magnitude = 0;
        const double gate = dot(token, e, gate_row, gate_magnitude);
        const double up = dot(token, e, gate_row + 16, up_magnitude);
        const double silu = gate / (1.0 + std::exp(-gate));
        sum = silu * up;
        got = bf16_or_half_to_double(c.dtype, act[static_cast<size_t>(row * ld_act + j)]);
        bound = 1.1 * std::abs(up) * dot_error * gate_magnitude +
                (std::abs(silu) + dot_error * gate_magnitude) * dot_error * up_magnitude +
                (ulp + 1e-6) * std::abs(sum) + 1e-30;
      } else {
        double magnitude = 0;
        sum = dot(token, e, j, magnitude);
        got = out[static_cast<size_t>(row * c.n + j)];
        bound = dot_error * magnitude;
      }
      const double error = std::abs(got - sum);
      worst = std::max(worst, error / std::max(bound, 1e-300));
      if (!(error <= bound)) {
        if (++bad <= 5) {
          ADD_FAILURE() << c.name << ": pair " << p << " (token " << token << ", expert " << e
                        << ") column " << j << ": " << got << " vs " << sum << " (bound " << bound
                        << ")";
        }
      }
    }
  }
  if (c.silu) {  // the two columns past each act row's n / 2 are never written
    for (int64_t r = 0; r < pairs; ++r) {
      for (int64_t j = half; j < ld_act; ++j)
        stray += act[static_cast<size_t>(r * ld_act + j)] != kUnwritten;
    }
  }
  EXPECT_EQ(stray, 0) << c.name << ": act columns past n / 2 written";
  EXPECT_EQ(bad, 0) << c.name << ": elements outside the bound; worst error / bound " << worst;
  fmt::print("{}: {} pairs, {} tiles used, worst error / bound {:.3f}\n", c.name, pairs, used,
             worst);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeGroupedGemm,
    ::testing::Values(
        // DeepSeek-V2-Lite's gate_up (N 2 x 1408, K 2048) at a decode batch of 64, bf16.
        GemmCase{"gate_up_b64_bf16", DType::kBF16, 64, 6, 64, 2816, 2048, false},
        // Its down projection (N 2048, K 1408), f16, a ragged N and K tail.
        GemmCase{"down_b64_f16", DType::kF16, 64, 6, 64, 2048, 1408, false},
        GemmCase{"ragged_n_k_bf16", DType::kBF16, 60, 4, 16, 200, 264, false},
        // Every token's first choice the same expert: one expert over many tiles.
        GemmCase{"all_to_one_bf16", DType::kBF16, 200, 2, 8, 136, 128, true},
        // 128-row tiles (prefill): 256 tokens at K 2048 (~28 rows an expert, expert 5's 192 over
        // two tiles), bf16; a ragged N and K in f16 (expert 5's 150 rows: a tile and 22 rows);
        // every token's first choice one expert (700 rows: 5 tiles and 60 rows).
        GemmCase{"t256_k2048_tile128_bf16", DType::kBF16, 256, 6, 64, 768, 2048, false,
                 cuda::kMoeLargeTileRows},
        GemmCase{"ragged_n_k_tile128_f16", DType::kF16, 200, 4, 16, 200, 264, false,
                 cuda::kMoeLargeTileRows},
        GemmCase{"all_to_one_tile128_bf16", DType::kBF16, 700, 2, 8, 136, 128, true,
                 cuda::kMoeLargeTileRows},
        // The SiLU epilogue (moe_grouped_gemm_silu): DeepSeek-V2-Lite's gate_up at decode (32-row
        // tiles, bf16) and at prefill (128-row tiles, f16); n 160 (a last 128-column tile with one
        // pair block and a column past n) with a ragged K, one expert over many tiles.
        GemmCase{"silu_gate_up_b64_bf16", DType::kBF16, 64, 6, 64, 2816, 2048, false,
                 cuda::kMoeTileRows, true},
        GemmCase{"silu_gate_up_t256_tile128_f16", DType::kF16, 256, 6, 64, 2816, 2048, false,
                 cuda::kMoeLargeTileRows, true},
        GemmCase{"silu_n160_all_to_one_tile128_bf16", DType::kBF16, 700, 2, 8, 160, 264, true,
                 cuda::kMoeLargeTileRows, true},
        GemmCase{"silu_n160_all_to_one_bf16", DType::kBF16, 200, 2, 8, 160, 264, true,
                 cuda::kMoeTileRows, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pagedattn::model
