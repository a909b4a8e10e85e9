// A GEMV for linear layers at a few rows (gemv.cu): y [m, n] f32 = x [m, k] · wᵀ with w [n, k]
// row-major (the checkpoint's layout), x and w both bf16 or both f16, f32 accumulation, for
// 1 <= m <= kGemvMaxRows. A decode step's linear layers have m = the batch, and there cuBLAS's
// small-m tiles leave most of the memory bandwidth unused; this kernel streams each weight row
// once with 16-byte loads spread over every SM, which is all a GEMV at small m has to do.
// Blas::linear (blas.h) chooses it; everything it does not support stays with cuBLAS.
//
// A decode step's dense layer runs its linear layers through the fused forms (GemvArgs): the
// RMSNorm of the residual stream computed in each block's prologue (no norm kernel, no x buffer),
// the residual added to in the epilogue (o_proj, down_proj: no add kernel), and gate_up's
// SiLU(gate) * up computed in the epilogue from the pair of rows (j, n/2 + j) one group owns (no
// silu_mul kernel, no f32 gate_up buffer): 10 kernels per layer become 7.
//
// The kernel is deterministic (fixed summation order, no atomics), allocates nothing and never
// synchronises, so it can be captured in a CUDA graph. Tested against float64 in
// tests/model/cuda/gemv_cuda_test.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/dtype.h"

namespace pagedattn::model::cuda {

inline constexpr int64_t kGemvMaxRows = 8;
// The fused RMSNorm stages x [m, k] in shared memory: m * k * 2 bytes at most this.
inline constexpr int64_t kGemvNormMaxBytes = 40 * 1024;

// Where x comes from.
enum class GemvInput : uint8_t {
  kX,        // x [m, k] of `dtype` (row stride ldx)
  kRmsNorm,  // x[i, :] = dtype(norm_weight * (r_i / sqrt(mean(r_i^2) + eps))), r_i = norm_in
             // [i, :k] f32 (row stride ld_norm_in): add_rms_norm's result, bit for bit
};
// Where y goes (bias, when given, [n] f32, is added to each row's sums first).
enum class GemvOutput : uint8_t {
  kStore,       // y [m, n] f32 (row stride ldy) = x · wᵀ (+ bias)
  kAccumulate,  // y [m, n] += x · wᵀ (+ bias): the residual stream
  kSiluPairs,   // act [m, n / 2] of `dtype` (row stride ld_act) = silu(g) * u with g = rows
               // [0, n/2) of x · wᵀ (+ bias) and u = rows [n/2, n): silu_mul's result, bit for bit
};

struct GemvArgs {
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBF16;  // of w, x and act
  const void* w = nullptr;
  int64_t ldw = 0;
  GemvInput input = GemvInput::kX;
  const void* x = nullptr;  // kX
  int64_t ldx = 0;
  const float* norm_in = nullptr;  // kRmsNorm
  int64_t ld_norm_in = 0;
  const float* norm_weight = nullptr;  // [k] f32
  float eps = 0.0f;
  GemvOutput output = GemvOutput::kStore;
  float* y = nullptr;  // kStore, kAccumulate
  int64_t ldy = 0;
  const float* bias = nullptr;
  void* act = nullptr;  // kSiluPairs
  int64_t ld_act = 0;
  int sm_count = 0;
  void* stream = nullptr;
};

// "" when gemv(args) takes these operands, else what it does not support. Beside the plain
// form's rules (gemv_supported below, x's for kX): kRmsNorm needs norm_in and norm_weight,
// ld_norm_in >= k and m * k * 2 <= kGemvNormMaxBytes; kStore / kAccumulate need y with ldy >= n;
// kSiluPairs needs n even, act, and ld_act >= n / 2.
std::string gemv_unsupported(const GemvArgs& args);
// Throws pagedattn::Error (naming the problem) unless gemv_unsupported(args) is "".
void gemv(const GemvArgs& args);

// True when gemv() takes these operands: 1 <= m <= kGemvMaxRows, dtype bf16 or f16, k >= 8 and
// k, ldx, ldw multiples of 8 (whole 16-byte vectors per row), x and w 16-byte aligned, ldx, ldw
// >= k and k < 2^31.
bool gemv_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
                    DType dtype);

// y [m, n] f32 (row stride ldy >= n) = x [m, k] (ldx) · wᵀ, w [n, k] (ldw), on `stream` (a
// cudaStream_t). Throws pagedattn::Error unless gemv_supported(...). `sm_count`, the device's
// multiprocessor count, sizes the grid so that every SM has work even at small n.
void gemv(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
          DType dtype, float* y, int64_t ldy, int sm_count, void* stream);

}  // namespace pagedattn::model::cuda
