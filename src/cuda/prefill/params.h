// The prefill kernel's parameters: plain pointers and strides (in elements), filled and validated
// by the host launcher (src/cuda/prefill.cpp), read by the kernel (kernel.cuh). No CUDA types.
#pragma once

#include <cstdint>

#include "cuda/common/guard.h"
#include "pagedattn/dtype.h"

namespace pagedattn::cuda::prefill {

struct PrefillParams {
  // Query rows and outputs.
  const void* q = nullptr;  // [T, Hq, Dqk]
  void* out = nullptr;      // [T, Hq, Dvo]
  float* lse = nullptr;     // [T, Hq], optional (null: not written)
  int64_t q_stride_token = 0, q_stride_head = 0;
  int64_t out_stride_token = 0, out_stride_head = 0;
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  // Paged K/V: element offset of (alloc page a, token slot s in it, kv head h) is
  // a * stride_page + s * stride_token + h * stride_head (NHD or HND alike). Elements of q's dtype,
  // or fp8 e4m3 (the *_fp8 launchers below).
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;

  // Step metadata (device, int32): see planner.h.
  const int32_t* qo_indptr = nullptr;         // [B + 1]
  const int32_t* kv_indptr = nullptr;         // [B + 1]
  const int32_t* kv_indices = nullptr;        // attention-page ids
  const int32_t* kv_last_page_len = nullptr;  // [B]

  int32_t batch_size = 0;
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t group_size = 0;       // Hq / Hkv
  int32_t page_size = 0;        // attention page size P
  int32_t pages_per_alloc = 1;  // alloc_page_size / P

  float sm_scale = 0.0f;         // times K's dequantisation scale (fp8; else 1)
  float logits_soft_cap = 0.0f;  // > 0: cap * tanh(logits / cap)
  int32_t window_left = -1;      // >= 0: keys in [pos - window_left, ...]
  bool causal = true;

  // Host-known bounds for the grid: T = qo rows (q.shape[0]) and the step's max_q_len (0 =
  // unknown).
  int64_t num_qo_rows = 0;
  int32_t max_q_len = 0;
  // meta.num_pages_hint x P: at least the step's KV tokens, all requests together (0 = unknown).
  int64_t kv_tokens_hint = 0;
  int32_t num_tiles_bound = 0;  // set by the launcher: grid = num_tiles_bound * num_kv_heads CTAs
  // The warp-specialized kernel's persistent grid (launch.cuh): [next unit, CTAs done], zero on
  // entry and on exit (its last CTA resets them); null (set by the launcher) for a CTA per unit.
  int32_t* unit_counters = nullptr;
  int32_t num_sms = 1;  // the device's SMs (the workspace's count): the persistent grid's CTAs

  // Split-KV, chosen by the host launcher when the (tile, KV head) grid alone would leave SMs idle
  // (few short query tiles over long KV: chunked prefill, speculative steps). CTA (x, y) then takes
  // only keys [y * kv_chunk_tokens, (y + 1) * kv_chunk_tokens) of its rows' range and writes f32
  // partials, O / l to partial_out [chunk][T][Hq][Dvo] and log2(sum exp2) to partial_lse
  // [chunk][T][Hq] (-inf where the chunk holds no visible key), which prefill_merge_kernel
  // combines into out / lse. num_kv_chunks 1: no split, the kernel writes out / lse itself.
  int32_t num_kv_chunks = 1;
  int32_t kv_chunk_tokens = 0;  // a multiple of kChunkAlign when split
  float* partial_out = nullptr;
  float* partial_lse = nullptr;

  // fp8 e4m3 cache (the *_fp8 launchers): V's dequantisation scale, applied to out in f32 (K's is
  // folded into sm_scale by the launcher). Last, so the other fields keep their offsets.
  float v_scale = 1.0f;

  // The metadata taken on trust is checked against these (common/guard.h; its max_q_len and
  // num_rows repeat the fields above).
  MetadataGuard guard;
};

// Chunk boundaries are multiples of every kernel's key tile, so a chunk start is a tile start.
inline constexpr int kChunkAlign = 128;

// Enqueue the kernel for (head_dim_qk, head_dim_vo) with q, out and K/V in bf16 / f16, or (_fp8)
// q and out in bf16 / f16 over an fp8 e4m3 cache (instantiate_*.cu); `stream` is a cudaStream_t.
// Throw Error for an unsupported head-dim pair or a failed launch.
void launch_prefill_bf16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                         void* stream);
void launch_prefill_f16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                        void* stream);
void launch_prefill_bf16_fp8(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                             void* stream);
void launch_prefill_f16_fp8(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                            void* stream);

// Upper bound on the query tiles of a step (kBlockM rows each, every request rounded up):
// sum_r ceil(q_len_r * g / kBlockM) <= floor(T * g / kBlockM) + B, and <= B * ceil(max_q_len * g
// / kBlockM) when max_q_len is known.
inline int64_t tile_bound(const PrefillParams& p, int block_rows) {
  int64_t tiles = p.num_qo_rows * p.group_size / block_rows + p.batch_size;
  if (p.max_q_len > 0) {
    const int64_t per_request = (int64_t{p.max_q_len} * p.group_size + block_rows - 1) / block_rows;
    if (int64_t{p.batch_size} * per_request < tiles) tiles = int64_t{p.batch_size} * per_request;
  }
  return tiles;
}

}  // namespace pagedattn::cuda::prefill
