// Device versions of store_kv / store_latent (kv_cache.h): write a batch's new K/V (or MLA latent)
// rows into their slots in a cache that lives in CUDA memory, asynchronously on `stream`.
// Same semantics as the host functions: inputs f32/f16/bf16 [num_tokens, num_kv_heads, head_dim]
// (latent: [num_tokens, rank] and [num_tokens, rope]), any strides; slots i32 or i64 [num_tokens],
// slot = page * alloc_page_size + offset, negative = skip; conversion through float, fp8 caches
// store value / scale (saturated).
//
// Shapes, dtypes and devices are checked on the host (Error before anything is enqueued). Slot
// ranges live on the device: with a `status` view (device i32 [>= 4]) a first kernel checks every
// slot and, if one is out of range, records it there and the store writes nothing
// (read_store_status() turns it into an Error); without one, out-of-range slots are skipped.
#pragma once

#include "pagedattn/kv_cache.h"
#include "pagedattn/tensor.h"

namespace pagedattn::cuda {

void store_kv(const PagedKv& cache, const TensorView& k_new, const TensorView& v_new,
              const TensorView& slots, void* stream, const TensorView& status = {});

void store_latent(const PagedLatent& cache, const TensorView& ckv_new, const TensorView& kpe_new,
                  const TensorView& slots, void* stream, const TensorView& status = {});

// Waits for `stream`; throws Error naming the first out-of-range slot recorded in `status`.
void read_store_status(const TensorView& status, void* stream);

}  // namespace pagedattn::cuda
