// Batch prefill / extend on CUDA: ragged query rows (qo_indptr) attending over each request's paged
// KV (a cached prefix plus the new tokens, already stored), causal aligned to the end of the KV or
// not, with optional soft-cap and sliding window; out + lse. Host-side entry points only: no CUDA
// types here, so the backend class and the registry compile as plain C++.
//
// Kernels (src/cuda/prefill/): FlashAttention-2 style on tensor cores (wgmma on Hopper, mma.sync
// m16n8k16 elsewhere), the query heads of one KV group packed into the rows of a tile, K/V tiles
// gathered page by page (an fp8 cache's widened to q's dtype in shared memory); split-KV with a
// merge when the grid alone would leave SMs idle.
#pragma once

#include <cstdint>

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

class CudaWorkspace;  // src/cuda/workspace.h

// Whether run_prefill() serves `op` (an OpKind::kPrefill on a CUDA device); if not, why, naming the
// value and the supported ones. Supported: q dtype bf16 or f16 over a cache of q's dtype or fp8
// e4m3 (with its k_scale / v_scale: logits = sm_scale * k_scale * q.k, out scaled by v_scale; out
// in q's dtype), head_dim_qk/vo 64/64, 128/128, 256/256, 192/128, any group size, any page size,
// NHD or HND, causal or not, soft-cap, sliding window.
Support supports_prefill(const OpDesc& op);

// Validates `args` (throws pagedattn::Error naming the argument before any launch) and enqueues the
// kernel on args.stream. Reads qo_indptr / kv_indptr / kv_indices / kv_last_page_len on the device
// only: no host synchronisation, graph-capturable. The kernel schedules its tiles itself; the
// workspace holds the f32 partials when the KV is split (a few short query tiles over long KV,
// decided from meta.max_q_len and meta.num_pages_hint; without both hints, no split).
void run_prefill(CudaWorkspace& workspace, const PrefillArgs& args);

// The number of KV chunks run_prefill() would split these (valid) arguments into: 1 = no split.
int32_t prefill_kv_chunks(const CudaWorkspace& workspace, const PrefillArgs& args);

}  // namespace pagedattn::cuda
