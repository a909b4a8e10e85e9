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

}  // namespace
}  // namespace pagedattn::model
