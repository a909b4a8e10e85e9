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

__global__ void slow_rows_copy_kernel(const unsigned char* src_a, unsigned char* dst_a,
                                      const unsigned char* src_b, unsigned char* dst_b,
                                      const int64_t* offsets, int count, int row_bytes,
                                      int64_t nanoseconds) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < static_cast<uint64_t>(nanoseconds)) {
  }
  const int words = row_bytes / 4;
  for (int i = 0; i < count; ++i) {
    const int64_t at = offsets[i];
    for (int w = static_cast<int>(threadIdx.x); w < words; w += kThreads) {
      reinterpret_cast<uint32_t*>(dst_a + at)[w] = reinterpret_cast<const uint32_t*>(src_a + at)[w];
      reinterpret_cast<uint32_t*>(dst_b + at)[w] = reinterpret_cast<const uint32_t*>(src_b + at)[w];
    }
  }
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

void launch_slow_rows_copy(const void* src_a, void* dst_a, const void* src_b, void* dst_b,
                           const int64_t* offsets, int count, int row_bytes, int64_t nanoseconds,
                           cudaStream_t stream) {
  launch_kernel(slow_rows_copy_kernel, 1, kThreads, 0, stream,
                static_cast<const unsigned char*>(src_a), static_cast<unsigned char*>(dst_a),
                static_cast<const unsigned char*>(src_b), static_cast<unsigned char*>(dst_b),
                offsets, count, row_bytes, nanoseconds);
  check_launch("slow_rows_copy_kernel");
}

}  // namespace pagedattn::testing
