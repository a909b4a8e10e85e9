// The BLAS under ops: OpenBLAS where it is built in (PAGEDATTN_HAVE_OPENBLAS; what setup-debian
// installs and what the CPU path is tuned for), else a built-in blocked GEMM so that the model
// layer still builds and runs correctly on a machine without OpenBLAS (the GPU machine, whose
// model runs on cuBLAS; configured with -DPAGEDATTN_LAYERS_REQUIRED=OFF). Single-threaded: the
// callers parallelise with OpenMP around these calls.
#pragma once

#include <cstdint>
#include <string>

namespace pagedattn::ops::blas {

// C [M, N] = alpha · A [M, K] · op(B) + beta · C, row-major (see gemm_f32 in linear.h).
void sgemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// y [N] = A [N, K] · x + beta · y, A row-major with leading dimension lda.
void sgemv(int64_t n, int64_t k, const float* a, int64_t lda, const float* x, float beta,
           float* y);
// Pins the library's own threading to one thread (idempotent).
void single_threaded();
std::string info();

// The built-in kernels, always compiled (tests check them against the float64 reference even
// where OpenBLAS serves the library).
void builtin_sgemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace pagedattn::ops::blas
