// Timing helpers of the CUDA benchmarks (see bench_cuda_util.h).
#include "tools/bench/cuda/bench_cuda_util.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/workspace.h"

namespace pagedattn::tools {
namespace {

constexpr size_t kFlushBytes = size_t{256} << 20;  // > 4x the H200's 60 MB L2

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    PA_CUDA_CHECK(cudaEventCreate(&start));
    PA_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void check_cublas(cublasStatus_t status, const char* what) {
  PA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS {} failed: status {}", what,
           static_cast<int>(status));
}

L2Flush g_l2_flush = L2Flush::kClean;

}  // namespace

void set_l2_flush(L2Flush mode) { g_l2_flush = mode; }
L2Flush l2_flush() { return g_l2_flush; }

const char* l2_flush_name(L2Flush mode) {
  switch (mode) {
    case L2Flush::kClean:
      return "clean";
    case L2Flush::kDirty:
      return "dirty";
    case L2Flush::kOff:
      return "off";
  }
  return "?";
}

L2Flush parse_l2_flush(const std::string& name) {
  for (L2Flush mode : {L2Flush::kClean, L2Flush::kDirty, L2Flush::kOff}) {
    if (name == l2_flush_name(mode)) return mode;
  }
  throw_error(fmt::format("--l2-flush '{}': expected clean, dirty or off", name));
}

double median_device_ns(const std::function<void()>& launch, int32_t warmup, int32_t reps,
                        bool flush_l2, void* stream) {
  static cuda::DeviceBuffer flush = [] {
    cuda::DeviceBuffer buffer(kFlushBytes);
    PA_CUDA_CHECK(cudaMemset(buffer.data(), 0, kFlushBytes));  // defined bytes for the reads
    return buffer;
  }();
  static cuda::DeviceBuffer sink(16);
  auto s = static_cast<cudaStream_t>(stream);
  Events events;
  for (int32_t i = 0; i < warmup; ++i) launch();
  std::vector<double> samples;
  for (int32_t i = 0; i < std::max(1, reps); ++i) {
    if (flush_l2 && g_l2_flush == L2Flush::kDirty) {
      PA_CUDA_CHECK(cudaMemsetAsync(flush.data(), i & 0xff, kFlushBytes, s));
    } else if (flush_l2 && g_l2_flush == L2Flush::kClean) {
      cuda::stream_read(flush.data(), kFlushBytes, sink.data(), stream);
    }
    PA_CUDA_CHECK(cudaEventRecord(events.start, s));
    launch();
    PA_CUDA_CHECK(cudaEventRecord(events.stop, s));
    PA_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0;
    PA_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    samples.push_back(ms * 1e6);
  }
  return median(samples);
}

CudaCeilings measure_cuda_ceilings(int64_t bytes, int32_t matmul_size, void* stream) {
  CudaCeilings c;
  int device = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  PA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  c.device_name = prop.name;
  c.num_sms = prop.multiProcessorCount;
  auto s = static_cast<cudaStream_t>(stream);
  {
    cuda::DeviceBuffer src(static_cast<size_t>(bytes)), dst(static_cast<size_t>(bytes));
    cuda::DeviceBuffer sink(16);
    cuda::fill_uniform_device(
        TensorView::contiguous(src.data(), DType::kF32, {bytes / 4}, Device::cuda(device)), 7, -1,
        1, stream);
    const double copy_ns = median_device_ns(
        [&] {
          PA_CUDA_CHECK(
              cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
        },
        2, 10, false, stream);
    c.copy_bytes = 2 * bytes;
    c.copy_gbs = 2.0 * bytes / copy_ns;
    const double read_ns = median_device_ns(
        [&] { cuda::stream_read(src.data(), bytes, sink.data(), stream); }, 2, 10, false, stream);
    c.read_bytes = bytes;
    c.read_gbs = bytes / read_ns;
  }
  if (matmul_size > 0) {
    const int64_t n = matmul_size;
    cuda::DeviceBuffer a(n * n * 2), b(n * n * 2), out(n * n * 2);
    for (auto* buffer : {&a, &b}) {
      cuda::fill_uniform_device(
          TensorView::contiguous(buffer->data(), DType::kBF16, {n * n}, Device::cuda(device)), 11,
          -1, 1, stream);
    }
    cublasHandle_t handle = nullptr;
    check_cublas(cublasCreate(&handle), "create");
    check_cublas(cublasSetStream(handle, s), "set stream");
    const float alpha = 1.0f, beta = 0.0f;
    const int m = static_cast<int>(n);
    const double ns = median_device_ns(
        [&] {
          check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a.data(),
                                    CUDA_R_16BF, m, b.data(), CUDA_R_16BF, m, &beta, out.data(),
                                    CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "gemm");
        },
        3, 10, false, stream);
    cublasDestroy(handle);
    c.matmul_size = matmul_size;
    c.matmul_tflops = 2.0 * n * n * n / ns / 1e3;
  }
  return c;
}

}  // namespace pagedattn::tools
