// When launch_kernel (launch.h) adds the programmatic-dependent-launch attribute: the process's
// switch (PAGEDATTN_CUDA_PDL, read once) and each device's compute capability (asked once per
// device, kept in a small table of atomics: launches come from any thread).
#include "cuda/launch.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pagedattn::cuda {
namespace {

// Devices whose answer is cached; a device past this (none today) is asked at each launch.
constexpr int kCachedDevices = 64;
// Per device: 0 not asked yet, 1 no PDL, 2 PDL.
std::atomic<int8_t> device_pdl[kCachedDevices];

// 1 or 2 as above, or 0 where the query failed (not cached: asked again at the next launch).
int8_t ask_device(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();  // a failed query leaves nothing behind; the launch then reports its own
    return 0;
  }
  return major >= 9 ? 2 : 1;
}

}  // namespace

bool pdl_enabled() {
  // PAGEDATTN_CUDA_PDL=0 (ARCHITECTURE.md, "Switches"): read once per process.
  static const bool enabled = [] {
    const char* env = std::getenv("PAGEDATTN_CUDA_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled;
}

bool pdl_supported(int device) {
  if (device < 0 || device >= kCachedDevices) return ask_device(device) == 2;
  int8_t known = device_pdl[device].load(std::memory_order_relaxed);
  if (known == 0) {
    known = ask_device(device);  // racing threads store the same answer
    if (known != 0) device_pdl[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

bool hopper_code(const void* kernel) {
  cudaFuncAttributes attributes{};
  int device = 0, major = 0;
  const bool available =
      cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.binaryVersion >= 90 &&
      cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major == 9;
  cudaGetLastError();  // a failed query leaves nothing behind
  return available;
}

bool pdl_for_current_device() {
  if (!pdl_enabled()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // as above: the launch that follows fails and reports it
    return false;
  }
  return pdl_supported(device);
}

}  // namespace pagedattn::cuda
