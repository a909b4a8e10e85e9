// The throughput benchmark's ceilings on a GPU (CUDA builds): a streaming read of device memory
// and a cuBLAS bf16 GEMM (f32 accumulation), measured in the same command as the run, the
// roofline's two rates on the device the model runs on (tools/bench/cuda/bench_cuda_util.h).
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/tensor.h"

namespace pagedattn::tools {

struct DeviceCeilings {
  std::string device_name;
  double read_gbs = 0;
  double matmul_tflops = 0;
  int64_t read_bytes = 0;
  int32_t matmul_size = 0;
};

// Measures both on `device` (cuda:N). Throws Error in a build without CUDA.
DeviceCeilings measure_device_ceilings(Device device);
std::string describe_device_ceilings(const DeviceCeilings& ceilings);

// Whether the library's kernels run with programmatic dependent launch on `device`
// (src/cuda/launch.h; PAGEDATTN_CUDA_PDL=0 turns it off), so that a result says which mode it
// measured. `words`: "PDL on", "PDL off: PAGEDATTN_CUDA_PDL=0", "PDL off: compute capability
// below 9.0"; empty on the CPU.
struct PdlMode {
  bool on = false;
  std::string words;
};
PdlMode pdl_mode(Device device);

}  // namespace pagedattn::tools
