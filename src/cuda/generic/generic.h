// The "cuda_generic" backend: attention on CUDA cores for any shape the tuned kernels of the
// "cuda" backend do not cover (head dims other than 64 / 128 / 256, MLA widths other than
// 512 + 64, f32 q or KV). The registry lists it after "cuda", so `auto` takes the tuned kernels
// where they apply and this one elsewhere; naming it explicitly runs it everywhere (tests compare
// the two). Host-side entry points only: no CUDA types here.
//
// One kernel serves decode, prefill / extend and MLA (generic_kernel.cu): one thread block per
// (query row, query head) walks the row's request's KV in tiles of 128 keys, with the online
// softmax in f32. Keys are the concatenation of one or two cache slices (K; or MLA's ckv | kpe),
// values one slice (V; or ckv). Slow by design (every block reads its request's whole KV), and
// meant for small models, tests and odd shapes, never for the figures in bench/RESULTS.md.
#pragma once

#include <memory>

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

std::unique_ptr<Backend> make_generic_backend();

}  // namespace pagedattn::cuda
