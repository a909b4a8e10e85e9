// launch_kernel: how the library launches the kernels of a model step (the model's kernels, the
// store, the GPU planner, decode, MLA, prefill): with programmatic dependent launch (PDL) where
// the device has compute capability 9.0 or later, a plain launch elsewhere or with
// PAGEDATTN_CUDA_PDL=0 (ARCHITECTURE.md, "Switches").
//
// Why: a small decode step is ~10 kernels per layer of a few microseconds each, so the gap at each
// kernel boundary (the launch, the last CTAs draining, the next grid's ramp) is a large part of
// the step. Under PDL the next kernel's CTAs are scheduled while the previous kernel drains, and
// each waits on the device (griddepcontrol.wait) instead of in the launch queue.
//
// THE RULE, for every kernel launched through launch_kernel: its FIRST statement, in every CTA
// (every thread), is pdl_wait() (cuda/common/pdl.cuh), before any global read or write and before
// any early return (`if (row >= rows) return;` comes after it); then pdl_trigger(). The one thing
// allowed before it is an L2 prefetch of memory the kernel reads later (prefetch_l2_bulk): it
// reads no value, so it cannot break what follows (the GEMV prefetches its weights that way).
//
// Why that is safe. A PDL kernel may start before its predecessor in the stream has finished, but
// pdl_wait() returns only once the predecessor has completed and its writes are visible, and the
// kernel touches memory only after that. Completion is then transitive: kernel C after B after A
// all wait, so C's wait returning means B completed, and B could only complete after its own wait
// returned, i.e. after A completed; a kernel may read what any earlier kernel wrote, not just its
// predecessor. A kernel that could exit (or write) before its wait would break that chain: B
// finished early, C starts reading while A still writes. Hence "first statement, every CTA".
// Kernels launched elsewhere (cuBLAS, the generic backend, tests' fill kernels) launch without the
// attribute and serialize fully behind whatever precedes them; a PDL kernel after one of them is
// still correct because it waits. Copies and memsets stay in stream order as ever: the attribute
// relaxes only a kernel-after-kernel dependency, and the wait covers whatever came before.
//
// Inside stream capture (the model's decode steps are captured into CUDA graphs) the attribute
// becomes a programmatic edge between the two kernel nodes (CUDA 12.3+), so graph replays keep
// the overlap; after a node that is not a kernel the edge is an ordinary one.
//
// Which device: a kernel is launched on the current device (the runtime refuses a stream of
// another device), so the capability is that of cudaGetDevice's device (a thread-local read, no
// device query), looked up once per device and cached. Host code; launch_kernel is called from
// .cu files (where the kernels are), the switch's functions from anywhere (the benchmarks print
// the mode). No fmt here (nvcc host passes cannot compile it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "pagedattn/error.h"

namespace pagedattn::cuda {

// PAGEDATTN_CUDA_PDL=0 turns PDL off for the process (read once, on first use): for before / after
// measurements in one run. Any other value, or none, leaves it on.
bool pdl_enabled();

// Whether `device` has compute capability 9.0 or later (asked once per device, then cached).
bool pdl_supported(int device);

// Whether a launch on the current device gets the PDL attribute: pdl_enabled() and
// pdl_supported(current device).
bool pdl_for_current_device();

// Whether `kernel` (a __global__ function's address) has code of sm_90 or later in this binary and
// the current device has compute capability 9.x: where the Hopper (wgmma) kernels can run. A
// failed query is cleared from the thread's CUDA error state. Callers cache the answer (it is
// fixed for the process on one device).
bool hopper_code(const void* kernel);

namespace detail {

// At most this many attributes of the caller's own in a launch_kernel(config, ...) call.
inline constexpr unsigned kMaxCallerAttributes = 3;

// Launches `kernel` with `config` plus, where pdl_for_current_device(), the PDL attribute.
// A failure is left as the thread's last CUDA error, as after <<<...>>>: the caller's
// check_launch(name) reports it.
template <class... Params, class... Args>
void launch_with_pdl(cudaLaunchConfig_t config, void (*kernel)(Params...), Args&&... args) {
  if (config.numAttrs > kMaxCallerAttributes) {
    throw_error("launch_kernel: " + std::to_string(config.numAttrs) +
                " launch attributes (expected at most " + std::to_string(kMaxCallerAttributes) +
                ")");
  }
  cudaLaunchAttribute attributes[kMaxCallerAttributes + 1];
  unsigned count = 0;
  for (unsigned i = 0; i < config.numAttrs; ++i) attributes[count++] = config.attrs[i];
  if (pdl_for_current_device()) {
    attributes[count] = cudaLaunchAttribute{};
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  // The runtime records a failed launch as the thread's last error (checked by check_launch).
  static_cast<void>(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace detail

// kernel<<<grid, block, smem_bytes, stream>>>(args...), with PDL where it applies (see above).
// The kernel must follow THE RULE (pdl_wait() first). Follow with check_launch(name).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  detail::launch_with_pdl(config, kernel, std::forward<Args>(args)...);
}

// The same for a configuration with attributes of its own (e.g. a cluster dimension; at most
// detail::kMaxCallerAttributes of them): they are kept and the PDL attribute is added.
template <class... Params, class... Args>
void launch_kernel(const cudaLaunchConfig_t& config, void (*kernel)(Params...), Args&&... args) {
  detail::launch_with_pdl(config, kernel, std::forward<Args>(args)...);
}

}  // namespace pagedattn::cuda
