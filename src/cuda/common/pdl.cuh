// Programmatic dependent launch (PDL, compute capability 9.0+), the device side. A kernel launched
// through launch_kernel (cuda/launch.h, where the rule that makes this safe is written) may start
// while the kernel before it in the stream still runs; it must call pdl_wait() as its first
// statement, in every thread, before any global read or write and before any early return, then
// pdl_trigger():
//
//   __global__ void kernel(...) {
//     pdl_wait();     // the previous kernel has completed and its writes are visible
//     pdl_trigger();  // the next kernel's CTAs may be scheduled now (they wait in turn)
//     ...
//   }
//
// Exceptions: prefetch_l2_bulk and prefetch_l2_line (below) may come before pdl_wait(); they read
// nothing. And the tensor-core decode kernel reads its step metadata before it on a step's later
// layers (DecodeParams::early_metadata, decode_params.h): safe because every kernel here triggers
// only after its own wait, so everything before its predecessor is complete when it starts.
//
// Both compile to nothing below sm_90 (and are no-ops when the launch had no PDL attribute).
// Device code only (include from .cu files).
#pragma once

namespace pagedattn::cuda {

// Blocks until every prerequisite grid (the previous kernel of the stream, when this one was
// launched with PDL) has completed and its memory operations are visible to this thread.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream (launched with PDL) be scheduled once every CTA of this grid
// has called it or exited; it changes nothing about what that kernel sees in memory (its
// pdl_wait() still waits for this grid's completion).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The one thing a kernel may do before pdl_wait(): ask the L2 to fetch `bytes` (a multiple of 16)
// from `address` (16-byte aligned), memory the kernel will read after its wait. A prefetch reads
// no value into the kernel, and the L2 is the device's point of coherence, so it cannot make the
// kernel see stale data even if the previous kernel is still writing those bytes; it only lets
// the bytes stream in while the previous kernel drains (e.g. a layer's weights, whose addresses
// are kernel parameters). sm_90+ (cp.async.bulk.prefetch); nothing below.
__device__ __forceinline__ void prefetch_l2_bulk(const void* address, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address), "r"(bytes) : "memory");
#endif
}

// The same for the one L2 line (128 bytes) that holds `address`: a plain load-unit instruction
// (a bulk prefetch is an operation of the SM's copy engine, slower to issue many small ones of).
__device__ __forceinline__ void prefetch_l2_line(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address) : "memory");
}

}  // namespace pagedattn::cuda
