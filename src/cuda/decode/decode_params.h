// The decode kernels' parameters: one plain struct passed by value, built by the launcher
// (decode.cu) from DecodeArgs and the workspace's partition. Strides are in elements.
#pragma once

#include <cstdint>

#include "cuda/common/guard.h"
#include "cuda/workspace.h"
#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

struct DecodeParams {
  // q [B, Hq, D]; out [B, Hq, D] (q's dtype); lse [B, Hq] f32 or null.
  const void* q;
  int64_t q_stride_batch, q_stride_head;
  void* out;
  int64_t out_stride_batch, out_stride_head;
  float* lse;
  int64_t lse_stride_batch, lse_stride_head;
  // K and V caches: element (alloc page a, token t within it, KV head h, dim d) lives at
  // a * stride_page + t * stride_token + h * stride_head + d (covers NHD and HND).
  const void* k;
  const void* v;
  int64_t k_stride_page, k_stride_token, k_stride_head;
  int64_t v_stride_page, v_stride_token, v_stride_head;
  int32_t page_size;        // attention page size P
  int32_t pages_per_alloc;  // r = alloc_page_size / P
  // CSR metadata (device, int32).
  const int32_t* kv_indptr;         // [B + 1]
  const int32_t* kv_indices;        // attention-page ids
  const int32_t* kv_last_page_len;  // [B]
  int32_t batch;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t group;        // Hq / Hkv
  int32_t group_tiles;  // ceil(group / kMaxGroupPerCta): CTAs per KV head
  float q_scale;        // sm_scale * k_scale, times log2(e) when there is no soft-cap
  float soft_cap;       // > 0: logits = cap * tanh(logits / cap)
  float soft_cap_log2;  // soft_cap * log2(e)
  float v_scale;
  int32_t window_left;  // >= 0: keys at positions >= kv_len - 1 - window_left
  PartitionView partition;
  float* partial_out;  // [items, Hq, D]
  float* partial_lse;  // [items, Hq]
  // Tensor-core kernel: [B * Hkv * group_tiles] arrival counters, zero on entry and on exit; the
  // last CTA of a split (request, head tile) merges its partials (no merge kernel).
  int32_t* merge_counters;
  // The metadata taken on trust is checked against these (common/guard.h).
  MetadataGuard guard;
  // Tensor-core kernel: read the partition, kv_indptr, kv_last_page_len and kv_indices before
  // pdl_wait(). Safe when the kernel just before this one in the stream did not write them:
  // every kernel of this library calls pdl_trigger() only after its own pdl_wait(), so when this
  // kernel starts, everything before its predecessor has completed and is visible (in L2, hence
  // the ld.cg loads); a kernel that never calls pdl_trigger() lets this one start only when it
  // ends. The launcher sets it for every run_decode after the first since the workspace's last
  // plan() (whose partition kernel may be the predecessor of that first run). A caller's own
  // kernel that writes the metadata must not trigger its dependents early (the API's contract,
  // include/pagedattn/backend.h).
  bool early_metadata;
  // Tensor-core kernel, with early_metadata: ask the L2 for the first steps' K / V rows before
  // pdl_wait() (DecodeKvPrefetch; PAGEDATTN_DECODE_KV_PREFETCH, ARCHITECTURE.md "Switches").
  int32_t kv_prefetch;
  // Tensor-core kernel: how the last item of a split request reads the partials it merges
  // (DecodeMergeRead; PAGEDATTN_DECODE_MERGE_READ, ARCHITECTURE.md "Switches").
  int32_t merge_read;
  // Diagnostic (DecodeTrace, include/pagedattn/cuda_graph.h): null, or this launch's stamp rows,
  // kDecodeTraceWords a CTA (blockIdx.x), written by thread 0 of each CTA.
  unsigned long long* trace;
};

// DecodeParams::kv_prefetch. A prefetch reads nothing into the kernel and the L2 is the device's
// point of coherence, so it may come before the wait even for the newest rows, which the previous
// kernel may still be writing (common/pdl.cuh): the rows only stream in from memory while that
// kernel drains. kLines: a prefetch.global.L2 per 128-byte line of each row, issued by the load
// units; kBulk: a cp.async.bulk.prefetch per row, each an operation of the SM's copy engine.
enum DecodeKvPrefetch : int32_t { kKvPrefetchNone = 0, kKvPrefetchLines = 1, kKvPrefetchBulk = 2 };

// DecodeParams::merge_read. kLoads: each thread loads its float4 of every item's partial from the
// L2 (ld.cg), a batch of 16 items at once. kBulk: thread 0 has the SM's copy engine stage every
// item's partial rows of the head tile in shared memory (one bulk copy an item, on an mbarrier)
// where they fit in the free rings, sm_90+; the threads read them from there (loads otherwise).
enum DecodeMergeRead : int32_t { kMergeReadLoads = 0, kMergeReadBulk = 1 };

// The phases a CTA stamps, in order (DecodeTrace::kPhaseNames names them).
enum DecodeTracePhase : int {
  kTraceStart,
  kTraceMetadata,
  kTracePageIds,
  kTraceWaitDone,
  kTraceQLoaded,
  kTraceFirstKv,
  kTraceLoopDone,
  kTraceCombined,
  kTraceWritten,
  kTraceCounted,
  kTraceMergeRead,
  kTraceEnd,
  kDecodeTracePhases,
};
// A CTA's row of stamps: the phases' global timer (ns), then the SM's cycle counter (clock64) at
// the start and at the end stamps.
inline constexpr int kDecodeTraceWords = kDecodeTracePhases + 2;

// Query heads handled by one CTA (a group larger than this takes several CTAs per KV head).
inline constexpr int kMaxGroupPerCta = kDecodeMaxGroupPerCta;

// Launches the CUDA-core split-KV decode kernel (decode_kernel.cuh) for head dim kHeadDim
// (explicitly instantiated per head dim in decode_d*.cu). QT: __nv_bfloat16 / __half; KVT: the
// fp8 e4m3 cache (the only one it serves).
template <int kHeadDim, class QT, class KVT>
void launch_decode_kernel(const DecodeParams& params, int grid_items, void* stream);

// Launches the tensor-core decode kernel (decode_tc_kernel.cuh) for bf16 / f16 KV with q of the
// same type T (explicitly instantiated per head dim in decode_tc_d*.cu).
template <int kHeadDim, class T>
void launch_decode_tc_kernel(const DecodeParams& params, int grid_items, void* stream);

// The decode kernel for (head_dim, q dtype, KV dtype), then, after the CUDA-core kernel, the merge
// of split requests (decode_launch.cu).
void launch_decode(const DecodeParams& params, int head_dim, DType q_dtype, DType kv_dtype,
                   int grid_items, void* stream);

}  // namespace pagedattn::cuda
