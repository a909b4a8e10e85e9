// bench_prefill_cuda: the CUDA prefill kernel's TFLOP/s on the rows (Llama-3-8B shape:
// 32 query heads, 8 KV heads, head_dim 128, bf16, pages in random order), printed beside a cuBLAS
// bf16 matmul (8192^3) measured in the same run, so the ratio is what to read. A standalone,
// gtest-free executable, not built by CMake. `pagedattn bench prefill --device cuda` now carries
// the rows on device-generated data (tools/bench/cuda/bench_cuda_prefill.cpp;
// PAGEDATTN_PREFILL_KERNEL=mma selects the mma.sync kernel there too); this file stays for the
// side-by-side kernel comparison.
//
// Each row times the default kernel (wgmma on Hopper) and the mma.sync kernel
// (PAGEDATTN_PREFILL_KERNEL=mma). Timing: CUDA events around each launch, the L2 flushed (a 256 MiB
// memset) before every sample, 3 warm-ups, median of `--reps` samples (default 20). FLOPs count the
// visible (query, key) pairs only (causal: about half of the square), 2 * pairs * Hq * (Dqk + Dvo).
//
// Build (from the repository root, after building the library and the references):
//   nvcc -std=c++20 -O2 -I include -I src -I tests \
//     tools/bench/cuda/bench_prefill_cuda_main.cpp \
//     BUILD/tests/reference/libpagedattn_reference.a BUILD/src/libpagedattn.a -lcublas -lfmt \
//     -Xcompiler -fopenmp -o bench_prefill_cuda
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cases.h"
#include "cuda/prefill.h"
#include "cuda/workspace.h"

namespace {

using pagedattn::testing::AttentionCase;
using pagedattn::testing::CaseSpec;

#define CHECK_CUDA(call)                                                \
  do {                                                                  \
    const cudaError_t status_ = (call);                                 \
    if (status_ != cudaSuccess) {                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(status_));                        \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

struct Timer {
  cudaEvent_t start, stop;
  void* flush = nullptr;
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  Timer() {
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    CHECK_CUDA(cudaMalloc(&flush, kFlushBytes));
  }
  ~Timer() {
    cudaFree(flush);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  // Median milliseconds of `fn` over `reps` samples, L2 flushed before each.
  template <class Fn>
  double median_ms(Fn&& fn, int reps) {
    for (int i = 0; i < 3; ++i) fn();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> samples;
    for (int i = 0; i < reps; ++i) {
      CHECK_CUDA(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
      CHECK_CUDA(cudaEventRecord(start));
      fn();
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      samples.push_back(ms);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
  }
};

pagedattn::TensorView to_device(const pagedattn::TensorView& host, std::vector<void*>& owned) {
  pagedattn::TensorView view = host;
  if (!host.defined()) return view;
  int64_t last = 0;
  for (int d = 0; d < host.ndim; ++d) last += (host.shape[d] - 1) * host.strides[d];
  const size_t bytes = static_cast<size_t>((last + 1) * pagedattn::dtype_size(host.dtype));
  CHECK_CUDA(cudaMalloc(&view.data, bytes));
  CHECK_CUDA(cudaMemcpy(view.data, host.data, bytes, cudaMemcpyHostToDevice));
  owned.push_back(view.data);
  view.device = pagedattn::Device::cuda(0);
  return view;
}

double cublas_tflops(Timer& timer, int reps) {
  const int n = 8192;
  void *a, *b, *c;
  const size_t bytes = size_t{n} * n * 2;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMalloc(&c, bytes));
  // Random-ish bf16 bits (not zeros: zeros run faster than real data).
  std::vector<uint16_t> host(size_t{n} * n);
  uint32_t state = 12345;
  for (auto& x : host) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<uint16_t>(0x3c00 | ((state >> 9) & 0x83ff));  // |x| in [2^-7, 1)
  }
  CHECK_CUDA(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, host.data(), bytes, cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = timer.median_ms(
      [&] {
        const cublasStatus_t status = cublasGemmEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
            &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (status != CUBLAS_STATUS_SUCCESS) std::exit(1);
      },
      reps);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * double{n} / (ms * 1e-3) / 1e12;
}

struct Row {
  std::string name;
  CaseSpec spec;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe even if the run is cut short
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  Timer timer;
  const double matmul = cublas_tflops(timer, reps);
  std::printf("cuBLAS bf16 matmul 8192^3: %.1f TFLOP/s (median of %d)\n\n", matmul, reps);

  auto llama = [](int batch, int q_len, int kv_len, bool causal, int page) {
    CaseSpec spec;
    spec.op = pagedattn::OpKind::kPrefill;
    spec.num_qo_heads = 32;
    spec.num_kv_heads = 8;
    spec.page_size = page;
    spec.causal = causal;
    spec.kv_lens.assign(batch, kv_len);
    spec.q_lens.assign(batch, q_len);
    spec.spare_pages = 0;
    return spec;
  };
  const std::vector<Row> rows = {
      {"1 x 8192 causal P16", llama(1, 8192, 8192, true, 16)},
      {"1 x 8192 causal P1", llama(1, 8192, 8192, true, 1)},
      {"1 x 32768 causal P16", llama(1, 32768, 32768, true, 16)},
      {"1 x 8192 full P16", llama(1, 8192, 8192, false, 16)},
      {"16 x 512 over 4096 P16", llama(16, 512, 4096, true, 16)},
  };
  pagedattn::cuda::CudaWorkspace workspace{pagedattn::WorkspaceLimits{}};
  std::printf("%-26s %9s %9s %9s %9s %10s\n", "prefill (32/8 heads, D128)", "ms", "TFLOP/s",
              "mma ms", "TFLOP/s", "of matmul");
  for (const Row& row : rows) {
    const AttentionCase c(row.spec, 42);
    std::vector<void*> owned;
    const pagedattn::PrefillArgs host = c.prefill_args();
    pagedattn::PrefillArgs args = host;
    args.q = to_device(host.q, owned);
    args.kv.k = to_device(host.kv.k, owned);
    args.kv.v = to_device(host.kv.v, owned);
    args.meta.qo_indptr = to_device(host.meta.qo_indptr, owned);
    args.meta.kv_indptr = to_device(host.meta.kv_indptr, owned);
    args.meta.kv_indices = to_device(host.meta.kv_indices, owned);
    args.meta.kv_last_page_len = to_device(host.meta.kv_last_page_len, owned);
    args.out = to_device(host.out, owned);
    args.lse = to_device(host.lse, owned);
    // The default kernel (wgmma on Hopper), then the mma.sync kernel.
    unsetenv("PAGEDATTN_PREFILL_KERNEL");
    const double ms = timer.median_ms([&] { pagedattn::cuda::run_prefill(workspace, args); }, reps);
    setenv("PAGEDATTN_PREFILL_KERNEL", "mma", 1);
    const double mma_ms =
        timer.median_ms([&] { pagedattn::cuda::run_prefill(workspace, args); }, reps);
    unsetenv("PAGEDATTN_PREFILL_KERNEL");
    const double tflops = c.flops() / (ms * 1e-3) / 1e12;
    const double mma_tflops = c.flops() / (mma_ms * 1e-3) / 1e12;
    std::printf("%-26s %9.3f %9.1f %9.3f %9.1f %9.1f%%\n", row.name.c_str(), ms, tflops, mma_ms,
                mma_tflops, 100.0 * tflops / matmul);
    for (void* p : owned) CHECK_CUDA(cudaFree(p));
  }
  return 0;
}
