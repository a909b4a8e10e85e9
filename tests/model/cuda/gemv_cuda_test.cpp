// The small-m GEMV (src/model/cuda/gemv.h) and Blas::linear's choice of it, against float64:
// - through Blas::linear for every m of a case (1..8 on the GEMV's shapes: Qwen3-0.6B's and
//   DeepSeek-V2-Lite's linear layers, a vocabulary-sized n, ragged n that no block size divides,
//   k = 8 and k = 4104, strided x, w and y), bf16 and f16, every element within
//   4 * K * 2^-24 * sum |x||w| of a float64 product of the same rounded values (f32 accumulation
//   of K terms); inputs of magnitudes spread over several binades; the padding of x and w (past
//   k) is NaN, so a read past k shows, and y's padding (past n) and the row after the last must
//   stay untouched;
// - for the GEMV's cases, the gemv() launcher called directly gives the same bits as
//   Blas::linear (so linear took the GEMV, and two launches agree: the order is fixed);
// - the cases the GEMV leaves to cuBLAS (k % 8 != 0, m = 9, x not 16-byte aligned, ldx % 8 != 0)
//   through Blas::linear, with the same bound;
// - Blas::linear captured into a CUDA graph (global capture mode: a launch outside the Blas's
//   stream or an allocation would fail the capture) and replayed;
// - gemv_supported / gemv's preconditions (no GPU needed).
// Skips without a GPU; scripts/gpu-check runs it with PAGEDATTN_REQUIRE_GPU=1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "model/cuda/blas.h"
#include "model/cuda/device_array.h"
#include "model/cuda/gemv.h"
#include "model/cuda/kernels.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

using ::pagedattn::testing::DeviceArray;

struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(stream); }
  Stream(const Stream&) = delete;
};

int sm_count() {
  int device = 0, count = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return count;
}

uint16_t to_word(DType dtype, float v) {
  uint16_t out;
  if (dtype == DType::kBF16) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    std::memcpy(&out, &b, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(&out, &h, 2);
  }
  return out;
}
float from_word(DType dtype, uint16_t word) {
  if (dtype == DType::kBF16) {
    __nv_bfloat16_raw raw;
    raw.x = word;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = word;
  return __half2float(__half(raw));
}
uint16_t nan_word(DType dtype) { return dtype == DType::kBF16 ? 0x7fc0 : 0x7e00; }

constexpr uint32_t kUntouched = 0xffffffffu;  // y's bytes before the call (a NaN)

// A problem of up to `rows` rows: x [rows, ldx] (from element `x_offset` of its allocation),
// w [n, ldw], the elements past k NaN; the float64 product and sum |x||w| of every element.
struct Problem {
  DType dtype;
  int64_t rows, n, k, ldx, ldw, x_offset;
  std::vector<uint16_t> x_words, w_words;  // x_words holds x_offset leading elements
  std::vector<double> product, magnitude;  // [rows, n]

  Problem(DType dtype_, int64_t rows_, int64_t n_, int64_t k_, int64_t ldx_, int64_t ldw_,
          int64_t x_offset_, uint32_t seed)
      : dtype(dtype_), rows(rows_), n(n_), k(k_), ldx(ldx_), ldw(ldw_), x_offset(x_offset_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    // |x| < 2^4, |w| < 2^2, down to far below 2^-8: products within f16's range and sums of
    // thousands of them within f32's, with many binades of spread.
    std::uniform_int_distribution<int> x_exponent(-8, 4), w_exponent(-10, 2);
    const auto fill = [&](std::vector<uint16_t>& words, std::vector<float>& values, int64_t count,
                          int64_t ld, int64_t offset, std::uniform_int_distribution<int>& exp) {
      words.assign(static_cast<size_t>(offset + count * ld), nan_word(dtype));
      values.assign(static_cast<size_t>(count * k), 0.0f);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t q = 0; q < k; ++q) {
          const uint16_t word = to_word(dtype, std::ldexp(unit(rng), exp(rng)));
          words[static_cast<size_t>(offset + r * ld + q)] = word;
          values[static_cast<size_t>(r * k + q)] = from_word(dtype, word);
        }
      }
    };
    std::vector<float> x, w;
    fill(x_words, x, rows, ldx, x_offset, x_exponent);
    fill(w_words, w, n, ldw, 0, w_exponent);
    product.assign(static_cast<size_t>(rows * n), 0.0);
    magnitude.assign(static_cast<size_t>(rows * n), 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, mag = 0;
        const float* xr = x.data() + i * k;
        const float* wr = w.data() + j * k;
        for (int64_t q = 0; q < k; ++q) {
          const double term = double{xr[q]} * double{wr[q]};
          sum += term;
          mag += std::abs(term);
        }
        product[static_cast<size_t>(i * n + j)] = sum;
        magnitude[static_cast<size_t>(i * n + j)] = mag;
      }
    }
  }

  // Checks y [m + 1, ldy] (host copy): rows < m against the product, the rest untouched.
  // Returns the worst error / bound.
  double check(const std::vector<float>& y, int64_t m, int64_t ldy, const std::string& what) const {
    int64_t bad = 0, touched = 0;
    double worst = 0;
    for (int64_t i = 0; i <= m; ++i) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float got = y[static_cast<size_t>(i * ldy + j)];
        if (i == m || j >= n) {
          uint32_t bits;
          std::memcpy(&bits, &got, 4);
          if (bits != kUntouched && ++touched <= 3) {
            ADD_FAILURE() << what << ": y[" << i << ", " << j << "] written (outside [" << m << ", "
                          << n << "])";
          }
          continue;
        }
        const double want = product[static_cast<size_t>(i * n + j)];
        const double bound = 4.0 * static_cast<double>(k) * std::ldexp(1.0, -24) *
                             magnitude[static_cast<size_t>(i * n + j)];
        const double error = std::abs(double{got} - want);
        worst = std::max(worst, error / std::max(bound, 1e-300));
        if (!(error <= bound) && ++bad <= 5) {
          ADD_FAILURE() << what << ": y[" << i << ", " << j << "] = " << got << ", float64 " << want
                        << " (bound " << bound << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0) << what << ": elements outside the bound; worst error / bound " << worst;
    EXPECT_EQ(touched, 0) << what << ": elements written outside y [m, n]";
    return worst;
  }
};

struct GemvCase {
  std::string name;
  DType dtype;
  int64_t n, k;
  int64_t m_first = 1, m_last = 8;
  int64_t ldx_pad = 0, ldw_pad = 0, ldy_pad = 0;  // strides k + pad, k + pad, n + pad
  int64_t x_offset = 0;  // x starts this many elements into its allocation (1: 2-byte aligned)
  bool gemv = true;      // the GEMV's operands (else cuBLAS's)
};
void PrintTo(const GemvCase& c, std::ostream* os) { *os << c.name; }

class GemvLinear : public ::testing::TestWithParam<GemvCase> {};

TEST_P(GemvLinear, EveryRowCountEqualsFloat64) {
  REQUIRE_GPU();
  const GemvCase& c = GetParam();
  const int64_t ldx = c.k + c.ldx_pad, ldw = c.k + c.ldw_pad, ldy = c.n + c.ldy_pad;
  const Problem p(c.dtype, c.m_last, c.n, c.k, ldx, ldw, c.x_offset, 97);
  DeviceArray<uint16_t> d_x(p.x_words), d_w(p.w_words);
  DeviceArray<float> d_y(static_cast<size_t>((c.m_last + 1) * ldy)),
      d_direct(static_cast<size_t>((c.m_last + 1) * ldy));
  const uint16_t* x = d_x.data + c.x_offset;
  Stream stream;
  cuda::Blas blas(stream.stream);
  // The uploads ran on the legacy default stream, which a non-blocking stream does not wait for.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  double worst = 0;
  for (int64_t m = c.m_first; m <= c.m_last; ++m) {
    const std::string what = fmt::format("{} m {}", c.name, m);
    EXPECT_EQ(cuda::gemv_supported(m, c.k, x, ldx, d_w.data, ldw, c.dtype), c.gemv) << what;
    ASSERT_EQ(cudaMemsetAsync(d_y.data, 0xff, d_y.count * sizeof(float), stream.stream),
              cudaSuccess);
    blas.linear(m, c.n, c.k, x, ldx, d_w.data, ldw, c.dtype, d_y.data, ldy, DType::kF32);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
    const std::vector<float> y = d_y.host();
    worst = std::max(worst, p.check(y, m, ldy, what));
    if (!c.gemv) continue;
    // The launcher itself: the same bits (linear chose it; the order is fixed).
    ASSERT_EQ(cudaMemsetAsync(d_direct.data, 0xff, d_direct.count * sizeof(float), stream.stream),
              cudaSuccess);
    cuda::gemv(m, c.n, c.k, x, ldx, d_w.data, ldw, c.dtype, d_direct.data, ldy, sm_count(),
               stream.stream);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
    const std::vector<float> direct = d_direct.host();
    EXPECT_EQ(std::memcmp(direct.data(), y.data(), y.size() * sizeof(float)), 0)
        << what << ": gemv() and Blas::linear differ";
  }
  fmt::print("{}: m {}..{}, {}, worst error / bound {:.3f}\n", c.name, c.m_first, c.m_last,
             c.gemv ? "GEMV" : "cuBLAS", worst);
}

constexpr DType kBF16 = DType::kBF16, kF16 = DType::kF16;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvLinear,
    ::testing::Values(
        // Qwen3-0.6B: qkv 1024 -> 4096, o_proj 2048 -> 1024, gate_up 1024 -> 6144, down
        // 3072 -> 1024.
        GemvCase{"qwen3_qkv_bf16", kBF16, 4096, 1024}, GemvCase{"qwen3_qkv_f16", kF16, 4096, 1024},
        GemvCase{"qwen3_o_bf16", kBF16, 1024, 2048}, GemvCase{"qwen3_o_f16", kF16, 1024, 2048},
        GemvCase{"qwen3_gate_up_bf16", kBF16, 6144, 1024},
        GemvCase{"qwen3_gate_up_f16", kF16, 6144, 1024},
        GemvCase{"qwen3_down_bf16", kBF16, 1024, 3072},
        GemvCase{"qwen3_down_f16", kF16, 1024, 3072},
        // DeepSeek-V2-Lite: kv_a_proj 2048 -> 576, q_proj 2048 -> 3072, the shared experts'
        // gate_up 2048 -> 2 x 2816 and down 2816 -> 2048, the dense layer's down 10944 -> 2048.
        GemvCase{"v2_lite_kv_a_bf16", kBF16, 576, 2048},
        GemvCase{"v2_lite_q_f16", kF16, 3072, 2048},
        GemvCase{"v2_lite_shared_gate_up_bf16", kBF16, 5632, 2048},
        GemvCase{"v2_lite_shared_down_f16", kF16, 2048, 2816},
        GemvCase{"v2_lite_dense_down_bf16", kBF16, 2048, 10944},
        // A vocabulary-sized n (lm_head): many blocks.
        GemvCase{"vocab_bf16", kBF16, 32000, 1024},
        // n that no block's row count divides; k of one vector; a long odd k (513 vectors).
        GemvCase{"n1000_bf16", kBF16, 1000, 1024}, GemvCase{"n1000_f16", kF16, 1000, 1024},
        GemvCase{"n37_k4104_bf16", kBF16, 37, 4104}, GemvCase{"n37_k4104_f16", kF16, 37, 4104},
        GemvCase{"k8_bf16", kBF16, 300, 8}, GemvCase{"k8_f16", kF16, 37, 8},
        GemvCase{"n1_k64_bf16", kBF16, 1, 64},
        // Strided x, w and y (ldx, ldw multiples of 8 above k; ldy any).
        GemvCase{"strided_bf16", kBF16, 1000, 1032, 1, 8, 24, 16, 5},
        GemvCase{"strided_f16", kF16, 37, 4104, 1, 8, 8, 8, 3},
        // Left to cuBLAS: k % 8 != 0; m = 9; x 2- and 8-byte aligned; ldx % 8 != 0.
        GemvCase{"k1020_cublas_bf16", kBF16, 1000, 1020, 1, 8, 0, 0, 0, 0, false},
        GemvCase{"k4100_cublas_f16", kF16, 37, 4100, 1, 8, 0, 0, 0, 0, false},
        GemvCase{"m9_cublas_bf16", kBF16, 1024, 2048, 9, 9, 0, 0, 0, 0, false},
        GemvCase{"x_offset1_cublas_bf16", kBF16, 1024, 2048, 1, 8, 0, 0, 0, 1, false},
        GemvCase{"x_offset4_cublas_f16", kF16, 1000, 1024, 1, 8, 0, 0, 0, 4, false},
        GemvCase{"ldx_pad4_cublas_bf16", kBF16, 1024, 1024, 1, 8, 4, 0, 0, 0, false}),
    [](const auto& info) { return info.param.name; });

// Blas::linear captured into a CUDA graph in global capture mode (any launch outside the Blas's
// stream, any allocation or synchronisation would break the capture) and replayed twice.
// Blas::linear_accumulate: y += x · wᵀ into an f32 y that holds values of its own (the residual
// stream), at the GEMV's rows (1..8) and cuBLAS's (9, 64: beta = 1), against float64 y0 + x · wᵀ
// with the GEMV test's bound plus one rounding of the sum; rows past m and columns past n
// unchanged.
TEST(BlasAccumulate, AddsIntoYEqualsFloat64) {
  REQUIRE_GPU();
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1024, 2048}, {3072, 1024}}) {
      const int64_t rows = 64, ldy = n + 3;
      const Problem p(dtype, rows, n, k, k, k, 0, 41);
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> unit(-4.0f, 4.0f);
      std::vector<float> y0(static_cast<size_t>((rows + 1) * ldy));
      for (float& v : y0) v = unit(rng);
      DeviceArray<uint16_t> d_x(p.x_words), d_w(p.w_words);
      Stream stream;
      cuda::Blas blas(stream.stream);
      for (const int64_t m : {int64_t{1}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{64}}) {
        const std::string what = fmt::format("{} n {} k {} m {}", dtype_name(dtype), n, k, m);
        DeviceArray<float> d_y(y0);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        blas.linear_accumulate(m, n, k, d_x.data, k, d_w.data, k, dtype, d_y.data, ldy);
        ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
        const std::vector<float> y = d_y.host();
        int64_t bad = 0;
        for (int64_t i = 0; i <= m && i < rows + 1; ++i) {
          for (int64_t j = 0; j < ldy; ++j) {
            const size_t at = static_cast<size_t>(i * ldy + j);
            if (i == m || j >= n) {
              if (std::memcmp(&y[at], &y0[at], 4) != 0 && ++bad <= 3) {
                ADD_FAILURE() << what << ": y[" << i << ", " << j << "] changed outside [m, n]";
              }
              continue;
            }
            const size_t e = static_cast<size_t>(i * n + j);
            const double want = double{y0[at]} + p.product[e];
            const double bound =
                4.0 * static_cast<double>(k) * std::ldexp(1.0, -24) * p.magnitude[e] +
                std::abs(want) * std::ldexp(1.0, -24);
            if (!(std::abs(double{y[at]} - want) <= bound) && ++bad <= 5) {
              ADD_FAILURE() << what << ": y[" << i << ", " << j << "] = " << y[at] << ", float64 "
                            << want << " (bound " << bound << ")";
            }
          }
        }
        EXPECT_EQ(bad, 0) << what;
      }
    }
  }
}

TEST(GemvGraph, CapturedLinearReplaysToTheSameBits) {
  REQUIRE_GPU();
  struct Call {
    DType dtype;
    int64_t m, n, k;
  };
  const Call calls[] = {{kBF16, 1, 1024, 2048}, {kF16, 4, 6144, 1024}, {kBF16, 8, 1000, 3072}};
  Stream stream;
  cuda::Blas blas(stream.stream);
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> inputs;
  std::vector<std::unique_ptr<DeviceArray<float>>> outputs;
  for (const Call& call : calls) {
    problems.push_back(
        std::make_unique<Problem>(call.dtype, call.m, call.n, call.k, call.k, call.k, 0, 131));
    inputs.push_back(std::make_unique<DeviceArray<uint16_t>>(problems.back()->x_words));
    inputs.push_back(std::make_unique<DeviceArray<uint16_t>>(problems.back()->w_words));
    outputs.push_back(
        std::make_unique<DeviceArray<float>>(static_cast<size_t>((call.m + 1) * call.n)));
  }
  const auto enqueue = [&] {
    for (size_t i = 0; i < std::size(calls); ++i) {
      const Call& call = calls[i];
      blas.linear(call.m, call.n, call.k, inputs[2 * i]->data, call.k, inputs[2 * i + 1]->data,
                  call.k, call.dtype, outputs[i]->data, call.n, DType::kF32);
    }
  };
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads (legacy default stream)
  // Eager first: the reference bits.
  for (auto& out : outputs) {
    ASSERT_EQ(cudaMemsetAsync(out->data, 0xff, out->count * sizeof(float), stream.stream),
              cudaSuccess);
  }
  enqueue();
  ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  std::vector<std::vector<float>> eager;
  for (size_t i = 0; i < std::size(calls); ++i) {
    eager.push_back(outputs[i]->host());
    problems[i]->check(eager.back(), calls[i].m, calls[i].n, fmt::format("eager call {}", i));
  }

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream.stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    for (auto& out : outputs) {
      ASSERT_EQ(cudaMemsetAsync(out->data, 0xff, out->count * sizeof(float), stream.stream),
                cudaSuccess);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
    for (size_t i = 0; i < std::size(calls); ++i) {
      const std::vector<float> y = outputs[i]->host();
      EXPECT_EQ(std::memcmp(y.data(), eager[i].data(), y.size() * sizeof(float)), 0)
          << "replay " << replay << " call " << i << " differs from the eager call";
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The preconditions, on pointers never dereferenced (no GPU needed): gemv_supported says no to
// each violation, and gemv() throws rather than launch.
TEST(GemvPreconditions, EachViolationIsRefused) {
  alignas(16) static const uint16_t storage[64] = {};
  const void* a = storage;
  const void* off = storage + 1;   // 2-byte aligned
  const void* off8 = storage + 4;  // 8-byte aligned
  EXPECT_TRUE(cuda::gemv_supported(1, 1024, a, 1024, a, 1024, kBF16));
  EXPECT_TRUE(cuda::gemv_supported(8, 8, a, 8, a, 16, kF16));
  EXPECT_FALSE(cuda::gemv_supported(0, 1024, a, 1024, a, 1024, kBF16)) << "m = 0";
  EXPECT_FALSE(cuda::gemv_supported(9, 1024, a, 1024, a, 1024, kBF16)) << "m = 9";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1024, a, 1024, DType::kF32)) << "f32";
  EXPECT_FALSE(cuda::gemv_supported(1, 1020, a, 1024, a, 1024, kBF16)) << "k % 8";
  EXPECT_FALSE(cuda::gemv_supported(1, 0, a, 1024, a, 1024, kBF16)) << "k = 0";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1028, a, 1024, kBF16)) << "ldx % 8";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1024, a, 1036, kBF16)) << "ldw % 8";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1016, a, 1024, kBF16)) << "ldx < k";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1024, a, 1016, kBF16)) << "ldw < k";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, off, 1024, a, 1024, kBF16)) << "x 2-byte aligned";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, off8, 1024, a, 1024, kBF16)) << "x 8-byte aligned";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, a, 1024, off8, 1024, kBF16)) << "w 8-byte aligned";
  EXPECT_FALSE(cuda::gemv_supported(1, 1024, nullptr, 1024, a, 1024, kBF16)) << "no x";
  float* y = reinterpret_cast<float*>(const_cast<uint16_t*>(storage));
  EXPECT_THROW(cuda::gemv(1, 16, 1020, a, 1024, a, 1024, kBF16, y, 16, 132, nullptr), Error);
  EXPECT_THROW(cuda::gemv(9, 16, 1024, a, 1024, a, 1024, kBF16, y, 16, 132, nullptr), Error);
  EXPECT_THROW(cuda::gemv(1, 16, 1024, a, 1024, a, 1024, kBF16, y, 15, 132, nullptr), Error)
      << "ldy < n";
  EXPECT_THROW(cuda::gemv(1, 16, 1024, a, 1024, a, 1024, kBF16, y, 16, 0, nullptr), Error)
      << "no SM count";
}

// ---- The fused forms (GemvArgs): the decode step's dense layers ----
// For each case and every m in 1..8, bf16 and f16, with and without a bias:
// - kRmsNorm + kStore (qkv), kRmsNorm + kSiluPairs (gate_up), kX + kAccumulate (o_proj, down)
//   against float64: the norm of r in float64, the product with that unrounded x, so the bound
//   adds the rounding of x to the dtype (its unit roundoff u times sum |x||w|) to the f32
//   accumulation's 4 K 2^-24 sum |x||w|; SiLU * up through the bounds of both factors; the padding
//   of y / act and the row after the last untouched;
// - the same bits as the unfused kernels they replace (add_rms_norm -> gemv, -> silu_mul,
//   gemv -> add_bias -> residual + branch on the host in f32): the fused model step equals the
//   unfused one.
struct FusedCase {
  std::string name;
  DType dtype;
  int64_t n, k;
  bool bias = false;
  int64_t ldy_pad = 0;
};
void PrintTo(const FusedCase& c, std::ostream* os) { *os << c.name; }

double unit_roundoff(DType dtype) {
  return dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// Random f32 values spread over binades (|v| < 4), NaN past `count` up to the padding.
std::vector<float> spread_floats(int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 2);
  std::vector<float> out(static_cast<size_t>(rows * ld), std::nanf(""));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(r * ld + c)] = std::ldexp(unit(rng), exponent(rng));
  return out;
}

struct Fused {
  const FusedCase& c;
  int64_t m;
  std::vector<float> r, norm_w, bias, y0;  // r [m, k] f32, norm_w [k], bias [n], y0 [m + 1, ldy]
  std::vector<uint16_t> w_words;           // [n, k]
  std::vector<double> xn;                  // [m, k] the float64 norm of r
  int64_t ldy;

  Fused(const FusedCase& c_, int64_t m_, uint32_t seed) : c(c_), m(m_), ldy(c_.n + c_.ldy_pad) {
    std::mt19937 rng(seed);
    r = spread_floats(m, c.k, c.k, rng);
    norm_w = spread_floats(1, c.k, c.k, rng);
    bias = c.bias ? spread_floats(1, c.n, c.n, rng) : std::vector<float>();
    y0 = spread_floats(m + 1, ldy, ldy, rng);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-10, 2);
    w_words.resize(static_cast<size_t>(c.n * c.k));
    for (auto& word : w_words) word = to_word(c.dtype, std::ldexp(unit(rng), exponent(rng)));
    xn.resize(static_cast<size_t>(m * c.k));
    for (int64_t i = 0; i < m; ++i) {
      double squares = 0;
      for (int64_t q = 0; q < c.k; ++q) squares += double{r[i * c.k + q]} * r[i * c.k + q];
      const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(c.k) + kEps);
      for (int64_t q = 0; q < c.k; ++q)
        xn[i * c.k + q] = double{norm_w[q]} * (double{r[i * c.k + q]} * inverse);
    }
  }
  static constexpr double kEps = 1e-6;

  // x_i · w_j (+ bias_j) in float64 with x = the norm of r (or `x` given), and sum |x||w|.
  std::pair<double, double> dot(const std::vector<double>& x, int64_t i, int64_t j) const {
    double sum = 0, mag = 0;
    for (int64_t q = 0; q < c.k; ++q) {
      const double term = x[i * c.k + q] * from_word(c.dtype, w_words[j * c.k + q]);
      sum += term;
      mag += std::abs(term);
    }
    if (c.bias) sum += bias[j];
    return {sum, mag};
  }
  double bound(double mag, bool rounded_x) const {
    return ((rounded_x ? unit_roundoff(c.dtype) : 0.0) + 4.0 * c.k * std::ldexp(1.0, -24) +
            std::ldexp(1.0, -20)) *
           mag;
  }
};

class GemvFused : public ::testing::TestWithParam<FusedCase> {};

TEST_P(GemvFused, EachFormEqualsFloat64AndTheUnfusedKernels) {
  REQUIRE_GPU();
  const FusedCase& c = GetParam();
  Stream stream;
  const int sms = sm_count();
  const float eps = static_cast<float>(Fused::kEps);
  const int64_t half = c.n / 2;
  int64_t checked = 0;
  for (int64_t m = 1; m <= 8; ++m) {
    const std::string what = fmt::format("{} m {}", c.name, m);
    const Fused f(c, m, static_cast<uint32_t>(1000 + m));
    DeviceArray<float> d_r(f.r), d_norm_w(f.norm_w),
        d_bias(c.bias ? f.bias : std::vector<float>{0.0f});
    DeviceArray<uint16_t> d_w(f.w_words);
    DeviceArray<float> d_y(f.y0), d_unfused(f.y0);
    DeviceArray<uint16_t> d_act(static_cast<size_t>((m + 1) * half)),
        d_x(static_cast<size_t>(m * c.k)), d_act_unfused(static_cast<size_t>((m + 1) * half));
    DeviceArray<float> d_gate_up(static_cast<size_t>(m * c.n));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // uploads on the legacy default stream
    const float* bias = c.bias ? d_bias.data : nullptr;
    cuda::GemvArgs base;
    base.m = m;
    base.n = c.n;
    base.k = c.k;
    base.dtype = c.dtype;
    base.w = d_w.data;
    base.ldw = c.k;
    base.bias = bias;
    base.sm_count = sms;
    base.stream = stream.stream;
    cuda::GemvArgs norm = base;
    norm.input = cuda::GemvInput::kRmsNorm;
    norm.norm_in = d_r.data;
    norm.ld_norm_in = c.k;
    norm.norm_weight = d_norm_w.data;
    norm.eps = eps;

    // The unfused reference bits: x = add_rms_norm(r), y = gemv(x) (+ add_bias).
    cuda::AddNormArgs add_norm;
    add_norm.residual = d_r.data;
    add_norm.weight = d_norm_w.data;
    add_norm.out = d_x.data;
    add_norm.out_dtype = c.dtype;
    add_norm.rows = m;
    add_norm.dim = c.k;
    add_norm.eps = eps;
    cuda::add_rms_norm(add_norm, stream.stream);
    cuda::gemv(m, c.n, c.k, d_x.data, c.k, d_w.data, c.k, c.dtype, d_gate_up.data, c.n, sms,
               stream.stream);
    if (bias != nullptr) cuda::add_bias(d_gate_up.data, c.n, bias, m, c.n, stream.stream);

    // 1. kRmsNorm -> kStore.
    cuda::GemvArgs store = norm;
    store.y = d_y.data;
    store.ldy = f.ldy;
    cuda::gemv(store);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
    const std::vector<float> y = d_y.host(), ref = d_gate_up.host();
    int64_t bad = 0;
    for (int64_t i = 0; i <= m; ++i) {
      for (int64_t j = 0; j < f.ldy; ++j) {
        const float got = y[i * f.ldy + j];
        if (i == m || j >= c.n) {
          EXPECT_EQ(std::memcmp(&got, &f.y0[i * f.ldy + j], 4), 0)
              << what << ": store wrote y[" << i << ", " << j << "] outside [m, n]";
          continue;
        }
        const auto [want, mag] = f.dot(f.xn, i, j);
        if (!(std::abs(got - want) <= f.bound(mag, true)) && ++bad <= 5) {
          ADD_FAILURE() << what << ": store y[" << i << ", " << j << "] = " << got << ", float64 "
                        << want << " (bound " << f.bound(mag, true) << ")";
        }
        EXPECT_EQ(std::memcmp(&got, &ref[i * c.n + j], 4), 0)
            << what << ": store y[" << i << ", " << j << "] " << got << " vs unfused "
            << ref[i * c.n + j];
        ++checked;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": store outside the bound";

    // 2. kRmsNorm -> kSiluPairs (n even), against float64 and silu_mul's bits.
    if (c.n % 2 == 0) {
      ASSERT_EQ(cudaMemsetAsync(d_act.data, 0xff, d_act.count * 2, stream.stream), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(d_act_unfused.data, 0xff, d_act_unfused.count * 2, stream.stream),
                cudaSuccess);
      cuda::GemvArgs pairs = norm;
      pairs.output = cuda::GemvOutput::kSiluPairs;
      pairs.act = d_act.data;
      pairs.ld_act = half;
      cuda::gemv(pairs);
      cuda::silu_mul(d_gate_up.data, DType::kF32, m, half, d_act_unfused.data, c.dtype, half,
                     stream.stream);
      ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
      const std::vector<uint16_t> act = d_act.host(), act_ref = d_act_unfused.host();
      bad = 0;
      for (int64_t i = 0; i <= m; ++i) {
        for (int64_t j = 0; j < half; ++j) {
          const uint16_t word = act[i * half + j];
          if (i == m) {
            EXPECT_EQ(word, 0xffff) << what << ": act row " << m << " written";
            continue;
          }
          const auto [g, g_mag] = f.dot(f.xn, i, j);
          const auto [u, u_mag] = f.dot(f.xn, i, half + j);
          const double sig = 1.0 / (1.0 + std::exp(-g)), silu = g * sig;
          const double want = silu * u;
          // silu' = sig (1 + g (1 - sig)) <= 1.1; each factor's bound, then act's rounding.
          const double bound =
              1.1 * std::abs(u) * f.bound(g_mag, true) +
              (std::abs(silu) + 1.1 * f.bound(g_mag, true)) * f.bound(u_mag, true) +
              (unit_roundoff(c.dtype) + std::ldexp(1.0, -20)) * std::abs(want) + 1e-30;
          const double got = from_word(c.dtype, word);
          if (!(std::abs(got - want) <= bound) && ++bad <= 5) {
            ADD_FAILURE() << what << ": act[" << i << ", " << j << "] = " << got << ", float64 "
                          << want << " (bound " << bound << ")";
          }
          EXPECT_EQ(word, act_ref[i * half + j])
              << what << ": act[" << i << ", " << j << "] differs from silu_mul's";
          ++checked;
        }
      }
      EXPECT_EQ(bad, 0) << what << ": SiLU pairs outside the bound";
    }

    // 3. kX -> kAccumulate: y0 + x · wᵀ (+ bias), x the rounded norm (d_x, add_rms_norm's).
    cuda::GemvArgs acc = base;
    acc.x = d_x.data;
    acc.ldx = c.k;
    acc.output = cuda::GemvOutput::kAccumulate;
    acc.y = d_unfused.data;
    acc.ldy = f.ldy;
    cuda::gemv(acc);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess) << what;
    const std::vector<float> sum = d_unfused.host();
    const std::vector<uint16_t> x_words = d_x.host();
    std::vector<double> x_rounded(x_words.size());
    for (size_t q = 0; q < x_words.size(); ++q) x_rounded[q] = from_word(c.dtype, x_words[q]);
    bad = 0;
    for (int64_t i = 0; i <= m; ++i) {
      for (int64_t j = 0; j < f.ldy; ++j) {
        const float got = sum[i * f.ldy + j], before = f.y0[i * f.ldy + j];
        if (i == m || j >= c.n) {
          EXPECT_EQ(std::memcmp(&got, &before, 4), 0)
              << what << ": accumulate wrote y[" << i << ", " << j << "] outside [m, n]";
          continue;
        }
        const auto [product, mag] = f.dot(x_rounded, i, j);
        const double want = double{before} + product;
        const double bound = f.bound(mag, false) + std::ldexp(1.0, -23) * std::abs(want);
        if (!(std::abs(got - want) <= bound) && ++bad <= 5) {
          ADD_FAILURE() << what << ": accumulate y[" << i << ", " << j << "] = " << got
                        << ", float64 " << want << " (bound " << bound << ")";
        }
        // The unfused order: residual + (gemv + bias), in f32.
        const float unfused = before + ref[i * c.n + j];
        EXPECT_EQ(std::memcmp(&got, &unfused, 4), 0)
            << what << ": accumulate y[" << i << ", " << j << "] " << got << " vs " << unfused;
        ++checked;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": accumulate outside the bound";
  }
  fmt::print("{}: {} outputs checked over m 1..8\n", c.name, checked);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvFused,
    ::testing::Values(
        // Qwen3-0.6B: qkv 1024 -> 4096 (the input norm), gate_up 1024 -> 2 x 3072 (the post norm,
        // SiLU pairs), o_proj / down's n 1024 (accumulate; k 1024 here: the norm staged too).
        FusedCase{"qwen3_qkv_bf16", kBF16, 4096, 1024},
        FusedCase{"qwen3_gate_up_f16", kF16, 6144, 1024},
        FusedCase{"qwen2_qkv_bias_bf16", kBF16, 1152, 896, true, 8},
        // Pairs that no group's pair count divides (n / 2 = 1001, odd), with a bias and padded y;
        // k of one 16-byte vector and an odd n (no pairs).
        FusedCase{"ragged_pairs_bias_f16", kF16, 2002, 512, true, 3},
        FusedCase{"n37_k8_bf16", kBF16, 37, 8, true, 1}),
    [](const auto& info) { return info.param.name; });

// The fused forms' own preconditions (no GPU needed).
TEST(GemvPreconditions, FusedFormsRefuseWhatTheyCannotDo) {
  alignas(16) static float storage[64] = {};
  cuda::GemvArgs a;
  a.m = 1;
  a.n = 16;
  a.k = 1024;
  a.dtype = kBF16;
  a.w = storage;
  a.ldw = 1024;
  a.input = cuda::GemvInput::kRmsNorm;
  a.norm_in = storage;
  a.ld_norm_in = 1024;
  a.norm_weight = storage;
  a.y = storage;
  a.ldy = 16;
  a.sm_count = 132;
  EXPECT_EQ(cuda::gemv_unsupported(a), "");
  cuda::GemvArgs b = a;
  b.norm_weight = nullptr;
  EXPECT_NE(cuda::gemv_unsupported(b).find("norm_weight missing"), std::string::npos)
      << cuda::gemv_unsupported(b);
  b = a;
  b.ld_norm_in = 1000;
  EXPECT_NE(cuda::gemv_unsupported(b).find("ld_norm_in 1000"), std::string::npos);
  b = a;
  b.m = 8;
  b.k = 4096;
  b.ldw = 4096;
  b.ld_norm_in = 4096;
  EXPECT_NE(cuda::gemv_unsupported(b).find("bytes of shared memory"), std::string::npos)
      << cuda::gemv_unsupported(b);
  b.m = 5;  // 40 KiB: fits
  EXPECT_EQ(cuda::gemv_unsupported(b), "");
  b = a;
  b.output = cuda::GemvOutput::kSiluPairs;
  b.n = 15;
  b.act = storage;
  b.ld_act = 8;
  EXPECT_NE(cuda::gemv_unsupported(b).find("n 15"), std::string::npos);
  b.n = 16;
  EXPECT_EQ(cuda::gemv_unsupported(b), "");
  b.ld_act = 7;
  EXPECT_NE(cuda::gemv_unsupported(b).find("ld_act 7"), std::string::npos);
  b = a;
  b.ldy = 15;
  EXPECT_NE(cuda::gemv_unsupported(b).find("ldy 15"), std::string::npos);
  b = a;
  b.input = cuda::GemvInput::kX;  // no x
  EXPECT_NE(cuda::gemv_unsupported(b).find("no x"), std::string::npos);
  EXPECT_THROW(cuda::gemv(b), Error);
}

}  // namespace
}  // namespace pagedattn::model
