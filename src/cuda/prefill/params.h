// The prefill kernel's parameters: plain pointers and strides (in elements), filled and validated
// by the host launcher (src/cuda/prefill.cpp), read by the kernel (kernel.cuh). No CUDA types.
#pragma once

#include <cstdint>

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
  // a * stride_page + s * stride_token + h * stride_head (NHD or HND alike).
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

  float sm_scale = 0.0f;
  float logits_soft_cap = 0.0f;  // > 0: cap * tanh(logits / cap)
  int32_t window_left = -1;      // >= 0: keys in [pos - window_left, ...]
  bool causal = true;

  int32_t num_tiles_bound = 0;  // grid = num_tiles_bound * num_kv_heads CTAs
};

// Enqueue the kernel for (head_dim_qk, head_dim_vo) in bf16 / f16 (instantiate_*.cu); `stream` is a
// cudaStream_t. Throw Error for an unsupported head-dim pair or a failed launch.
void launch_prefill_bf16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                         void* stream);
void launch_prefill_f16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                        void* stream);

// Query rows (token x query head pairs) per CTA for a value head dim (TileConfig::kBlockM): the
// host bounds the grid with it.
inline int block_rows(int head_dim_vo) { return head_dim_vo <= 128 ? 128 : 64; }

}  // namespace pagedattn::cuda::prefill
