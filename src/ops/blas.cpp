// The BLAS under ops (see blas.h): OpenBLAS, or the built-in blocked GEMM.
#include "blas.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#ifdef PAGEDATTN_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace pagedattn::ops::blas {
namespace {

// Rows of A and columns of op(B) per register block of the built-in kernel.
constexpr int64_t kBlockM = 4;
constexpr int64_t kBlockN = 4;
constexpr int64_t kBlockK = 256;  // a slice of K that keeps the block's operands in L1/L2

void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, 0.0f);  // beta 0 overwrites (NaN in C does not survive), as BLAS
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// C += alpha · A · Bᵀ: each output is a dot product of two contiguous rows; a 4 x 4 block of
// them shares its loads, and `omp simd` lets the compiler vectorise the reductions over K.
void gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
             const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kk = std::min(kBlockK, k - k0);
    for (int64_t i0 = 0; i0 < m; i0 += kBlockM) {
      const int64_t mi = std::min(kBlockM, m - i0);
      for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
        const int64_t nj = std::min(kBlockN, n - j0);
        for (int64_t i = 0; i < mi; ++i) {
          const float* ar = a + (i0 + i) * lda + k0;
          for (int64_t j = 0; j < nj; ++j) {
            const float* br = b + (j0 + j) * ldb + k0;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t p = 0; p < kk; ++p) sum += ar[p] * br[p];
            c[(i0 + i) * ldc + j0 + j] += alpha * sum;
          }
        }
      }
    }
  }
}

// C += alpha · A · B with B [K, N]: row i of C accumulates rows of B scaled by A[i, p] (a
// contiguous, vectorisable update), K sliced so the touched rows of B stay in cache.
void gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
             const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kk = std::min(kBlockK, k - k0);
    for (int64_t i = 0; i < m; ++i) {
      float* cr = c + i * ldc;
      for (int64_t p = 0; p < kk; ++p) {
        const float s = alpha * a[i * lda + k0 + p];
        const float* br = b + (k0 + p) * ldb;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) cr[j] += s * br[j];
      }
    }
  }
}

}  // namespace

void builtin_sgemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  scale_c(m, n, beta, c, ldc);
  if (k <= 0 || alpha == 0.0f) return;
  if (transpose_b) {
    gemm_nt(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else {
    gemm_nn(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  }
}

#ifdef PAGEDATTN_HAVE_OPENBLAS

void sgemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void sgemv(int64_t n, int64_t k, const float* a, int64_t lda, const float* x, float beta,
           float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(lda), x, 1, beta, y, 1);
}

void single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

std::string info() {
  const char* config = openblas_get_config();
  const int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  return fmt::format("OpenBLAS {} ({}, {} thread(s))", config ? config : "?",
                     parallel == 0   ? "sequential"
                     : parallel == 1 ? "pthreads"
                                     : "openmp",
                     openblas_get_num_threads());
}

#else

void sgemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  builtin_sgemm(transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemv(int64_t n, int64_t k, const float* a, int64_t lda, const float* x, float beta,
           float* y) {
  // y = A · x as a GEMM with M = 1: x is the one row of the left operand, A the transposed right.
  builtin_sgemm(true, 1, n, k, 1.0f, x, k, a, lda, beta, y, n);
}

void single_threaded() {}

std::string info() { return "built-in GEMM (OpenBLAS not found at configure time; slow)"; }

#endif

}  // namespace pagedattn::ops::blas
