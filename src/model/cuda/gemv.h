// A GEMV for linear layers at a few rows (gemv.cu): y [m, n] f32 = x [m, k] · wᵀ with w [n, k]
// row-major (the checkpoint's layout), x and w both bf16 or both f16, f32 accumulation, for
// 1 <= m <= kGemvMaxRows. A decode step's linear layers have m = the batch, and there cuBLAS's
// small-m tiles leave most of the memory bandwidth unused; this kernel streams each weight row
// once with 16-byte loads spread over every SM, which is all a GEMV at small m has to do.
// Blas::linear (blas.h) chooses it; everything it does not support stays with cuBLAS.
//
// The kernel is deterministic (fixed summation order, no atomics), allocates nothing and never
// synchronises, so it can be captured in a CUDA graph. Tested against float64 in
// tests/model/cuda/gemv_cuda_test.cpp.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::model::cuda {

inline constexpr int64_t kGemvMaxRows = 8;

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
