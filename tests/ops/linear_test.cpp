// Linear (y = x · Wᵀ + b over stacked bf16/f16/f32 weights, both weight modes) and gemm_f32
// against naive float64 loops over the same stored values; every element checked. Also the GEMM
// timing behind the BLAS choice (DISABLED_: run with --gtest_also_run_disabled_tests).
#include "pagedattn/linear.h"

#ifdef PAGEDATTN_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "common/test_util.h"
#include "ops/blas.h"
#include "pagedattn/error.h"

namespace pagedattn::ops {
namespace {

using testing::compare;
using testing::to_doubles;

struct LinearCase {
  DType dtype;
  WeightMode mode;
  int64_t m;
  bool bias;
  // 272: a multiple of 16, not of 32 (decode over bf16 / f32 takes the fused score loop); 288: a
  // multiple of 32 (bf16 decode takes the pair-layout GEMV); 264: neither (converted tiles).
  int64_t k = 272;
};

std::string case_name(const ::testing::TestParamInfo<LinearCase>& info) {
  const LinearCase& c = info.param;
  const char* mode = c.mode == WeightMode::kCachedF32      ? "cached"
                     : c.mode == WeightMode::kConvertTiles ? "tiles"
                                                           : "auto";
  return fmt::format("{}_{}_m{}_k{}{}", dtype_name(c.dtype), mode, c.m, c.k, c.bias ? "_bias" : "");
}

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, MatchesFloat64) {
  const LinearCase c = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  // Three stacked parts (like q, k, v), the second with a padded row stride (a slice of a larger
  // tensor), K large enough for several tiles at decode.
  const int64_t k = c.k;
  const std::vector<int64_t> outs = {200, 48, 1100};
  std::vector<HostTensor> storage, biases;
  std::vector<LinearPart> parts;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t stride = i == 1 ? k + 16 : k;
    storage.emplace_back(c.dtype, std::initializer_list<int64_t>{outs[i], stride});
    testing::fill_uniform(storage.back().view(), rng);
    TensorView w = storage.back().view();
    w.shape[1] = k;
    LinearPart part{w, {}};
    if (c.bias && i != 1) {
      biases.emplace_back(c.dtype, std::initializer_list<int64_t>{outs[i]});
      testing::fill_uniform(biases.back().view(), rng);
      part.bias = biases.back().view();
    }
    parts.push_back(part);
  }
  const Linear linear("test.qkv", parts, c.mode);
  const int64_t n = linear.out_features();
  ASSERT_EQ(n, 1348);
  HostTensor x(DType::kF32, {c.m, k + 8});  // padded rows: a strided input
  testing::fill_uniform(x.view(), rng);
  TensorView xv = x.view();
  xv.shape[1] = k;
  HostTensor y(DType::kF32, {c.m, n});
  testing::poison(y.view());
  linear.forward(xv, y.view());

  const std::vector<double> xd = to_doubles(x.view());
  std::vector<double> expected(static_cast<size_t>(c.m * n));
  int64_t col = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::vector<double> wd = to_doubles(storage[i].view());
    const int64_t stride = storage[i].view().shape[1];
    std::vector<double> bd = parts[i].bias.defined() ? to_doubles(biases[i == 0 ? 0 : 1].view())
                                                     : std::vector<double>(outs[i], 0.0);
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t o = 0; o < outs[i]; ++o) {
        double acc = bd[o];
        for (int64_t j = 0; j < k; ++j) acc += xd[r * (k + 8) + j] * wd[o * stride + j];
        expected[r * n + col + o] = acc;
      }
    }
    col += outs[i];
  }
  // f32 accumulation of K = 272 products of magnitude <= 1: |error| <~ K · 2^-24 · sqrt(K) ~ 3e-4
  // in the worst case, ~1e-5 typically.
  const std::string diff = compare(to_doubles(y.view()), expected, {3e-4, 1e-5}, "y");
  EXPECT_TRUE(diff.empty()) << diff;
  if (c.mode == WeightMode::kCachedF32 && c.dtype != DType::kF32) {
    EXPECT_GE(linear.owned_bytes(), n * k * 4);
  }
  // kAuto keeps bf16 / f32 weights as stored when in_features is a multiple of 16 (the fused
  // decode loop reads them), else caches the f32 copy.
  if (c.mode == WeightMode::kAuto) {
    const bool in_place = (c.dtype == DType::kF32 || c.dtype == DType::kBF16) && k % 16 == 0;
    EXPECT_EQ(linear.mode(), in_place ? WeightMode::kConvertTiles : WeightMode::kCachedF32);
    EXPECT_EQ(linear.owned_bytes() >= n * k * 4, !in_place && c.dtype != DType::kF32);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, LinearTest,
    ::testing::Values(LinearCase{DType::kBF16, WeightMode::kConvertTiles, 1, false},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 5, true},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 70, true},
                      LinearCase{DType::kBF16, WeightMode::kCachedF32, 1, true},
                      LinearCase{DType::kBF16, WeightMode::kCachedF32, 33, false},
                      LinearCase{DType::kF16, WeightMode::kConvertTiles, 3, true},
                      LinearCase{DType::kF16, WeightMode::kCachedF32, 17, false},
                      LinearCase{DType::kF32, WeightMode::kConvertTiles, 1, true},
                      LinearCase{DType::kF32, WeightMode::kCachedF32, 40, true},
                      // bf16 with K % 32 == 0: the pair-layout GEMV, every row count it
                      // instantiates (1..8) and two groups of rows (9, 16).
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 1, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 2, true, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 3, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 4, true, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 5, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 6, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 7, true, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 8, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 11, true, 288},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 16, false, 288},
                      LinearCase{DType::kBF16, WeightMode::kAuto, 1, true, 288},
                      // K % 32 == 16: the fused score loop; one and two groups of 8 rows.
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 8, false},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 9, true},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 16, true},
                      LinearCase{DType::kF32, WeightMode::kConvertTiles, 12, false},
                      // K not a multiple of 16: the converted tiles' sgemv / sgemm instead.
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 1, true, 264},
                      LinearCase{DType::kBF16, WeightMode::kConvertTiles, 7, false, 264},
                      // kAuto's choice per dtype and K.
                      LinearCase{DType::kBF16, WeightMode::kAuto, 1, true},
                      LinearCase{DType::kBF16, WeightMode::kAuto, 3, false, 264},
                      LinearCase{DType::kF16, WeightMode::kAuto, 2, true},
                      LinearCase{DType::kF32, WeightMode::kAuto, 4, false}),
    case_name);

TEST(LinearErrors, NamesTheProblem) {
  HostTensor a(DType::kBF16, {8, 16}), b(DType::kBF16, {8, 32}), bad(DType::kI32, {8, 16});
  const std::vector<LinearPart> mismatch = {{a.view(), {}}, {b.view(), {}}};
  try {
    Linear("layer.qkv", mismatch);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.qkv: weight 1 has 32 input features"),
              std::string::npos)
        << e.what();
  }
  const std::vector<LinearPart> int_weight = {{bad.view(), {}}};
  EXPECT_THROW(Linear("layer.bad", int_weight), Error);
  const std::vector<LinearPart> ok = {{a.view(), {}}};
  const Linear linear("layer.ok", ok);
  HostTensor x(DType::kF32, {2, 15}), y(DType::kF32, {2, 8});
  EXPECT_THROW(linear.forward(x.view(), y.view()), Error);
}

TEST(Gemm, TransposedAndPlainMatchFloat64) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t m = 9, n = 23, k = 31;
  HostTensor a(DType::kF32, {m, k}), b(DType::kF32, {k, n}), bt(DType::kF32, {n, k});
  testing::fill_uniform(a.view(), rng);
  testing::fill_uniform(b.view(), rng);
  testing::fill_uniform(bt.view(), rng);
  HostTensor c1(DType::kF32, {m, n}), c2(DType::kF32, {m, n});
  gemm_f32(false, m, n, k, 0.5f, a.data<float>(), k, b.data<float>(), n, 0.0f, c1.data<float>(), n);
  gemm_f32(true, m, n, k, 1.0f, a.data<float>(), k, bt.data<float>(), k, 0.0f, c2.data<float>(), n);
  std::vector<double> e1(m * n), e2(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s1 = 0, s2 = 0;
      for (int64_t l = 0; l < k; ++l) {
        s1 += double{a.data<float>()[i * k + l]} * b.data<float>()[l * n + j];
        s2 += double{a.data<float>()[i * k + l]} * bt.data<float>()[j * k + l];
      }
      e1[i * n + j] = 0.5 * s1;
      e2[i * n + j] = s2;
    }
  }
  EXPECT_EQ(compare(to_doubles(c1.view()), e1, {1e-5, 1e-5}, "plain"), "");
  EXPECT_EQ(compare(to_doubles(c2.view()), e2, {1e-5, 1e-5}, "transposed"), "");
}

// The built-in GEMM (what serves ops where OpenBLAS is missing: the GPU machine) against float64,
// every element: both layouts, ragged blocks (sizes not multiples of its 4 x 4 x 256 blocking),
// leading dimensions wider than the rows, alpha and beta including beta 0 over a NaN-filled C.
TEST(Gemm, BuiltInMatchesFloat64) {
  std::mt19937_64 rng(testing::fresh_seed());
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape shape : {Shape{1, 1, 1}, Shape{1, 37, 300}, Shape{5, 7, 513}, Shape{17, 9, 3},
                            Shape{64, 33, 257}}) {
    for (const bool transpose_b : {false, true}) {
      for (const auto& [alpha, beta] :
           {std::pair{1.0f, 0.0f}, std::pair{-0.5f, 1.0f}, std::pair{2.0f, 0.25f}}) {
        const int64_t m = shape.m, n = shape.n, k = shape.k;
        const int64_t lda = k + 3, ldb = (transpose_b ? k : n) + 5, ldc = n + 2;
        const int64_t b_rows = transpose_b ? n : k;
        HostTensor a(DType::kF32, {m, lda}), b(DType::kF32, {b_rows, ldb}),
            c(DType::kF32, {m, ldc});
        testing::fill_uniform(a.view(), rng);
        testing::fill_uniform(b.view(), rng);
        testing::fill_uniform(c.view(), rng);
        if (beta == 0.0f) {
          for (int64_t i = 0; i < m * ldc; ++i) c.data<float>()[i] = std::nanf("");
        }
        // Each element's float64 value and the f32 rounding bound of any order of summation:
        // (k + 2) u (|alpha| sum_l |a_il b_lj| + |beta c_ij|), u = 2^-24 (a fixed tolerance
        // failed about one run in five where the terms of a k = 257 sum cancel).
        std::vector<double> expected(m * ldc), bound(m * ldc, 0.0);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const double old = c.data<float>()[i * ldc + j];
            if (j >= n) {  // outside the product: must be left alone
              expected[i * ldc + j] = old;
              continue;
            }
            double sum = 0, magnitude = 0;
            for (int64_t l = 0; l < k; ++l) {
              const double bv = transpose_b ? b.data<float>()[j * ldb + l]
                                            : b.data<float>()[l * ldb + j];
              sum += double{a.data<float>()[i * lda + l]} * bv;
              magnitude += std::abs(double{a.data<float>()[i * lda + l]} * bv);
            }
            const double kept = beta == 0.0f ? 0.0 : beta * old;
            expected[i * ldc + j] = alpha * sum + kept;
            bound[i * ldc + j] = static_cast<double>(k + 2) * 0x1p-24 *
                                 (std::abs(double{alpha}) * magnitude + std::abs(kept));
          }
        }
        blas::builtin_sgemm(transpose_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(),
                            ldb, beta, c.data<float>(), ldc);
        std::vector<double> got = to_doubles(c.view());
        // Columns past N keep whatever C held (NaN under beta 0): compare them as equal values.
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = n; j < ldc; ++j) {
            if (std::isnan(got[i * ldc + j]) && std::isnan(expected[i * ldc + j])) {
              got[i * ldc + j] = expected[i * ldc + j] = 0.0;
            }
          }
        }
        // Within its bound an element counts as equal; compare() reports the rest exactly.
        for (size_t e = 0; e < got.size(); ++e) {
          if (std::abs(got[e] - expected[e]) <= bound[e]) got[e] = expected[e];
        }
        EXPECT_EQ(compare(got, expected, {0.0, 0.0},
                          fmt::format("m {} n {} k {} transpose_b {} alpha {} beta {}", m, n, k,
                                      transpose_b, alpha, beta)),
                  "");
      }
    }
  }
}

#ifdef PAGEDATTN_HAVE_OPENBLAS
// The measurement behind the GEMM choice (bench/RESULTS.md): the median of `reps` calls (a
// shared machine's other load lands in a few of them), after one warm-up call.
double time_us(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    samples.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::nth_element(samples.begin(), samples.begin() + reps / 2, samples.end());
  return samples[static_cast<size_t>(reps / 2)];
}

// Timing, not a test: the two weight modes (and one OpenBLAS-threaded sgemm on f32) on Qwen3-0.6B's
// gate / up shape, cycling over 24 distinct weights (144 MiB of bf16, 288 MiB of f32: well past
// the L3, so that each call streams its weight from memory as a model step does).
TEST(GemmTiming, DISABLED_WeightModes) {
  init_threads();
  std::mt19937_64 rng(1);
  const int64_t n = 3072, k = 1024;
  constexpr int kLayers = 24;
  std::vector<HostTensor> wb, wf;
  std::vector<Linear> tiles, cached;
  for (int l = 0; l < kLayers; ++l) {
    wb.emplace_back(DType::kBF16, std::initializer_list<int64_t>{n, k});
    wf.emplace_back(DType::kF32, std::initializer_list<int64_t>{n, k});
    testing::fill_uniform(wb.back().view(), rng);
    for (int64_t i = 0; i < n * k; ++i) {
      wf.back().data<float>()[i] = bf16_to_float(wb.back().data<uint16_t>()[i]);
    }
  }
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<LinearPart> part = {{wb[l].view(), {}}};
    tiles.emplace_back("tiles", part, WeightMode::kConvertTiles);
    cached.emplace_back("cached", part, WeightMode::kCachedF32);
  }
  fmt::print(
      "{}; {} OpenMP threads; {} weights of {} x {}: cached f32 copies {} MiB (bf16 {} MiB)\n",
      blas_info(), num_threads(), kLayers, n, k, kLayers * cached[0].owned_bytes() >> 20,
      kLayers * wb[0].bytes() >> 20);
  for (int64_t m : {1, 4, 8, 16, 512}) {
    HostTensor x(DType::kF32, {m, k}), y(DType::kF32, {m, n});
    testing::fill_uniform(x.view(), rng);
    const int reps = m == 512 ? kLayers : 10 * kLayers;
    int layer = 0;
    const double t_tiles =
        time_us([&] { tiles[layer++ % kLayers].forward(x.view(), y.view()); }, reps);
    const double t_cached =
        time_us([&] { cached[layer++ % kLayers].forward(x.view(), y.view()); }, reps);
    openblas_set_num_threads(num_threads());
    const double t_blas = time_us(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data<float>(), k,
                      wf[layer++ % kLayers].data<float>(), k, 0.0f, y.data<float>(), n);
        },
        reps);
    openblas_set_num_threads(1);
    const double flops = 2.0 * m * n * k;
    fmt::print(
        "M {:4}: stored bf16 {:9.1f} us ({:6.1f} GFLOP/s, {:5.1f} GB/s of W) | cached f32 {:9.1f} "
        "us ({:6.1f}, {:5.1f} GB/s) | one OpenBLAS-threaded sgemm on f32 {:9.1f} us ({:6.1f})\n",
        m, t_tiles, flops / t_tiles / 1e3, 2.0 * n * k / t_tiles / 1e3, t_cached,
        flops / t_cached / 1e3, 4.0 * n * k / t_cached / 1e3, t_blas, flops / t_blas / 1e3);
  }
}
#endif

}  // namespace
}  // namespace pagedattn::ops
