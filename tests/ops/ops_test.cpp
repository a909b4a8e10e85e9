// RMSNorm (plain, per head, fused with the residual add), SiLU·mul, embedding, softmax /
// log-softmax and RoPE (NeoX and interleaved) against naive float64 loops written here; every
// element checked.
#include "pagedattn/ops.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/test_util.h"
#include "pagedattn/error.h"

namespace pagedattn::ops {
namespace {

using testing::compare;
using testing::to_doubles;

constexpr testing::Tolerance kF32{1e-5, 1e-5};

std::mt19937_64 seeded_rng() {
  const uint64_t seed = testing::fresh_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937_64(seed);
}

std::vector<double> rms_norm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                       int64_t rows, int64_t dim, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(sum / dim + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = w[i] * x[r * dim + i] * inv;
  }
  return out;
}

TEST(RmsNorm, RowsAndHeadsMatchFloat64) {
  auto rng = seeded_rng();
  for (DType wdtype : {DType::kF32, DType::kBF16}) {
    const int64_t tokens = 7, heads = 3, dim = 48;
    HostTensor x(DType::kF32, {tokens, heads, dim}), w(wdtype, {dim}),
        out(DType::kF32, {tokens, heads, dim});
    testing::fill_uniform(x.view(), rng, -2.0f, 2.0f);
    testing::fill_uniform(w.view(), rng, 0.5f, 1.5f);
    testing::poison(out.view());
    rms_norm(x.view(), w.view(), 1e-6f, out.view());
    const auto expected =
        rms_norm_reference(to_doubles(x.view()), to_doubles(w.view()), tokens * heads, dim, 1e-6);
    EXPECT_EQ(compare(to_doubles(out.view()), expected, kF32, "per-head norm"), "");
    // In place, as [rows, dim].
    TensorView flat = TensorView::contiguous(x.data<float>(), DType::kF32, {tokens * heads, dim});
    rms_norm(flat, w.view(), 1e-6f, flat);
    EXPECT_EQ(compare(to_doubles(flat), expected, kF32, "in place"), "");
  }
}

TEST(RmsNorm, FusedResidualAdd) {
  auto rng = seeded_rng();
  const int64_t tokens = 5, dim = 64;
  HostTensor residual(DType::kF32, {tokens, dim}), x(DType::kF32, {tokens, dim}),
      w(DType::kF16, {dim}), out(DType::kF32, {tokens, dim});
  testing::fill_uniform(residual.view(), rng);
  testing::fill_uniform(x.view(), rng);
  testing::fill_uniform(w.view(), rng);
  std::vector<double> sum = to_doubles(residual.view());
  const std::vector<double> xd = to_doubles(x.view());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += xd[i];
  add_rms_norm(residual.view(), x.view(), w.view(), 1e-5f, out.view());
  EXPECT_EQ(compare(to_doubles(residual.view()), sum, kF32, "residual"), "");
  EXPECT_EQ(compare(to_doubles(out.view()),
                    rms_norm_reference(sum, to_doubles(w.view()), tokens, dim, 1e-5), kF32, "out"),
            "");
  // Without x: norm of the residual alone.
  add_rms_norm(residual.view(), {}, w.view(), 1e-5f, out.view());
  EXPECT_EQ(compare(to_doubles(out.view()),
                    rms_norm_reference(sum, to_doubles(w.view()), tokens, dim, 1e-5), kF32, "no x"),
            "");
}

TEST(Elementwise, SiluMulAndAdd) {
  auto rng = seeded_rng();
  const int64_t rows = 6, inter = 40;
  HostTensor gate_up(DType::kF32, {rows, 2 * inter}), out(DType::kF32, {rows, inter});
  testing::fill_uniform(gate_up.view(), rng, -4.0f, 4.0f);
  testing::poison(out.view());
  silu_mul(gate_up.view(), out.view());
  const auto g = to_doubles(gate_up.view());
  std::vector<double> expected(rows * inter);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const double a = g[r * 2 * inter + i], b = g[r * 2 * inter + inter + i];
      expected[r * inter + i] = a / (1.0 + std::exp(-a)) * b;
    }
  }
  EXPECT_EQ(compare(to_doubles(out.view()), expected, kF32, "silu_mul"), "");
  HostTensor y(DType::kF32, {rows, inter});
  testing::fill_uniform(y.view(), rng);
  std::vector<double> sum = to_doubles(y.view());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += expected[i];
  add_inplace(y.view(), out.view());
  EXPECT_EQ(compare(to_doubles(y.view()), sum, kF32, "add"), "");
  HostTensor wrong(DType::kF32, {rows, inter + 1});
  EXPECT_THROW(silu_mul(gate_up.view(), wrong.view()), Error);
}

TEST(Embedding, GathersRowsAndRejectsBadIds) {
  auto rng = seeded_rng();
  HostTensor table(DType::kBF16, {50, 24}), out(DType::kF32, {4, 24});
  testing::fill_uniform(table.view(), rng);
  const std::vector<int32_t> ids = {3, 49, 0, 3};
  embedding(table.view(), ids, out.view());
  const auto t = to_doubles(table.view());
  std::vector<double> expected;
  for (int32_t id : ids)
    expected.insert(expected.end(), t.begin() + id * 24, t.begin() + id * 24 + 24);
  EXPECT_EQ(compare(to_doubles(out.view()), expected, {0, 0}, "embedding"), "");
  const std::vector<int32_t> bad = {1, 2, 50, 3};
  try {
    embedding(table.view(), bad, out.view());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 50 at index 2"), std::string::npos) << e.what();
  }
}

TEST(Softmax, RowsMatchFloat64) {
  auto rng = seeded_rng();
  const int64_t rows = 3, vocab = 1000;
  HostTensor a(DType::kF32, {rows, vocab}), b(DType::kF32, {rows, vocab});
  testing::fill_uniform(a.view(), rng, -20.0f, 20.0f);
  std::memcpy(b.data<float>(), a.data<float>(), a.bytes());
  const auto x = to_doubles(a.view());
  std::vector<double> soft(x.size()), logsoft(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; ++i) max = std::max(max, x[r * vocab + i]);
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(x[r * vocab + i] - max);
    for (int64_t i = 0; i < vocab; ++i) {
      logsoft[r * vocab + i] = x[r * vocab + i] - max - std::log(sum);
      soft[r * vocab + i] = std::exp(logsoft[r * vocab + i]);
    }
  }
  softmax_rows(a.view());
  log_softmax_rows(b.view());
  EXPECT_EQ(compare(to_doubles(a.view()), soft, {1e-7, 1e-5}, "softmax"), "");
  EXPECT_EQ(compare(to_doubles(b.view()), logsoft, {2e-5, 1e-6}, "log_softmax"), "");
}

class RopeTest : public ::testing::TestWithParam<RopeStyle> {};

TEST_P(RopeTest, RotatesPairsAtPositions) {
  auto rng = seeded_rng();
  const RopeStyle style = GetParam();
  const int64_t tokens = 5, heads = 3, dim = 32, rotary = 32, half = rotary / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / rotary) * 0.5;
  const double factor = 1.25;
  const RopeTable table(inv_freq, factor, 4096);
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 1000};
  // A strided view: q inside a wider qkv row.
  HostTensor qkv(DType::kF32, {tokens, heads + 2, dim});
  testing::fill_uniform(qkv.view(), rng);
  TensorView q = qkv.view();
  q.shape[1] = heads;
  const auto before = to_doubles(qkv.view());
  apply_rope(q, positions, table, style);
  const auto after = to_doubles(qkv.view());
  std::vector<double> expected = before;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * (heads + 2) + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = positions[t] * inv_freq[i];
        const double c = std::cos(angle) * factor, s = std::sin(angle) * factor;
        const int64_t ia = style == RopeStyle::kNeox ? i : 2 * i;
        const int64_t ib = style == RopeStyle::kNeox ? i + half : 2 * i + 1;
        const double a = before[base + ia], b = before[base + ib];
        expected[base + ia] = a * c - b * s;
        expected[base + ib] = b * c + a * s;
      }
    }
  }
  EXPECT_EQ(compare(after, expected, {2e-6, 2e-6}, "rope"), "");
  const std::vector<int32_t> bad = {0, 1, 4096, 2, 3};
  EXPECT_THROW(apply_rope(q, bad, table, style), Error);
}

INSTANTIATE_TEST_SUITE_P(Ops, RopeTest,
                         ::testing::Values(RopeStyle::kNeox, RopeStyle::kInterleaved),
                         [](const auto& info) {
                           return std::string(info.param == RopeStyle::kNeox ? "neox"
                                                                             : "interleaved");
                         });

TEST(OpsDevice, CudaViewsAreRefusedWithAReason) {
  float data[8] = {};
  TensorView x = TensorView::contiguous(data, DType::kF32, {2, 4}, Device::cuda());
  HostTensor w(DType::kF32, {4});
  try {
    rms_norm(x, w.view(), 1e-6f, x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedattn::ops
