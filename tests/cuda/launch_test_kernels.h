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

}  // namespace pagedattn::testing
