// Kernels of the launch_kernel tests (launch_test.cpp), launched through cuda/launch.h and
// following its rule (pdl_wait() first): a slow writer, a kernel that touches nothing, a copy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagedattn::testing {

// Spins `nanoseconds` on the device's global timer, then writes `value` to *slot: a kernel still
// running when the kernels after it may already have started.
void launch_slow_write(int32_t* slot, int32_t value, int64_t nanoseconds, cudaStream_t stream);

// Waits and triggers, and touches no memory: the kernel between a writer and its reader.
void launch_idle(cudaStream_t stream);

// *out = *slot.
void launch_copy(const int32_t* slot, int32_t* out, cudaStream_t stream);

// Spins `nanoseconds`, then copies rows of `row_bytes` (a multiple of 4) from src_a to dst_a and
// from src_b to dst_b at each of the `count` byte offsets: a store of a step's new K / V rows that
// lets the kernels after it start at once, as the library's own store does.
void launch_slow_rows_copy(const void* src_a, void* dst_a, const void* src_b, void* dst_b,
                           const int64_t* offsets, int count, int row_bytes, int64_t nanoseconds,
                           cudaStream_t stream);

}  // namespace pagedattn::testing
