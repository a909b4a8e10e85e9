// The launch_kernel tests' kernels (launch_test_kernels.h): one CTA of 32 threads each, launched
// through cuda/launch.h with pdl_wait() as their first statement.
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/launch_test_kernels.h"

namespace pagedattn::testing {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::launch_kernel;
using ::pagedattn::cuda::pdl_trigger;
using ::pagedattn::cuda::pdl_wait;

constexpr int kThreads = 32;

__device__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void slow_write_kernel(int32_t* slot, int32_t value, int64_t nanoseconds) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  if (threadIdx.x != 0) return;
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < static_cast<uint64_t>(nanoseconds)) {
  }
  *slot = value;
}

__global__ void idle_kernel() {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
}

__global__ void copy_kernel(const int32_t* slot, int32_t* out) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  if (threadIdx.x == 0) *out = *slot;
}

}  // namespace

void launch_slow_write(int32_t* slot, int32_t value, int64_t nanoseconds, cudaStream_t stream) {
  launch_kernel(slow_write_kernel, 1, kThreads, 0, stream, slot, value, nanoseconds);
  check_launch("slow_write_kernel");
}

void launch_idle(cudaStream_t stream) {
  launch_kernel(idle_kernel, 1, kThreads, 0, stream);
  check_launch("idle_kernel");
}

void launch_copy(const int32_t* slot, int32_t* out, cudaStream_t stream) {
  launch_kernel(copy_kernel, 1, kThreads, 0, stream, slot, out);
  check_launch("copy_kernel");
}

}  // namespace pagedattn::testing
