// transform_heads, silu_mul and add_rms_norm (src/model/cuda/kernels.h) against a float64 host
// reference, every element: x in f32 or bf16 (a GEMM's output in the compute dtype), heads of width
// 128 (the vector kernel: whole-head NeoX or interleaved RoPE, or none; a warp per head at 5 rows,
// 4 or 2 heads a warp at 300 and 77 rows) and of widths 64 and 128 with partial RoPE (the
// lane-strided kernel), with and without bias and the per-head RMS norm, out in
// bf16 or f32, and x written back in f32. The reference starts from the values as stored (x rounded
// to its dtype) and computes in double. Bounds: f32 out within 1e-5 of the head's largest value (a
// 128-term f32 sum, RoPE's differences); bf16 out within one bf16 step (the f32 result and the
// double one may round to neighbours).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/device_array.h"
#include "model/cuda/kernels.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

using ::pagedattn::testing::DeviceArray;

enum class Rope { kNone, kNeox, kInterleaved };

struct TransformCase {
  DType x_dtype;
  int32_t width;
  Rope rope;
  int32_t rotary_half;  // with rope: 0 means width / 2
  bool bias, norm;
  DType out_dtype;
  // 5 rows of 3 heads: a warp per head. Many rows: 4 heads a warp (heads 4) or 2 (heads 6) on the
  // vector path (heads of 128, whole-head RoPE or none).
  int64_t rows = 5, heads = 3;
  std::string name() const {
    const char* rope_name = rope == Rope::kNone ? "norope" : rope == Rope::kNeox ? "neox" : "gptj";
    return fmt::format(
        "x{}_w{}_{}{}{}{}_out{}{}", dtype_name(x_dtype), width, rope_name,
        rope != Rope::kNone && rotary_half != 0 ? fmt::format("{}", rotary_half) : "",
        bias ? "_bias" : "", norm ? "_norm" : "", dtype_name(out_dtype),
        rows != 5 || heads != 3 ? fmt::format("_{}x{}", rows, heads) : "");
  }
};

void PrintTo(const TransformCase& c, std::ostream* os) { *os << c.name(); }

class TransformHeads : public ::testing::TestWithParam<TransformCase> {};

TEST_P(TransformHeads, MatchesFloat64) {
  REQUIRE_GPU();
  const TransformCase& c = GetParam();
  const int64_t rows = c.rows, heads = c.heads;
  constexpr int64_t kPositions = 40;
  const int64_t width = c.width, row_stride = heads * width + 8;  // a gap between rows
  const int32_t half = c.rope == Rope::kNone ? 0 : (c.rotary_half ? c.rotary_half : c.width / 2);
  std::mt19937 rng(11 + c.width);
  std::uniform_real_distribution<float> unit(-3.0f, 3.0f);
  const auto randoms = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = unit(rng);
    return v;
  };
  std::vector<float> x = randoms(rows * row_stride);
  if (c.x_dtype == DType::kBF16) {
    for (float& e : x) e = bf16_to_float(float_to_bf16(e));  // the values as stored
  }
  const std::vector<float> bias = randoms(heads * width), weight = randoms(width);
  std::vector<float> cos(static_cast<size_t>(kPositions * std::max(half, 1))), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    const double angle = unit(rng);
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r)
    positions[r] = static_cast<int32_t>((r * 13 + 5) % kPositions);

  // The reference, in double.
  std::vector<double> want(static_cast<size_t>(rows * heads * width));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> v(static_cast<size_t>(width));
      for (int64_t d = 0; d < width; ++d) {
        v[d] = x[r * row_stride + h * width + d] + (c.bias ? bias[h * width + d] : 0.0);
      }
      if (c.norm) {
        double squares = 0;
        for (double e : v) squares += e * e;
        const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(width) + 1e-6);
        for (int64_t d = 0; d < width; ++d) v[d] = weight[d] * (v[d] * inverse);
      }
      std::vector<double> y = v;
      for (int32_t i = 0; i < half; ++i) {
        const int64_t a = c.rope == Rope::kInterleaved ? 2 * i : i;
        const int64_t b = c.rope == Rope::kInterleaved ? 2 * i + 1 : i + half;
        const double cs = cos[positions[r] * half + i], sn = sin[positions[r] * half + i];
        y[a] = v[a] * cs - v[b] * sn;
        y[b] = v[b] * cs + v[a] * sn;
      }
      std::copy(y.begin(), y.end(), want.begin() + (r * heads + h) * width);
    }
  }

  // The device: x in its dtype, out [rows, heads, width] in out_dtype.
  const bool f32_x = c.x_dtype == DType::kF32;
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = float_to_bf16(x[i]);
  DeviceArray<float> d_x32(x);
  DeviceArray<uint16_t> d_x16(x_bf16);
  DeviceArray<float> d_bias(bias), d_weight(weight), d_cos(cos), d_sin(sin);
  DeviceArray<int32_t> d_pos(positions);
  const int64_t out_elems = rows * heads * width;
  DeviceArray<float> d_out32(static_cast<size_t>(out_elems));
  DeviceArray<uint16_t> d_out16(static_cast<size_t>(out_elems));
  cuda::HeadTransformArgs a;
  a.x = f32_x ? static_cast<void*>(d_x32.data) : static_cast<void*>(d_x16.data);
  a.x_dtype = c.x_dtype;
  a.x_stride_row = row_stride;
  a.x_stride_head = width;
  a.heads = heads;
  a.width = c.width;
  a.rows = rows;
  a.bias = c.bias ? d_bias.data : nullptr;
  a.norm_weight = c.norm ? d_weight.data : nullptr;
  if (c.rope != Rope::kNone) {
    a.cos = d_cos.data;
    a.sin = d_sin.data;
    a.rotary_half = half;
    a.interleaved = c.rope == Rope::kInterleaved;
    a.positions = d_pos.data;
  }
  a.out = c.out_dtype == DType::kF32 ? static_cast<void*>(d_out32.data)
                                     : static_cast<void*>(d_out16.data);
  a.out_dtype = c.out_dtype;
  a.out_stride_row = heads * width;
  a.out_stride_head = width;
  a.write_x = f32_x;
  cuda::transform_heads(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> out32 = d_out32.host(), x_back = d_x32.host();
  const std::vector<uint16_t> out16 = d_out16.host();
  int64_t bad = 0, bad_x = 0;
  std::string first;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      double scale = 0;  // the head's largest value: f32 rounding is relative to it
      for (int64_t d = 0; d < width; ++d) {
        scale = std::max(scale, std::abs(want[(r * heads + h) * width + d]));
      }
      for (int64_t d = 0; d < width; ++d) {
        const int64_t i = (r * heads + h) * width + d;
        const double expected = want[static_cast<size_t>(i)];
        const double f32_bound = 1e-5 * scale + 1e-30;
        double got, bound;
        if (c.out_dtype == DType::kF32) {
          got = out32[static_cast<size_t>(i)];
          bound = f32_bound;
        } else {
          got = bf16_to_float(out16[static_cast<size_t>(i)]);
          bound = std::ldexp(std::abs(expected), -7) + f32_bound;  // one bf16 step (8 bits)
        }
        if (!(std::abs(got - expected) <= bound)) {
          if (bad++ == 0) {
            first = fmt::format("row {} head {} element {}: got {}, expected {}", r, h, d, got,
                                expected);
          }
        }
        if (f32_x) {
          const double back = x_back[static_cast<size_t>(r * row_stride + h * width + d)];
          bad_x += !(std::abs(back - expected) <= f32_bound);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << c.name() << ": " << bad << " of " << out_elems << " out of bounds; first "
                    << first;
  EXPECT_EQ(bad_x, 0) << c.name() << ": x written back out of bounds";
  // The gap between rows is never written.
  if (f32_x) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = heads * width; g < row_stride; ++g) {
        ASSERT_EQ(x_back[r * row_stride + g], x[r * row_stride + g]) << "gap of row " << r;
      }
    }
  }
}

std::vector<TransformCase> transform_cases() {
  std::vector<TransformCase> cases;
  for (DType x : {DType::kF32, DType::kBF16}) {
    for (DType out : {DType::kBF16, DType::kF32}) {
      for (Rope rope : {Rope::kNone, Rope::kNeox, Rope::kInterleaved}) {
        for (int32_t width : {128, 64}) {
          cases.push_back(
              {x, width, rope, 0, rope == Rope::kNeox, rope != Rope::kInterleaved, out});
        }
      }
      // Partial RoPE at width 128 (the lane-strided path), with bias and norm.
      cases.push_back({x, 128, Rope::kNeox, 32, true, true, out});
      cases.push_back({x, 128, Rope::kInterleaved, 16, false, true, out});
      // Several heads a warp (a prefill's rows): 4 and 2 heads, each RoPE layout.
      for (Rope rope : {Rope::kNone, Rope::kNeox, Rope::kInterleaved}) {
        cases.push_back({x, 128, rope, 0, rope != Rope::kInterleaved, rope != Rope::kNone, out,
                         300, 4});
        cases.push_back({x, 128, rope, 0, true, true, out, 77, 6});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, TransformHeads, ::testing::ValuesIn(transform_cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(TransformHeadsErrors, NamedOnTheHost) {
  cuda::HeadTransformArgs a;
  a.x_dtype = DType::kBF16;
  a.write_x = true;  // a bf16 x cannot be written back
  a.rows = 1;
  a.heads = 1;
  a.width = 128;
  try {
    cuda::transform_heads(a, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("write_x needs f32"), std::string::npos) << e.what();
  }
}

// silu_mul from f32 or bf16 gate_up rows against double, out in bf16: few rows (one group of four
// columns a thread) and many (four groups), rows of whole float4 groups (vector loads) and of 1001
// columns (the scalar loop), and an out row stride that is no multiple of 4 (scalar stores); the
// columns between out's rows are never written. pair_block 16 (the MoE experts' interleaved
// layout: blocks of 16 gates then their 16 ups) on whole float4 groups and with f32 input.
TEST(SiluMul, Bf16AndF32InputsMatchFloat64) {
  REQUIRE_GPU();
  struct Shape {
    int64_t rows, width, out_stride, pair_block = 0;
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(-6.0f, 6.0f);
  for (const Shape& shape :
       {Shape{7, 1000, 1000}, Shape{7, 1001, 1001}, Shape{300, 1000, 1000}, Shape{300, 1001, 1001},
        Shape{300, 1000, 1002}, Shape{7, 1408, 1408, 16}, Shape{300, 1408, 1410, 16}}) {
    const int64_t rows = shape.rows, width = shape.width, stride = shape.out_stride;
    const int64_t block = shape.pair_block;
    // Where column c's gate and up sit in a row of 2 width.
    const auto gate_at = [&](int64_t c) {
      return block == 0 ? c : c / block * 2 * block + c % block;
    };
    const int64_t up_offset = block == 0 ? width : block;
    std::vector<float> gate_up(static_cast<size_t>(rows * 2 * width));
    for (float& e : gate_up) e = bf16_to_float(float_to_bf16(unit(rng)));
    std::vector<uint16_t> gate_up16(gate_up.size());
    for (size_t i = 0; i < gate_up.size(); ++i) gate_up16[i] = float_to_bf16(gate_up[i]);
    for (DType in : {DType::kF32, DType::kBF16}) {
      DeviceArray<float> d32(gate_up);
      DeviceArray<uint16_t> d16(gate_up16);
      DeviceArray<uint16_t> d_out(
          std::vector<uint16_t>(static_cast<size_t>(rows * stride), uint16_t{0x7fc1}));
      const void* src = in == DType::kF32 ? static_cast<const void*>(d32.data)
                                          : static_cast<const void*>(d16.data);
      cuda::silu_mul(src, in, rows, width, d_out.data, DType::kBF16, stride, nullptr, block);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> out = d_out.host();
      int64_t bad = 0, stray = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          const double g = gate_up[r * 2 * width + gate_at(c)],
                       u = gate_up[r * 2 * width + gate_at(c) + up_offset];
          const double expected = g / (1.0 + std::exp(-g)) * u;
          const double got = bf16_to_float(out[static_cast<size_t>(r * stride + c)]);
          bad += !(std::abs(got - expected) <= std::ldexp(std::abs(expected), -7) + 1e-6);
        }
        for (int64_t c = width; c < stride; ++c) stray += out[r * stride + c] != 0x7fc1;
      }
      const std::string what = fmt::format("{} input, {} rows of {} (out stride {}, pair block {})",
                                           dtype_name(in), rows, width, stride, block);
      EXPECT_EQ(bad, 0) << what;
      EXPECT_EQ(stray, 0) << what << ": columns between out's rows written";
    }
  }
}

// A pair block that does not divide the width is refused on the host, before any launch.
TEST(SiluMul, PairBlockNotDividingTheWidthIsNamed) {
  try {
    cuda::silu_mul(nullptr, DType::kF32, 4, 1408, nullptr, DType::kBF16, 1408, nullptr, 24);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pair_block 24 for width 1408"), std::string::npos)
        << e.what();
  }
}

// add_rms_norm against float64, every element: dims 1000 (held in registers, four a thread, the
// last thread's short), 2048 and 4096 (8 and 16) and 5000 (the loop); with and without add
// (residual written back only with it), with out_f32, and in gather mode (row_index: rows read
// from the residual, which stays unchanged). Bounds: the residual within 1 ulp (one f32 add); out
// in bf16 within one bf16 step of the double result, out_f32 within 1e-5 relative (a dim-term f32
// sum of squares).
TEST(AddRmsNorm, MatchesFloat64) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  for (const int64_t dim : {int64_t{1000}, int64_t{2048}, int64_t{4096}, int64_t{5000}}) {
    for (const bool with_add : {false, true}) {
      for (const bool gather : {false, true}) {
        constexpr int64_t kRows = 37;
        const std::string what =
            fmt::format("dim {}{}{}", dim, with_add ? ", add" : "", gather ? ", gather" : "");
        const auto randoms = [&](int64_t n) {
          std::vector<float> v(static_cast<size_t>(n));
          for (float& e : v) e = unit(rng);
          return v;
        };
        const std::vector<float> residual = randoms(kRows * dim), add = randoms(kRows * dim),
                                 weight = randoms(dim);
        std::vector<int32_t> index(kRows);
        for (int64_t r = 0; r < kRows; ++r) index[r] = static_cast<int32_t>((r * 11 + 4) % kRows);
        const int64_t out_rows = gather ? 23 : kRows;  // gather: the first 23 of index
        DeviceArray<float> d_res(residual), d_add(add), d_weight(weight);
        DeviceArray<int32_t> d_index(index);
        DeviceArray<uint16_t> d_out(static_cast<size_t>(out_rows * dim));
        DeviceArray<float> d_out32(static_cast<size_t>(out_rows * dim));
        cuda::AddNormArgs a;
        a.residual = d_res.data;
        a.add = with_add ? d_add.data : nullptr;
        a.weight = d_weight.data;
        a.out = d_out.data;
        a.out_dtype = DType::kBF16;
        a.out_f32 = d_out32.data;
        a.row_index = gather ? d_index.data : nullptr;
        a.rows = out_rows;
        a.dim = dim;
        a.eps = 1e-6f;
        cuda::add_rms_norm(a, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        const std::vector<float> res_back = d_res.host(), out32 = d_out32.host();
        const std::vector<uint16_t> out16 = d_out.host();
        int64_t bad_res = 0, bad_out = 0, bad_out32 = 0;
        for (int64_t r = 0; r < kRows; ++r) {
          for (int64_t d = 0; d < dim; ++d) {
            const size_t i = static_cast<size_t>(r * dim + d);
            const float want = with_add && !gather ? residual[i] + add[i] : residual[i];
            bad_res += res_back[i] != want;
          }
        }
        for (int64_t r = 0; r < out_rows; ++r) {
          const int64_t src = gather ? index[r] : r;
          std::vector<double> v(static_cast<size_t>(dim));
          double squares = 0;
          for (int64_t d = 0; d < dim; ++d) {
            const size_t i = static_cast<size_t>(src * dim + d);
            v[d] = double{residual[i]} + (with_add ? double{add[i]} : 0.0);
            squares += v[d] * v[d];
          }
          const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(dim) + 1e-6);
          for (int64_t d = 0; d < dim; ++d) {
            const double expected = weight[d] * v[d] * inverse;
            const size_t o = static_cast<size_t>(r * dim + d);
            bad_out32 += !(std::abs(out32[o] - expected) <= 1e-5 * (std::abs(expected) + 1e-3));
            bad_out += !(std::abs(bf16_to_float(out16[o]) - expected) <=
                         std::ldexp(std::abs(expected), -7) + 1e-5);
          }
        }
        EXPECT_EQ(bad_res, 0) << what << ": residual";
        EXPECT_EQ(bad_out, 0) << what << ": bf16 out";
        EXPECT_EQ(bad_out32, 0) << what << ": f32 out";
      }
    }
  }
}

}  // namespace
}  // namespace pagedattn::model
