// The CUDA model's GEMMs through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx), in row-major
// terms. Inputs in the compute dtype (bf16, f16 or f32), accumulation in f32
// (CUBLAS_COMPUTE_32F: no TF32 for f32 inputs), outputs in f32 or the input dtype. Host API with
// no cuBLAS types; one handle per model, bound to the model's stream, with a fixed workspace (so
// that a captured CUDA graph never sees cuBLAS allocate). Linear layers at a few rows go to a GEMV
// kernel of our own instead (gemv.h).
#pragma once

#include <cstdint>
#include <memory>

#include "pagedattn/dtype.h"

namespace pagedattn::model::cuda {

class Blas {
 public:
  explicit Blas(void* stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y [m, n] (row stride ldy) = x [m, k] (ldx) · wᵀ with w [n, k] (ldw): a linear layer with the
  // weight as the checkpoint stores it. m = 0 is a no-op. At m <= 8 with bf16 / f16 inputs and an
  // f32 output, the GEMV kernel of gemv.h when its preconditions hold (blas.cpp says why), on the
  // same stream; cuBLAS otherwise.
  void linear(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w,
              int64_t ldw, DType in_dtype, void* y, int64_t ldy, DType out_dtype);
  // y [m, n] f32 (ldy) += x · wᵀ: linear() adding into y (the residual stream) in the GEMM's
  // epilogue (cuBLAS's beta = 1; the GEMV's kAccumulate) instead of writing a buffer that an add
  // kernel reads back. y + (x · wᵀ) rounded once in f32, as the add would.
  void linear_accumulate(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w,
                         int64_t ldw, DType in_dtype, float* y, int64_t ldy);

  // For b in [0, batch): y_b [m, n] = x_b [m, k] · op(w_b), op(w) = w [k, n] (transpose_w false)
  // or wᵀ with w [n, k] (true); operand b starts at base + b * stride (elements). MLA's per-head
  // products with kv_b_proj.
  struct Operand {
    const void* data = nullptr;
    int64_t ld = 0;      // row stride
    int64_t stride = 0;  // between batch entries
  };
  void batched(int64_t batch, int64_t m, int64_t n, int64_t k, Operand x, Operand w,
               bool transpose_w, DType in_dtype, void* y, int64_t ldy, int64_t y_stride,
               DType out_dtype);

  int64_t workspace_bytes() const;
  // The device's multiprocessor count, read at construction (the fused GEMV's grid).
  int sm_count() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn::model::cuda
