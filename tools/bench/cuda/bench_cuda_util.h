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

// How median_device_ns flushes the L2 before a sample (when asked to): kClean reads a 256 MiB
// buffer (the L2 ends holding clean lines, as after a kernel that only read), kDirty writes it
// (the L2 ends full of dirty lines, which the timed work then writes back to DRAM: up to the
// L2's size of extra traffic), kOff skips the flush. Process-wide; default kClean.
enum class L2Flush { kClean, kDirty, kOff };
void set_l2_flush(L2Flush mode);
L2Flush l2_flush();
const char* l2_flush_name(L2Flush mode);
L2Flush parse_l2_flush(const std::string& name);  // "clean" | "dirty" | "off"; else throws

// Times `launch` (enqueues device work on `stream`) with CUDA events: `warmup` untimed runs, then
// `reps` samples, each after an L2 flush (when flush_l2; see L2Flush). Median in ns.
double median_device_ns(const std::function<void()>& launch, int32_t warmup, int32_t reps,
                        bool flush_l2, void* stream);

}  // namespace pagedattn::tools
