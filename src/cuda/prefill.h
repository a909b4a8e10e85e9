// Batch prefill / extend on CUDA: ragged query rows (qo_indptr) attending over each request's paged
// KV (a cached prefix plus the new tokens, already stored), causal aligned to the end of the KV or
// not, with optional soft-cap and sliding window; out + lse. Host-side entry points only: no CUDA
// types here, so the backend class and the registry compile as plain C++.
//
// Kernel (src/cuda/prefill/): FlashAttention-2 style on tensor cores (mma.sync m16n8k16), the
// query heads of one KV group packed into the rows of a tile, K/V tiles gathered page by page.
#pragma once

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

class CudaWorkspace;  // src/cuda/workspace.h

// Whether run_prefill() serves `op` (an OpKind::kPrefill on a CUDA device); if not, why, naming the
// value and the supported ones. Supported: q/kv dtype bf16 or f16 (equal), head_dim_qk/vo
// 64/64, 128/128, 256/256, 192/128, any group size, any page size, NHD or HND, causal or not,
// soft-cap, sliding window.
Support supports_prefill(const OpDesc& op);

// Validates `args` (throws pagedattn::Error naming the argument before any launch) and enqueues the
// kernel on args.stream. Reads qo_indptr / kv_indptr / kv_indices / kv_last_page_len on the device
// only: no host synchronisation, graph-capturable. The workspace is not used today (the kernel
// schedules its tiles itself) and is taken for symmetry with decode.
void run_prefill(CudaWorkspace& workspace, const PrefillArgs& args);

}  // namespace pagedattn::cuda
