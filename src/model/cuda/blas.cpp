// Blas (blas.h): row-major products as cuBLAS column-major calls. A row-major y [m, n] is a
// column-major [n, m] matrix with leading dimension ldy, so y = x · op(w) is computed as
// yᵀ = op(w)ᵀ · xᵀ: cuBLAS's A is w (transposed when the row-major product wants wᵀ, i.e. when w
// is stored [n, k]), its B is x untransposed.
//
// linear() at m <= kGemvMaxRows rows (decode steps, small batches) with bf16 / f16 inputs and an
// f32 output goes to the GEMV of gemv.h instead (why: see linear()).
#include "model/cuda/blas.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "model/cuda/gemv.h"

namespace pagedattn::model::cuda {
namespace {

// 32 MiB: what cuBLAS asks for on Hopper with the largest algorithms (its documentation).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "a cuBLAS error";
  }
}

#define PA_CUBLAS_CHECK(call)                                                          \
  do {                                                                                 \
    const cublasStatus_t pa_status_ = (call);                                          \
    PA_CHECK(pa_status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS: {} failed: {} ({})", #call, \
             status_name(pa_status_), static_cast<int>(pa_status_));                   \
  } while (0)

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      PA_FAIL("cuBLAS: dtype {} (expected f32, f16 or bf16)", dtype_name(dtype));
  }
}

// cuBLAS takes 32-bit sizes.
int to_int(int64_t value, const char* what) {
  PA_CHECK(value >= 0 && value <= INT32_MAX, "cuBLAS: {} = {} does not fit in 32 bits", what,
           value);
  return static_cast<int>(value);
}

void check_output(DType in_dtype, DType out_dtype) {
  // cublasGemmEx with CUBLAS_COMPUTE_32F: f32 inputs give f32; f16 / bf16 inputs give f32 or
  // their own dtype.
  PA_CHECK(out_dtype == DType::kF32 || out_dtype == in_dtype,
           "cuBLAS: {} inputs with a {} output (expected f32 or {})", dtype_name(in_dtype),
           dtype_name(out_dtype), dtype_name(in_dtype));
}

// y [m, n] (ldy, out_dtype) = x [m, k] · wᵀ + beta y, w [n, k]: one cublasGemmEx in row-major terms
// (the file's comment), f32 accumulation.
void gemm(cublasHandle_t handle, int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
          const void* w, int64_t ldw, DType in_dtype, void* y, int64_t ldy, DType out_dtype,
          float beta) {
  const float alpha = 1.0f;
  PA_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, to_int(n, "n"), to_int(m, "m"),
                               to_int(k, "k"), &alpha, w, data_type(in_dtype), to_int(ldw, "ldw"),
                               x, data_type(in_dtype), to_int(ldx, "ldx"), &beta, y,
                               data_type(out_dtype), to_int(ldy, "ldy"), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace

struct Blas::State {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;  // cuBLAS's and the GEMV's
  int sm_count = 0;               // of the device current at construction (the GEMV's grid)
};

Blas::Blas(void* stream) : state_(std::make_unique<State>()) {
  state_->stream = static_cast<cudaStream_t>(stream);
  int device = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&state_->sm_count, cudaDevAttrMultiProcessorCount, device));
  PA_CUBLAS_CHECK(cublasCreate(&state_->handle));
  PA_CUDA_CHECK(cudaMalloc(&state_->workspace, kWorkspaceBytes));
  PA_CUBLAS_CHECK(cublasSetStream(state_->handle, static_cast<cudaStream_t>(stream)));
  PA_CUBLAS_CHECK(cublasSetWorkspace(state_->handle, state_->workspace, kWorkspaceBytes));
  // CUBLAS_DEFAULT_MATH: f32 products stay f32 (no TF32), the contract the f32 tests rely on.
  PA_CUBLAS_CHECK(cublasSetMathMode(state_->handle, CUBLAS_DEFAULT_MATH));
}

Blas::~Blas() {
  if (state_ == nullptr) return;
  if (state_->handle != nullptr) cublasDestroy(state_->handle);
  if (state_->workspace != nullptr) cudaFree(state_->workspace);
}

int64_t Blas::workspace_bytes() const { return static_cast<int64_t>(kWorkspaceBytes); }

int Blas::sm_count() const { return state_->sm_count; }

void Blas::linear(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w,
                  int64_t ldw, DType in_dtype, void* y, int64_t ldy, DType out_dtype) {
  if (m == 0 || n == 0) return;
  check_output(in_dtype, out_dtype);
  // At a few rows a linear layer is a GEMV: reading w once is all the work, and cuBLAS's small-m
  // tiles do it far below the memory rate (ncu on an H200, Qwen3-0.6B at batch 1: qkv 1024 ->
  // 4096, 8 MB, 6.5 us; o_proj 2048 -> 1024, 4 MB, 11.6 us with an 8x64 tile; down 3072 -> 1024
  // 5.9 us plus a 3.5 us split-K reduction: ~34 us a layer for 30 MB, ~8 us at 4.3 TB/s). The
  // GEMV kernel (gemv.h) spreads the rows' 16-byte loads over every SM. It needs f32 output,
  // bf16 / f16 inputs and whole aligned 16-byte vectors; anything else stays with cuBLAS.
  if (out_dtype == DType::kF32 && gemv_supported(m, k, x, ldx, w, ldw, in_dtype)) {
    gemv(m, n, k, x, ldx, w, ldw, in_dtype, static_cast<float*>(y), ldy, state_->sm_count,
         state_->stream);
    return;
  }
  gemm(state_->handle, m, n, k, x, ldx, w, ldw, in_dtype, y, ldy, out_dtype, 0.0f);
}

void Blas::linear_accumulate(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
                             const void* w, int64_t ldw, DType in_dtype, float* y, int64_t ldy) {
  if (m == 0 || n == 0) return;
  if (gemv_supported(m, k, x, ldx, w, ldw, in_dtype)) {
    GemvArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.dtype = in_dtype;
    a.w = w;
    a.ldw = ldw;
    a.x = x;
    a.ldx = ldx;
    a.output = GemvOutput::kAccumulate;
    a.y = y;
    a.ldy = ldy;
    a.sm_count = state_->sm_count;
    a.stream = state_->stream;
    gemv(a);
    return;
  }
  gemm(state_->handle, m, n, k, x, ldx, w, ldw, in_dtype, y, ldy, DType::kF32, 1.0f);
}

void Blas::batched(int64_t batch, int64_t m, int64_t n, int64_t k, Operand x, Operand w,
                   bool transpose_w, DType in_dtype, void* y, int64_t ldy, int64_t y_stride,
                   DType out_dtype) {
  if (batch == 0 || m == 0 || n == 0) return;
  check_output(in_dtype, out_dtype);
  const float alpha = 1.0f, beta = 0.0f;
  PA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      state_->handle, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, to_int(n, "n"),
      to_int(m, "m"), to_int(k, "k"), &alpha, w.data, data_type(in_dtype), to_int(w.ld, "ldw"),
      w.stride, x.data, data_type(in_dtype), to_int(x.ld, "ldx"), x.stride, &beta, y,
      data_type(out_dtype), to_int(ldy, "ldy"), y_stride, to_int(batch, "batch"),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace pagedattn::model::cuda
