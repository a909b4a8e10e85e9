// Timing helpers of the CUDA benchmarks (CUDA builds only): the median of event-timed device
// work with the L2 flushed before each sample, and the device's ceilings measured in the same run
// (a large device-to-device copy, a streaming read, a cuBLAS bf16 matmul).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace pagedattn::tools {

struct CudaCeilings {
  std::string device_name;
  int32_t num_sms = 0;
  double copy_gbs = 0;       // cudaMemcpy device -> device, (read + write) bytes / time
  double read_gbs = 0;       // streaming 16-byte read, bytes / time
  double matmul_tflops = 0;  // cuBLAS bf16 GEMM, f32 accumulate, m = n = k = matmul_size
  int64_t copy_bytes = 0;
  int64_t read_bytes = 0;
  int32_t matmul_size = 0;
};

// Measures the ceilings (bytes: size of the copy / read buffers; matmul_size 0 skips the GEMM).
CudaCeilings measure_cuda_ceilings(int64_t bytes, int32_t matmul_size, void* stream);

// Times `launch` (enqueues device work on `stream`) with CUDA events: `warmup` untimed runs, then
// `reps` samples, each after a 256 MiB memset that flushes the L2 (when flush_l2). Median in ns.
double median_device_ns(const std::function<void()>& launch, int32_t warmup, int32_t reps,
                        bool flush_l2, void* stream);

}  // namespace pagedattn::tools
