// The CUDA backend (Hopper first). Host-side entry points only: no CUDA headers here, so the
// registry and tools compile as plain C++.
#pragma once

#include <memory>

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

std::unique_ptr<Backend> make_backend();

// Whether a CUDA device can be used here; if not, why ("no CUDA device: cudaGetDeviceCount
// failed: CUDA driver version is insufficient ...").
Support device_available();

}  // namespace pagedattn::cuda
