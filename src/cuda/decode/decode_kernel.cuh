// The split-KV paged decode kernel on CUDA cores (one query row per request): serves fp8 e4m3 KV
// (converted while it is read); KV of q's dtype takes the tensor-core kernel
// (decode_tc_kernel.cuh).
//
// Grid: (work item, KV head x group tile). A CTA of 128 threads takes one work item (a chunk of
// one request's KV, from the split-KV partition) for one KV head and up to 16 of its query heads,
// so each K/V byte of the chunk is read from memory once for the whole group.
//
// Per tile of kTile tokens:
//   load   cp.async, 16 bytes per thread, kStages tiles in flight. Each thread finds the address of
//          its tokens through kv_indices itself (attention page p -> allocation page p / r, token
//          (p % r) * P + offset): any page size P, NHD or HND through the strides. Out-of-range
//          tokens are zero-filled. Shared rows are XOR-swizzled by 16-byte chunk so that the
//          reads below are free of bank conflicts.
//   QK     kThreadsPerToken threads per token, each a slice of the head dim, all heads of the CTA;
//          q sits in shared memory as f32, pre-scaled (sm_scale * k_scale, log2 e).
//   soft   one warp per head: running max / sum in the log2 domain (online softmax).
//   PV     threads = (16-byte chunk of the head dim) x lanes; lanes split the heads and, when there
//          are fewer heads than lanes, the tile's tokens (reduced across lanes at the end).
// Output: a request served by one item writes out / lse directly; a split request writes f32
// partials that the merge kernel combines. A CTA that sees no key writes 0 and -inf.
// Metadata on trust (common/guard.h): a request with bad KV metadata gets no keys (decode_work);
// a page id outside the pool is zero-filled instead of read and the CTA writes 0 / -inf (a split
// item poisons its partial lse; the merge kernel then writes 0 / -inf for the row).
//
// Launched with programmatic dependent launch (cuda/launch.h): pdl_wait() is the kernel's first
// statement, before the partition is read and before a CTA past the item count returns.
#pragma once

#include <cmath>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/guard.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_work.cuh"
#include "cuda/launch.h"

namespace pagedattn::cuda {

template <int kHeadDim, class KVT>
struct DecodeConfig {
  static constexpr int kThreads = 128;
  static constexpr int kVec = kVecElems<KVT>;              // KV elements per 16-byte chunk
  static constexpr int kChunksPerRow = kHeadDim / kVec;    // chunks per token row
  static constexpr int kTile = kHeadDim <= 128 ? 64 : 32;  // tokens per tile
  static constexpr int kStages = kHeadDim <= 128 ? 3 : 2;  // 2 CTAs per SM either way
  static constexpr int kThreadsPerToken = kThreads / kTile;
  static constexpr int kChunksPerThread = kChunksPerRow / kThreadsPerToken;
  static constexpr int kSwizzleMask = (kChunksPerRow < 8 ? kChunksPerRow : 8) - 1;
  static constexpr int kLanes = kThreads / kChunksPerRow;  // PV lanes per head-dim chunk
  static constexpr int kMaxHeadsPerLane = (kMaxGroupPerCta + kLanes - 1) / kLanes;
  static constexpr int kLoadIters = kTile * kChunksPerRow / kThreads;
  static constexpr int kStageChunks = kTile * kChunksPerRow;  // uint4 per stage, K or V

  static constexpr size_t kSmemBytes =
      2 * size_t{kStages} * kStageChunks * 16 +
      sizeof(float) * (kMaxGroupPerCta * kHeadDim + kMaxGroupPerCta * kTile + 3 * kMaxGroupPerCta);
  static_assert(kChunksPerRow % kThreadsPerToken == 0);
  static_assert(kThreads % kChunksPerRow == 0);
  static_assert(kTile * kChunksPerRow % kThreads == 0);
  static_assert(kThreads % kTile == 0 && kTile <= 64);
  // The final cross-lane reduction reuses the K stages.
  static_assert(size_t{kLanes} * kHeadDim * sizeof(float) <= size_t{kStages} * kStageChunks * 16);

  __device__ static int swizzle(int token, int chunk) {
    return chunk ^ ((token * kThreadsPerToken) & kSwizzleMask);
  }
};

template <int kHeadDim, class QT, class KVT>
__global__ void __launch_bounds__(128) decode_kernel(const DecodeParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  using C = DecodeConfig<kHeadDim, KVT>;
  constexpr int kVec = C::kVec;
  constexpr int kTile = C::kTile;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* k_smem = reinterpret_cast<uint4*>(smem_raw);
  uint4* v_smem = k_smem + C::kStages * C::kStageChunks;
  float* q_smem = reinterpret_cast<float*>(v_smem + C::kStages * C::kStageChunks);  // [16][D]
  float* s_smem = q_smem + kMaxGroupPerCta * kHeadDim;                              // [16][kTile]
  float* m_smem = s_smem + kMaxGroupPerCta * kTile;                                 // [16]
  float* l_smem = m_smem + kMaxGroupPerCta;                                         // [16]
  float* alpha_smem = l_smem + kMaxGroupPerCta;                                     // [16]

  // Grid: (item, head tile). The work (decode_work.cuh, shared with the tensor-core kernel).
  const int item = blockIdx.x;
  DecodeWork work;
  if (!decode_work(p, item, static_cast<int>(blockIdx.y), work)) return;
  const int request = work.request;
  const bool split = work.split;
  const int page_begin = work.page_begin;
  const int tok_begin = work.tok_begin, tok_end = work.tok_end;
  const int kv_head = work.kv_head, qo_head0 = work.qo_head0, heads = work.heads;
  const int page_size = p.page_size;
  const int tid = threadIdx.x;
  const int num_tiles = tok_end > tok_begin ? (tok_end - tok_begin + kTile - 1) / kTile : 0;

  // q of this CTA's heads, pre-scaled.
  const QT* q = static_cast<const QT*>(p.q) + request * p.q_stride_batch;
  for (int idx = tid; idx < heads * kHeadDim; idx += C::kThreads) {
    const int h = idx / kHeadDim;
    const int d = idx - h * kHeadDim;
    q_smem[idx] = to_float(q[(qo_head0 + h) * p.q_stride_head + d]) * p.q_scale;
  }
  if (tid < kMaxGroupPerCta) {
    m_smem[tid] = -INFINITY;
    l_smem[tid] = 0.0f;
  }

  const KVT* k_cache = static_cast<const KVT*>(p.k);
  const KVT* v_cache = static_cast<const KVT*>(p.v);
  const int64_t k_head_offset = kv_head * p.k_stride_head;
  const int64_t v_head_offset = kv_head * p.v_stride_head;
  // A page id outside the pool is zero-filled, never read; the CTA's rows then get 0 / -inf.
  bool saw_bad_page = false;
  auto load_tile = [&](int tile, int stage) {
    const int t0 = tok_begin + tile * kTile;
#pragma unroll
    for (int i = 0; i < C::kLoadIters; ++i) {
      const int idx = i * C::kThreads + tid;
      const int token = idx / C::kChunksPerRow;
      const int chunk_in_row = idx - token * C::kChunksPerRow;
      const int pos = t0 + token;
      bool valid = pos < tok_end;
      const KVT* k_src = k_cache;
      const KVT* v_src = v_cache;
      if (valid) {
        const int page_local = pos / page_size;
        const int in_page = pos - page_local * page_size;
        const int page = p.kv_indices[page_begin + page_local];
        if (page_in_pool(p.guard, page)) [[likely]] {
          const int alloc = page / p.pages_per_alloc;
          const int64_t token_in_alloc =
              static_cast<int64_t>(page - alloc * p.pages_per_alloc) * page_size + in_page;
          const int64_t dim = chunk_in_row * kVec;
          k_src +=
              alloc * p.k_stride_page + token_in_alloc * p.k_stride_token + k_head_offset + dim;
          v_src +=
              alloc * p.v_stride_page + token_in_alloc * p.v_stride_token + v_head_offset + dim;
        } else {  // zero-filled from the cache's base; reported at the end (guard.cuh)
          valid = false;
          saw_bad_page = true;
          note_bad_page(cta_bad_page_note(), page_begin + page_local, page);
        }
      }
      const int slot = (stage * kTile + token) * C::kChunksPerRow + C::swizzle(token, chunk_in_row);
      cp_async_16(k_smem + slot, k_src, valid);
      cp_async_16(v_smem + slot, v_src, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s);
    cp_async_commit();
  }

  // QK role.
  const int qk_token = tid / C::kThreadsPerToken;
  const int qk_part = tid % C::kThreadsPerToken;
  // PV role.
  const int pv_chunk = tid % C::kChunksPerRow;
  const int pv_lane = tid / C::kChunksPerRow;
  const int slices = heads <= C::kLanes ? C::kLanes / heads : 1;
  const int pv_head = pv_lane / slices;
  const int pv_slice = pv_lane % slices;
  float acc[C::kMaxHeadsPerLane][kVec];
#pragma unroll
  for (int j = 0; j < C::kMaxHeadsPerLane; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[j][e] = 0.0f;
  }
  const int warp = tid / 32;
  const int lane = tid % 32;

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // tile `tile` landed; everyone is done with the stage refilled below
    {
      const int next = tile + C::kStages - 1;
      if (next < num_tiles) load_tile(next, next % C::kStages);
      cp_async_commit();
    }
    const int stage = tile % C::kStages;
    const int t0 = tok_begin + tile * kTile;

    // ---- scores ----
    float score[kMaxGroupPerCta];
#pragma unroll
    for (int h = 0; h < kMaxGroupPerCta; ++h) score[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < C::kChunksPerThread; ++j) {
      const int chunk_in_row = qk_part + j * C::kThreadsPerToken;
      float kf[kVec];
      vec_to_float<KVT>(k_smem[(stage * kTile + qk_token) * C::kChunksPerRow +
                               C::swizzle(qk_token, chunk_in_row)],
                        kf);
#pragma unroll
      for (int h = 0; h < kMaxGroupPerCta; ++h) {
        if (h < heads) {
          const float4* qv =
              reinterpret_cast<const float4*>(q_smem + h * kHeadDim + chunk_in_row * kVec);
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < kVec / 4; ++e) {
            const float4 q4 = qv[e];
            sum += q4.x * kf[4 * e] + q4.y * kf[4 * e + 1] + q4.z * kf[4 * e + 2] +
                   q4.w * kf[4 * e + 3];
          }
          score[h] += sum;
        }
      }
    }
    const bool token_valid = t0 + qk_token < tok_end;
#pragma unroll
    for (int h = 0; h < kMaxGroupPerCta; ++h) {
      if (h < heads) {
#pragma unroll
        for (int offset = 1; offset < C::kThreadsPerToken; offset *= 2) {
          score[h] += __shfl_xor_sync(0xffffffffu, score[h], offset);
        }
        if (qk_part == 0) {
          float s = score[h];
          if (p.soft_cap > 0.0f) s = p.soft_cap_log2 * tanhf(s / p.soft_cap);
          s_smem[h * kTile + qk_token] = token_valid ? s : -INFINITY;
        }
      }
    }
    __syncthreads();

    // ---- online softmax, one warp per head ----
    for (int h = warp; h < heads; h += C::kThreads / 32) {
      float* row = s_smem + h * kTile;
      float tile_max = -INFINITY;
      for (int t = lane; t < kTile; t += 32) tile_max = fmaxf(tile_max, row[t]);
      tile_max = warp_max(tile_max);
      const float m_old = m_smem[h];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int t = lane; t < kTile; t += 32) {
        const float prob = m_new == -INFINITY ? 0.0f : fast_exp2(row[t] - m_new);
        row[t] = prob;
        sum += prob;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read m_smem[h] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = m_new == -INFINITY ? 1.0f : fast_exp2(m_old - m_new);
        l_smem[h] = l_smem[h] * alpha + sum;
        m_smem[h] = m_new;
        alpha_smem[h] = alpha;
      }
    }
    __syncthreads();

    // ---- P V ----
    const int tile_tokens = min(kTile, tok_end - t0);
#pragma unroll
    for (int j = 0; j < C::kMaxHeadsPerLane; ++j) {
      const int h = pv_head + j * C::kLanes;
      if (h < heads) {
        const float alpha = alpha_smem[h];
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[j][e] *= alpha;
      }
    }
    if (pv_head < heads) {
      for (int t = pv_slice; t < tile_tokens; t += slices) {
        float vf[kVec];
        vec_to_float<KVT>(v_smem[(stage * kTile + t) * C::kChunksPerRow + C::swizzle(t, pv_chunk)],
                          vf);
#pragma unroll
        for (int j = 0; j < C::kMaxHeadsPerLane; ++j) {
          const int h = pv_head + j * C::kLanes;
          if (h < heads) {
            const float prob = s_smem[h * kTile + t];
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[j][e] += prob * vf[e];
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  // All tiles consumed: the K stages are free for the reduction. And whether a page id was bad.
  const bool bad_page = __syncthreads_or(saw_bad_page) != 0;

  if (slices > 1) {
    float* red = reinterpret_cast<float*>(k_smem);  // [kLanes][kHeadDim]
    if (pv_head < heads) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) red[pv_lane * kHeadDim + pv_chunk * kVec + e] = acc[0][e];
    }
    __syncthreads();
    if (pv_head < heads && pv_slice == 0) {
      for (int s = 1; s < slices; ++s) {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          acc[0][e] += red[(pv_lane + s) * kHeadDim + pv_chunk * kVec + e];
      }
    }
  }
  if (pv_slice != 0) return;

#pragma unroll
  for (int j = 0; j < C::kMaxHeadsPerLane; ++j) {
    const int h = pv_head + j * C::kLanes;
    if (h >= heads) continue;
    const float l = l_smem[h];
    // A bad page id: 0 / -inf, or a poisoned partial that makes the merge write them.
    const float scale = l > 0.0f && !bad_page ? p.v_scale / l : 0.0f;
    if (bad_page) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[j][e] = 0.0f;
    }
    const float lse = bad_page   ? (split ? poisoned_partial() : -INFINITY)
                      : l > 0.0f ? (m_smem[h] + log2f(l)) * kLn2
                                 : -INFINITY;
    const int qo_head = qo_head0 + h;
    const int d0 = pv_chunk * kVec;
    if (!split) {
      QT* out =
          static_cast<QT*>(p.out) + request * p.out_stride_batch + qo_head * p.out_stride_head;
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[d0 + e] = from_float<QT>(acc[j][e] * scale);
      if (p.lse != nullptr && pv_chunk == 0) {
        p.lse[request * p.lse_stride_batch + qo_head * p.lse_stride_head] = lse;
      }
    } else {
      float* out = p.partial_out + (int64_t{item} * p.num_qo_heads + qo_head) * kHeadDim;
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[d0 + e] = acc[j][e] * scale;
      if (pv_chunk == 0) p.partial_lse[int64_t{item} * p.num_qo_heads + qo_head] = lse;
    }
  }
  if (bad_page && tid == 0)
    report_noted_page(p.guard, request, cta_bad_page_note());  // thread 0 has pv_slice 0
}

template <int kHeadDim, class QT, class KVT>
void launch_decode_kernel(const DecodeParams& params, int grid_items, void* stream) {
  using C = DecodeConfig<kHeadDim, KVT>;
  auto* kernel = decode_kernel<kHeadDim, QT, KVT>;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmemBytes));
  PA_CUDA_CHECK(attribute_status);
  const dim3 grid(grid_items, params.num_kv_heads * params.group_tiles);
  launch_kernel(kernel, grid, C::kThreads, C::kSmemBytes, static_cast<cudaStream_t>(stream),
                params);
  check_launch("decode_kernel");
}

}  // namespace pagedattn::cuda
