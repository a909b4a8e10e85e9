// PA_CUDA_CHECK(call): every CUDA runtime call in the backend goes through it; a failure throws
// pagedattn::Error naming the call, the file:line and CUDA's error string. check_launch(name)
// after each kernel launch turns a launch failure (bad configuration, too much shared memory)
// into the same kind of error. Host code only; usable from .cu and .cpp files.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "pagedattn/error.h"

namespace pagedattn::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                   int line);

// Throws if the last launch on this thread failed to start.
void check_launch(const char* kernel_name);

}  // namespace pagedattn::cuda

#define PA_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    const cudaError_t pa_cuda_status_ = (call);                                        \
    if (pa_cuda_status_ != cudaSuccess) [[unlikely]] {                                 \
      ::pagedattn::cuda::throw_cuda_error(pa_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
