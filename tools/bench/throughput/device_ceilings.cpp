// The GPU ceilings of the throughput benchmark (device_ceilings.h), over the CUDA benchmarks'
// measurement (the same read kernel and GEMM as `pagedattn bench decode|mla --device cuda`).
#include "tools/bench/throughput/device_ceilings.h"

#include <fmt/format.h>

#include "pagedattn/error.h"

#ifdef PAGEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "tools/bench/cuda/bench_cuda_util.h"
#endif

namespace pagedattn::tools {

DeviceCeilings measure_device_ceilings(Device device) {
#ifdef PAGEDATTN_WITH_CUDA
  PA_CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // 1 GiB read (far past the L2), an 8192-cube bf16 GEMM: each device's best case.
  CudaCeilings measured;
  try {
    measured = measure_cuda_ceilings(int64_t{1} << 30, 8192, stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  PA_CUDA_CHECK(cudaStreamDestroy(stream));
  DeviceCeilings c;
  c.device_name = fmt::format("{} ({})", measured.device_name, device.str());
  c.read_gbs = measured.read_gbs;
  c.matmul_tflops = measured.matmul_tflops;
  c.read_bytes = measured.read_bytes;
  c.matmul_size = measured.matmul_size;
  return c;
#else
  throw Error(
      fmt::format("bench throughput: device {} needs pagedattn built with CUDA", device.str()));
#endif
}

std::string describe_device_ceilings(const DeviceCeilings& c) {
  return fmt::format(
      "{}: streaming read {:.1f} GB/s ({} MiB, median), GEMM {:.1f} TFLOP/s (cuBLAS bf16, f32 "
      "accumulate, {} cube, median)",
      c.device_name, c.read_gbs, c.read_bytes >> 20, c.matmul_tflops, c.matmul_size);
}

PdlMode pdl_mode(Device device) {
  if (device.type != DeviceType::kCUDA) return {};
#ifdef PAGEDATTN_WITH_CUDA
  if (!cuda::pdl_enabled()) return {false, "PDL off: PAGEDATTN_CUDA_PDL=0"};
  if (!cuda::pdl_supported(device.index)) return {false, "PDL off: compute capability below 9.0"};
  return {true, "PDL on"};
#else
  return {};
#endif
}

}  // namespace pagedattn::tools
