// The CPU backend: pagedattn's default on every machine and the oracle the GPU backends are
// checked against. Threads (OpenMP) across (request, KV head, KV chunk) work items with a
// split-then-merge for long KV; SIMD through the compiler with runtime dispatch.
#pragma once

#include <memory>

#include "pagedattn/backend.h"

namespace pagedattn::cpu {

std::unique_ptr<Backend> make_backend();

}  // namespace pagedattn::cpu
