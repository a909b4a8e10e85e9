// Parameters and tile shape of the CUDA MLA kernels (absorbed DeepSeek MLA over the latent cache):
// one plain struct passed by value, filled and validated by the host launcher (src/cuda/mla.cpp),
// read by the kernels (kernel.cuh). No CUDA types: includable from .cpp and .cu files.
//
// Rows: the query rows of a request are (token, head) pairs packed token-major, request row
// R = t * H + h (t < q_len, h < H), so a block of 64 rows is 64 / H tokens for H <= 64 or a part of
// one token's heads for H = 128: every row of a block shares the request, hence the KV tiles.
// Requests of at most 16 rows (H <= 16 decode) take blocks of 16 rows (kSmallBlockM): a 64-row
// block would spend three quarters of its products on padding where the cache read is the limit.
// Split-KV partials are indexed by (work item, request row): partial_out [items, partial_rows, 512]
// and partial_lse [items, partial_rows] (f32), partial_rows >= q_len * H of every request.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/common/guard.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda::mla {

inline constexpr int kRank = 512;             // kv_lora_rank: ckv, q_nope, out, V
inline constexpr int kRope = 64;              // rope_dim: kpe, q_pe
inline constexpr int kDimQk = kRank + kRope;  // 576: K = [ckv, kpe]
inline constexpr int kBlockM = 64;            // query rows per CTA
inline constexpr int kSmallBlockM = 16;       // ... for requests of at most 16 rows
inline constexpr int kBlockN = 64;            // tokens per KV tile
inline constexpr int kWarps = 8;
inline constexpr int kThreads = 32 * kWarps;

struct MlaParams {
  // Queries [T, H, 512] / [T, H, 64], output [T, H, 512] (bf16), lse [T, H] f32 or null.
  const void* q_nope = nullptr;
  const void* q_pe = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  int64_t q_nope_stride_token = 0, q_nope_stride_head = 0;
  int64_t q_pe_stride_token = 0, q_pe_stride_head = 0;
  int64_t out_stride_token = 0, out_stride_head = 0;
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  // Latent cache: element (alloc page a, token slot s, dim d) at a * stride_page + s * stride_token
  // + d; ckv and kpe may be slices of one buffer.
  const void* ckv = nullptr;
  const void* kpe = nullptr;
  int64_t ckv_stride_page = 0, ckv_stride_token = 0;
  int64_t kpe_stride_page = 0, kpe_stride_token = 0;
  int32_t page_size = 0;        // attention page size P
  int32_t page_shift = -1;      // log2(P) when P is a power of two (a shift, not a division)
  int32_t pages_per_alloc = 1;  // alloc_page_size / P

  // Step metadata (device, int32, planner.h).
  const int32_t* qo_indptr = nullptr;         // [B + 1]
  const int32_t* kv_indptr = nullptr;         // [B + 1]
  const int32_t* kv_indices = nullptr;        // attention-page ids
  const int32_t* kv_last_page_len = nullptr;  // [B]
  int32_t batch_size = 0;
  int32_t num_heads = 0;  // H

  float scale_log2 = 0.0f;  // sm_scale * kv scale * log2(e): logits in base 2
  float out_scale = 1.0f;   // kv scale (the cache holds value / scale)
  bool causal = true;       // query t of q_len sees keys <= kv_len - q_len + t

  // Split-KV partition (device) and the partial results of split requests.
  PartitionView partition;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int32_t partial_rows = 0;  // rows per item in the partials
  // CTAs per work item (the H <= 16 kernel, kSmallBlockM rows): a cluster of `cluster` CTAs
  // shares an item's chunk, each a run of whole tiles, and combines their results in distributed
  // shared memory; item = blockIdx.y / cluster. 1 everywhere else.
  int32_t cluster = 1;

  // The metadata taken on trust is checked against these (common/guard.h).
  MetadataGuard guard;

  // The seesaw kernel's fast path (launch.cu; kernel_sm90_seesaw.cuh): where `tma` is set, ckv and
  // kpe as 3-D tensor maps (CUtensorMap, opaque here: dims {dim, alloc page size, alloc pages},
  // boxes of 64 columns x 64 tokens, 128-byte swizzle), for tiles of 64 tokens on one page.
  alignas(64) unsigned char tma_ckv[128] = {};
  alignas(64) unsigned char tma_kpe[128] = {};
  int32_t tma = 0;
};

// The largest cluster of CTAs per work item the H <= 16 kernel takes for this process and cache
// dtype (launch.cu): where that kernel runs (a bf16 cache on a 9.x device with its code), 2, or
// PAGEDATTN_MLA_CLUSTER=N (1 .. 8; 1: none; tests force 4 and 8, ARCHITECTURE.md "Switches");
// else 1.
int mla_cluster_limit(bool fp8_kv);

// (C, n) for C = 2, 4, 8: n clusters of C CTAs of the H <= 16 kernel (a CTA per SM) run on the
// device at once (cudaOccupancyMaxActiveClusters); empty where that kernel cannot run.
std::vector<std::pair<int, int>> small_cluster_occupancy();

// Enqueues the partition-driven MLA kernel for blocks of `block_rows` (kBlockM or kSmallBlockM)
// rows on a grid of (row blocks, grid_items <= 65535) CTAs (past 65535 row blocks a CTA of the
// looping kernels takes blockIdx.x, + 65535, ...), then, when `merge` is set, the merge of split
// requests over (batch, merge_rows) CTAs. bf16 queries; the cache bf16, or fp8 e4m3 when `fp8_kv`
// (launch.cu: which kernel, by the rule written there).
void launch_mla(const MlaParams& params, bool fp8_kv, int block_rows, int grid_items,
                int row_blocks, bool merge, int merge_rows, void* stream);

}  // namespace pagedattn::cuda::mla
