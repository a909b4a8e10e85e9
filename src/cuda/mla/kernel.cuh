// The CUDA MLA kernel (absorbed form; bf16 queries, bf16 or fp8 e4m3 cache) and the merge of
// split-KV partials.
//
// Work: one CTA per (block of 64 request rows, see config.h; work item = one chunk of one request's
// KV, from the split-KV partition), grid (row blocks, items): the row blocks of an item are
// neighbours in launch order, so with H = 128 (two blocks per token) the second read of a KV tile
// mostly hits L2. K is the 576-wide latent row [ckv, kpe] and V its first 512 columns, so each
// 64-token tile is gathered once into shared memory and feeds both products:
//   S [64 x 64]  = Q [64 x 576] K^T     8 warps as 4 (16-row) x 2 (32-token) blocks
//   O [64 x 512] += P [64 x 64] V       8 warps, each all 64 rows x a 64-column slice of O
// on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate; 128 f32 accumulators per thread).
// Online softmax in base 2: the two token-half warps of a row block exchange their row maxima
// through shared memory, P goes to shared memory as bf16 (A operand of the PV product for every
// warp), and the per-row rescale factor alpha with it. Each warp keeps the running max and its
// half's running sum in registers; the halves are added at the end.
//
// Memory: Q 72 KiB, two KV stages of 72 KiB (cp.async double buffering: tile j + 1 streams in while
// tile j is used), P 8 KiB, gather offsets and row statistics 2.8 KiB: one CTA per SM. Rows are
// 16-byte-chunk XOR-swizzled (chunk ^ row % 8) so the ldmatrix reads are conflict-free. The 64
// threads of warps 0-1 translate a tile's token positions into element offsets (attention page ->
// allocation page, kv_cache.h) two tiles ahead; tokens past the CTA's range re-read its last token
// (real data, masked), so no unwritten slot (NaN) ever reaches P V.
// fp8 e4m3 cache: the second bf16 stage's bytes hold two raw fp8 stages instead; tile j + 1 streams
// into one while tile j is converted (exactly) from the other into the single bf16 stage, then used
// as above; the scale multiplies the logits and the output.
//
// Masking: keys outside [chunk begin, min(chunk end, kv_len)) and, when causal, keys after the
// row's position kv_len - q_len + t. A CTA whose range is empty writes O = 0, lse = -inf.
// Output: a request served by one item writes out / lse; a split request writes its f32 partials
// (O / l and lse per item), combined by mla_merge_kernel.
// Metadata on trust (common/guard.h), for every MLA kernel: item_work gives a request with a bad
// query range no rows and one with bad KV metadata (or q_len > kv_len) no keys; checked_page reads
// page 0 in place of an id outside the pool, and the CTA writes its rows as 0 / -inf (a split
// item poisons its partial lse; the merge writes 0 / -inf for the row).
// Every MLA kernel (this file's two, kernel_small.cuh's, kernel_sm90_ws.cuh's) is launched with
// programmatic dependent launch (cuda/launch.h): pdl_wait() is its first statement, before the
// partition is read and before a CTA without work returns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/guard.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/mla/config.h"
#include "cuda/prefill/kernel.cuh"

namespace pagedattn::cuda::mla {

using prefill::ldmatrix_x4;
using prefill::ldmatrix_x4_trans;
using prefill::smem_u32;
using Bf16Mma = prefill::Mma<__nv_bfloat16>;

// Warp roles for a block of kRows (64 or 16) query rows: S = Q K^T is split into kRowGroups
// (16-row) x kTokenGroups (token slices of kTokensPerWarp) warps; O = P V gives each warp all kRows
// rows x a 64-column slice.
template <int kRows>
struct Roles {
  static_assert(kRows == 64 || kRows == 16);
  static constexpr int kRowGroups = kRows / 16;
  static constexpr int kTokenGroups = kWarps / kRowGroups;       // 2 or 8
  static constexpr int kTokensPerWarp = kBlockN / kTokenGroups;  // 32 or 8
  static constexpr int kNTiles = kTokensPerWarp / 8;             // S n8 tiles per warp
  static constexpr int kMTiles = kRows / 16;                     // O m16 tiles per warp
};

template <int kRows>
struct Smem {
  static constexpr int kRowBytes = kDimQk * 2;        // 1152: one Q or KV row
  static constexpr int kPRowBytes = kBlockN * 2;      // 128: one P row
  static constexpr int kQ = 0;                        // [rows][576] bf16
  static constexpr int kKv = kQ + kRows * kRowBytes;  // [2][64][576] bf16
  static constexpr int kStageBytes = kBlockN * kRowBytes;
  static constexpr int kP = kKv + 2 * kStageBytes;             // [rows][64] bf16
  static constexpr int kOffsets = kP + kRows * kPRowBytes;     // int64 [2 bufs][ckv, kpe][64]
  static constexpr int kRed = kOffsets + 2 * 2 * kBlockN * 8;  // f32 [token groups][rows]
  static constexpr int kAlpha = kRed + Roles<kRows>::kTokenGroups * kRows * 4;  // f32 [rows]
  static constexpr int kNote = kAlpha + kRows * 4;  // u64: a bad page id (PageGuard)
  static constexpr int kBytes = kNote + 8;
  static_assert(kBytes <= 227 * 1024, "one CTA per SM must fit");
};

// Lazy online softmax (the sm_90a and H <= 16 kernels): a row's reference max moves only when the
// tile's max passes it by more than this many log2 units, so O is rarely rescaled after the first
// tiles; P stays below 2^kRescaleSlack, with the same relative precision in bf16 and f32.
inline constexpr float kRescaleSlack = 8.0f;

// The value, hidden from the optimiser: an address computed from it is not loop-invariant, so it
// is not precomputed and kept in a register for the whole loop.
__device__ __forceinline__ uint32_t opaque(uint32_t value) {
  uint32_t out;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(out) : "r"(value));
  return out;
}

// Byte offset of 16-byte chunk `chunk` of `row` in a tile with kRowBytes per row.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Attention-page slot of token `key` within the request (a shift when P is a power of two).
__device__ __forceinline__ int page_slot(const MlaParams& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}

// What a thread met of the page ids outside the pool (common/guard.h): `bad`, ORed over the CTA at
// its epilogue (its rows then get 0 / -inf, or poisoned partials), or, where `flag` is set, ORed
// into that shared word at once (the warp-specialized kernel, whose output warpgroups have no
// register to spare); and the CTA's shared-memory word where the id is noted for the report at
// the CTA's end (note_bad_page).
struct PageGuard {
  bool bad;
  unsigned long long* note;
  int* flag = nullptr;
};

// The attention page id of token `key` of a request whose page ids start at `pages`, as stored:
// unchecked, so that a gather can load it a tile ahead and check it where it is used
// (checked_page). A check at the load would wait for the load right there: every token's id at
// P 1, the latency the look-ahead exists to hide (H 128 lost a quarter of its rate at P 1 so).
__device__ __forceinline__ int load_page(const MlaParams& p, const int32_t* pages, int key) {
  return __ldg(pages + page_slot(p, key));
}

// `page`, token `key`'s id as load_page read it, checked: an id outside the pool is not read:
// page 0 (which exists: item_work) stands in, and `guard` records it.
__device__ __forceinline__ int checked_page(const MlaParams& p, const int32_t* pages, int key,
                                            int page, PageGuard& guard) {
  if (page_in_pool(p.guard, page)) [[likely]] {
    return page;
  }
  if (guard.flag != nullptr) {
    atomicOr(guard.flag, 1);
  } else {
    guard.bad = true;
  }
  note_bad_page(guard.note, (pages - p.kv_indices) + page_slot(p, key), page);
  return 0;
}

// `page` as load_page read it, or page 0 in its place when it is outside the pool; `bad` ORs in
// whether it was. The check of the H <= 16 kernel, which has no registers for checked_page's note:
// the CTA that met one rescans its keys' ids at its end for the report (report_first_bad_page).
__device__ __forceinline__ int page_or_zero(const MlaParams& p, int page, bool& bad) {
  const bool ok = page_in_pool(p.guard, page);
  bad |= !ok;
  return ok ? page : 0;
}

// Reports the first page id outside the pool among keys [key_begin, key_end) of the request (one
// thread, at the CTA's end, after page_or_zero met one).
__device__ __noinline__ inline void report_first_bad_page(const MlaParams& p, int request,
                                                          const int32_t* pages, int key_begin,
                                                          int key_end) {
  if (key_end <= key_begin) return;
  for (int slot = page_slot(p, key_begin), last = page_slot(p, key_end - 1); slot <= last; ++slot) {
    const int page = pages[slot];
    if (!page_in_pool(p.guard, page)) {
      report_page(p.guard, request, (pages - p.kv_indices) + slot, page);
      return;
    }
  }
}

// The page of token n0 + index of the request (tokens at or past `end` take token end - 1), as
// stored (load_page): loaded a tile ahead of its use, checked there (token_offsets).
__device__ __forceinline__ int token_page(const MlaParams& p, const int32_t* pages, int n0, int end,
                                          int index = static_cast<int>(threadIdx.x)) {
  return load_page(p, pages, min(n0 + index, end - 1));
}

// Element offsets of token n0 + index (on attention page `page`) in ckv / kpe, into entry `index`
// of ckv_off / kpe_off; tokens at or past `end` take token end - 1.
// Element offsets of token `key` of the request (on attention page `page`) in ckv and kpe:
// attention page -> allocation page + token slot (kv_cache.h).
__device__ __forceinline__ void latent_offsets(const MlaParams& p, int page, int key,
                                               int64_t& ckv_off, int64_t& kpe_off) {
  int64_t alloc = page;
  int64_t token = key - page_slot(p, key) * p.page_size;
  if (p.pages_per_alloc != 1) {
    alloc = page / p.pages_per_alloc;
    token += (page - alloc * p.pages_per_alloc) * p.page_size;
  }
  ckv_off = alloc * p.ckv_stride_page + token * p.ckv_stride_token;
  kpe_off = alloc * p.kpe_stride_page + token * p.kpe_stride_token;
}

// `page`: the token's id as token_page loaded it, checked here (checked_page).
__device__ __forceinline__ void token_offsets(const MlaParams& p, const int32_t* pages,
                                              PageGuard& guard, int page, int n0, int end,
                                              int64_t* ckv_off, int64_t* kpe_off,
                                              int index = static_cast<int>(threadIdx.x)) {
  const int key = min(n0 + index, end - 1);
  latent_offsets(p, checked_page(p, pages, key, page, guard), key, ckv_off[index], kpe_off[index]);
}
__device__ __forceinline__ void token_offsets(const MlaParams& p, const int32_t* pages,
                                              PageGuard& guard, int n0, int end, int64_t* ckv_off,
                                              int64_t* kpe_off,
                                              int index = static_cast<int>(threadIdx.x)) {
  token_offsets(p, pages, guard, token_page(p, pages, n0, end, index), n0, end, ckv_off, kpe_off,
                index);
}

// The online softmax (base 2, lazy rescale: kRescaleSlack) of one thread's part of a 16-row x
// 32-key S tile in the accumulator layout of mma m16n8k16 / wgmma m64n32 (element 4 j + 2 h + e:
// row h (lane / 4, + 8), key 8 j + 2 (lane % 4) + e; a row's keys spread over the lane quad).
// Masked keys hold -inf. S becomes P = 2^(S scale_log2 - max); per row, the reference max and the
// running sum move on, and alpha is the rescale of O. In three phases, which the warp-specialized
// kernel interleaves with its wgmma issue; online_softmax runs them in a row.
//
// Phase 1: this thread's row maxima, scaled (scale_log2 > 0 keeps the order). kN 16 (32 keys) or
// 32 (64 keys: the two-sided kernel's tiles), the same layout.
template <int kN>
__device__ __forceinline__ void softmax_local_max(const float (&s)[kN], float scale_log2,
                                                  float (&m)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = s[2 * h];
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) x = fmaxf(x, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    m[h] = x * scale_log2;
  }
}
// A row's maximum over the lane quad (this thread's `m` from phase 1), and the reference that
// follows `from`: the maximum where it passes `from` by more than the slack, else `from`.
__device__ __forceinline__ float quad_reference(float m, float from) {
  float x = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  if (!(x > from + kRescaleSlack)) x = from;
  return x;
}
// Phase 2: the rows' maxima over the quad; a reference max moves only where it is passed by more
// than the slack. m_use is the max P is taken against, alpha the rescale of O and of the sum.
// Returns whether one of this thread's references moved.
__device__ __forceinline__ bool softmax_move_reference(const float (&m)[2], float (&row_max)[2],
                                                       float (&m_use)[2], float (&alpha)[2]) {
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float x = quad_reference(m[h], row_max[h]);
    m_use[h] = x == -INFINITY ? 0.0f : x;  // nothing seen yet
    alpha[h] = fast_exp2(row_max[h] - m_use[h]);
    moved |= x != row_max[h];
    row_max[h] = x;
  }
  return moved;
}
// Phase 3: P, and the running sums.
__device__ __forceinline__ void softmax_exp(float (&s)[16], float scale_log2,
                                            const float (&m_use)[2], const float (&alpha)[2],
                                            float (&row_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = fast_exp2(fmaf(s[i], scale_log2, -m_use[(i >> 1) & 1]));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    row_sum[h] = row_sum[h] * alpha[h] + sum;
  }
}
// The three phases; the quad shuffles of phase 2 are skipped when no thread of the warp has a
// maximum past its reference by the slack (no reference can move: the same decisions).
__device__ __forceinline__ bool online_softmax(float (&s)[16], float scale_log2,
                                               float (&row_max)[2], float (&row_sum)[2],
                                               float (&alpha)[2]) {
  float m[2], m_use[2];
  softmax_local_max(s, scale_log2, m);
  const bool passes = m[0] > row_max[0] + kRescaleSlack || m[1] > row_max[1] + kRescaleSlack;
  bool moved = false;
  if (__any_sync(0xffffffffu, passes)) {
    moved = softmax_move_reference(m, row_max, m_use, alpha);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_use[h] = row_max[h] == -INFINITY ? 0.0f : row_max[h];
      alpha[h] = fast_exp2(row_max[h] - m_use[h]);
    }
  }
  softmax_exp(s, scale_log2, m_use, alpha, row_sum);
  return moved;
}

// A CTA's work: the request and KV chunk of its partition item (blockIdx.y), and the request's
// geometry. Keys [chunk_begin, chunk_end) of the request's kv_len; query token t of the request
// sits at position pos_shift + t; rows are its q_len * H (token, head) pairs.
struct ItemWork {
  int item = 0, request = 0;
  bool split = false;  // the request has more than one item: partials, merged after
  int q_begin = 0, q_len = 0, num_rows = 0;
  int kv_len = 0, chunk_begin = 0, chunk_end = 0, pos_shift = 0;
  const int32_t* pages = nullptr;  // the request's attention pages
};

// The work of item `item` (this CTA's: blockIdx.y, or blockIdx.y / MlaParams::cluster); false
// when the item is past the partition's count (nothing to do).
__device__ __forceinline__ bool item_work(const MlaParams& p, ItemWork& w,
                                          int item = static_cast<int>(blockIdx.y)) {
  w.item = item;
  // The three loads go out together (one memory latency, not two, before the request's): the
  // grid never exceeds the partition arrays' capacity (run_mla checks grid <= max_items), and
  // an entry past the count is read but not used.
  const int num_items = p.partition.info->num_items;
  const int request = p.partition.work_request[w.item];
  const int chunk = p.partition.work_chunk[w.item];
  if (w.item >= num_items) return false;
  w.request = request;
  w.split = p.partition.merge_indptr[w.request + 1] - p.partition.merge_indptr[w.request] > 1;
  const int64_t chunk_tokens = int64_t{p.partition.info->chunk_pages} * p.page_size;
  w.q_begin = p.qo_indptr[w.request];
  const int q_end = p.qo_indptr[w.request + 1];
  const int page_begin = p.kv_indptr[w.request];
  const int page_end = p.kv_indptr[w.request + 1];
  const int last_page_len = p.kv_last_page_len[w.request];
  // Metadata on trust (common/guard.h): a bad query range gives the item no rows (nothing is
  // written); bad KV metadata, or q_len > kv_len, no keys (the rows get 0 / -inf).
  w.q_len = query_rows_ok(p.guard, w.request, w.q_begin, q_end) ? q_end - w.q_begin : 0;
  w.num_rows = w.q_len * p.num_heads;
  w.kv_len = 0;
  if (kv_metadata_ok(p.guard, p.kv_indices, w.request, page_begin, page_end, last_page_len,
                     p.page_size)) {
    w.kv_len =
        page_end > page_begin ? (page_end - page_begin - 1) * p.page_size + last_page_len : 0;
    if (!q_len_within_kv(p.guard, w.request, w.q_len, w.kv_len)) w.kv_len = 0;
  }
  w.pages = p.kv_indices + page_begin;
  w.chunk_begin = static_cast<int>(min(int64_t{w.kv_len}, chunk * chunk_tokens));
  w.chunk_end = static_cast<int>(min(int64_t{w.kv_len}, (chunk + 1) * chunk_tokens));
  w.pos_shift = w.kv_len - w.q_len;
  return true;
}

// Chunk c (16 bytes: 64 of q_nope, then 8 of q_pe) of request row `row` as a cp.async source, with
// its byte count: 16, or 0 past the request's rows (the copy then zero-fills and reads nothing).
__device__ __forceinline__ const __nv_bfloat16* q_chunk(const MlaParams& p, const ItemWork& w,
                                                         int row, int c, int& bytes) {
  const auto* q_nope = static_cast<const __nv_bfloat16*>(p.q_nope);
  const auto* q_pe = static_cast<const __nv_bfloat16*>(p.q_pe);
  bytes = row < w.num_rows ? 16 : 0;
  if (bytes == 0) return q_nope;
  const int t = row / p.num_heads;
  const int head = row - t * p.num_heads;
  return c < kRank / 8 ? q_nope + (w.q_begin + t) * p.q_nope_stride_token +
                             head * p.q_nope_stride_head + c * 8
                       : q_pe + (w.q_begin + t) * p.q_pe_stride_token + head * p.q_pe_stride_head +
                             (c - kRank / 8) * 8;
}

// Where request row `row` of a CTA's work puts its lse: the output's lse (null when there is none)
// or, for a split request, the item's partial lse. Rows past the request's, and past
// partial_rows, have no place: callers skip them (also for store_row).
__device__ __forceinline__ float* lse_slot(const MlaParams& p, const ItemWork& w, int row) {
  if (w.split) return p.partial_lse + int64_t{w.item} * p.partial_rows + row;
  if (p.lse == nullptr) return nullptr;
  const int tok = row / p.num_heads;
  const int head = row - tok * p.num_heads;
  return p.lse + (w.q_begin + tok) * p.lse_stride_token + head * p.lse_stride_head;
}
// Stores accumulator pairs of request row `row`: columns col + 8 j and + 1 (j < kTiles) get
// pair(j) * inv, in the output row (bf16) or, for a split request, the item's partial row (f32).
template <int kTiles, class Pair>
__device__ __forceinline__ void store_row(const MlaParams& p, const ItemWork& w, int row, int col,
                                          float inv, Pair pair) {
  if (!w.split) {
    const int tok = row / p.num_heads;
    const int head = row - tok * p.num_heads;
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) +
                         (w.q_begin + tok) * p.out_stride_token + head * p.out_stride_head + col;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float2 v = pair(j);
      *reinterpret_cast<uint32_t*>(dst + j * 8) = Bf16Mma::pack(v.x * inv, v.y * inv);
    }
  } else {
    float* dst = p.partial_out + (int64_t{w.item} * p.partial_rows + row) * kRank + col;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float2 v = pair(j);
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(v.x * inv, v.y * inv);
    }
  }
}

// The end of the keys a block of rows [row0, row0 + rows) sees in its chunk (causal: up to the
// position of its last row).
__device__ __forceinline__ int row_block_end(const MlaParams& p, const ItemWork& w, int row0,
                                             int rows) {
  const int last_row = min(row0 + rows, w.num_rows) - 1;
  return p.causal ? min(w.chunk_end, max(w.chunk_begin, w.pos_shift + last_row / p.num_heads + 1))
                  : w.chunk_end;
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Gathers one 64-token tile of 576-wide latent rows: bf16 rows straight into a swizzled stage;
// fp8 rows (576 bytes, 36 chunks) unswizzled into a raw stage, converted by convert_tile.
template <class KVT>
__device__ __forceinline__ void load_tile(uint32_t stage, const KVT* ckv, const KVT* kpe,
                                          const int64_t* ckv_off, const int64_t* kpe_off) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(KVT));  // elements per 16-byte chunk
  constexpr int kChunks = kDimQk / kVec;                    // per row: 72 (bf16), 36 (fp8)
  constexpr int kRankChunks = kRank / kVec;                 // from ckv, the rest from kpe
#pragma unroll
  for (int it = 0; it < kBlockN * kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int row = i / kChunks;
    const int chunk = i - row * kChunks;
    const KVT* src = chunk < kRankChunks ? ckv + ckv_off[row] + chunk * kVec
                                         : kpe + kpe_off[row] + (chunk - kRankChunks) * kVec;
    const uint32_t dst =
        sizeof(KVT) == 2 ? stage + swz<kDimQk * 2>(row, chunk) : stage + row * kDimQk + chunk * 16;
    prefill::cp_async_16(dst, src);
  }
}

// fp8 e4m3 raw stage -> bf16 swizzled stage (exact: every e4m3 value is a bf16 value; the scale is
// applied to the logits and the output instead).
// Thread t converts row t / 4, pieces t % 4 + 4 k (k < 18) of 8 bytes each: the row's addresses
// are fixed, so the loop needs few registers (the O accumulators hold most of them here).
__device__ __forceinline__ void convert_tile(uint32_t raw, uint32_t stage) {
  const int row = static_cast<int>(threadIdx.x) >> 2;
  const int first = static_cast<int>(threadIdx.x) & 3;
  const uint32_t src_row = raw + row * kDimQk;
  const uint32_t dst_row = stage + row * (kDimQk * 2);
#pragma unroll 1
  for (int piece = first; piece < kDimQk / 8; piece += 4) {
    uint32_t lo, hi;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(lo), "=r"(hi)
                 : "r"(src_row + piece * 8));
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? lo : hi;
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((word >> (16 * (k % 2))) & 0xffffu), __NV_E4M3);
      __half2 h;
      memcpy(&h, &pair, 4);
      const float2 f = __half22float2(h);
      out[k] = Bf16Mma::pack(f.x, f.y);
    }
    asm volatile(
        "st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst_row + ((piece ^ (row & 7)) << 4)),
        "r"(out[0]), "r"(out[1]), "r"(out[2]), "r"(out[3])
        : "memory");
  }
}

template <class KVT, int kRows>
__global__ void __launch_bounds__(kThreads, 1) mla_kernel(const __grid_constant__ MlaParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  using Smem = mla::Smem<kRows>;
  using R = Roles<kRows>;
  // fp8: one bf16 stage fed by two raw fp8 stages (the same bytes as two bf16 stages).
  constexpr bool kFp8 = sizeof(KVT) == 1;
  constexpr int kRawBytes = kBlockN * kDimQk;
  constexpr int kRowBytes = Smem::kRowBytes;
  constexpr int kChunks = kDimQk / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem + Smem::kQ);
  const uint32_t s_kv = smem_u32(smem + Smem::kKv);
  const uint32_t s_p = smem_u32(smem + Smem::kP);
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + Smem::kOffsets);  // [buf][ckv|kpe][64]
  float* s_red = reinterpret_cast<float*>(smem + Smem::kRed);
  float* s_alpha = reinterpret_cast<float*>(smem + Smem::kAlpha);

  ItemWork work;
  if (!item_work(p, work)) return;
  const auto [item, request, split, q_begin, q_len, num_rows, kv_len, chunk_begin, chunk_end,
              pos_shift, pages] = work;
  const int H = p.num_heads;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  // S role: rows mw * 16.., tokens nw * kTokensPerWarp..
  const int mw = warp % R::kRowGroups, nw = warp / R::kRowGroups;
  const auto* ckv = static_cast<const KVT*>(p.ckv);
  const auto* kpe = static_cast<const KVT*>(p.kpe);
  // Where tile t lands (cp.async) and where it is read from (ldmatrix).
  auto landing = [&](int t) -> uint32_t {
    return kFp8 ? s_kv + Smem::kStageBytes + (t & 1) * kRawBytes
                : s_kv + (t & 1) * Smem::kStageBytes;
  };

  // Per-lane ldmatrix offsets (see prefill/kernel.cuh). A lane reads chunk 8 j + 2 c + b of its
  // row (b: a lane bit, c < 4): rows are multiples of 128 bytes, so the swizzled offset is
  // swz(row, b) ^ (c << 5), plus 128 j. One register per operand; the XOR is free at each use.
  const uint32_t q_lane = swz<kRowBytes>(mw * 16 + (lane & 15), lane >> 4);
  // K: x4 loads cover 16 tokens (lane bit 4) x 2 chunks; x2 loads (8 tokens) use lanes 0..15.
  const uint32_t k_lane = swz<kRowBytes>(
      nw * R::kTokensPerWarp + (R::kNTiles >= 2 ? ((lane >> 4) << 3) : 0) + (lane & 7),
      (lane >> 3) & 1);
  const uint32_t v_lane = swz<kRowBytes>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
  const uint32_t p_lane = swz<Smem::kPRowBytes>(lane & 15, lane >> 4);

  for (int rb = static_cast<int>(blockIdx.x); rb * kRows < num_rows;
       rb += static_cast<int>(gridDim.x)) {
    const int row0 = rb * kRows;
    // This thread's S rows (2) and their last visible key.
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + mw * 16 + (lane >> 2) + 8 * h, num_rows - 1);
      limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
    }
    const int block_end = row_block_end(p, work, row0, kRows);
    const int num_tiles = (block_end - chunk_begin + kBlockN - 1) / kBlockN;

    float o[R::kMTiles][8][4];
#pragma unroll
    for (int mt = 0; mt < R::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
      }
    }
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    int page_ahead = 0;  // threads < 64: the page of their token in tile + 2
    // Threads < 64: a page id outside the pool (checked_page).
    PageGuard page_guard{false, reinterpret_cast<unsigned long long*>(smem + Smem::kNote)};

    if (num_tiles > 0) {
      // Q rows (zero past the request's rows), and the first two tiles' offsets.
#pragma unroll 2
      for (int i = tid; i < kRows * kChunks; i += kThreads) {
        const int r = i / kChunks;
        const int c = i - r * kChunks;
        int bytes;
        const __nv_bfloat16* src = q_chunk(p, work, row0 + r, c, bytes);
        prefill::cp_async_16(s_q + swz<kRowBytes>(r, c), src, bytes);
      }
      if (tid < kBlockN) {
        token_offsets(p, pages, page_guard, chunk_begin, block_end, s_off, s_off + kBlockN);
        if (num_tiles > 1) {
          token_offsets(p, pages, page_guard, chunk_begin + kBlockN, block_end, s_off + 2 * kBlockN,
                        s_off + 3 * kBlockN);
        }
        if (num_tiles > 2) {
          page_ahead = token_page(p, pages, chunk_begin + 2 * kBlockN, block_end);
        }
      }
      __syncthreads();
      load_tile(landing(0), ckv, kpe, s_off, s_off + kBlockN);
      prefill::cp_async_commit();
    }

    for (int tile = 0; tile < num_tiles; ++tile) {
      const int n0 = chunk_begin + tile * kBlockN;
      // Opaque per tile (see opaque()): fixed addresses would be hoisted out of the tile loop as
      // dozens of live registers.
      const uint32_t stage = opaque(kFp8 ? s_kv : landing(tile));
      const uint32_t q_base = opaque(s_q);
      const uint32_t q_off = opaque(q_lane), k_off = opaque(k_lane);
      prefill::cp_async_wait_all();
      __syncthreads();  // tile (and Q) visible; everyone is done with the other stage
      if (tile + 1 < num_tiles) {
        const int64_t* off = s_off + ((tile + 1) & 1) * 2 * kBlockN;
        load_tile(landing(tile + 1), ckv, kpe, off, off + kBlockN);
        prefill::cp_async_commit();
      }
      if constexpr (kFp8) {
        convert_tile(landing(tile), s_kv);
        __syncthreads();  // the bf16 tile is complete
      }

      // ---- S = Q K^T: rows mw * 16 + [0, 16), tokens nw * 32 + [0, 32) ----
      float s[R::kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < R::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
      }
      // 9 groups of 4 k-steps (one 128-byte swizzle group each); the outer loop is only partly
      // unrolled to bound the ldmatrix prefetch depth (registers: O is live throughout).
#pragma unroll 3
      for (int kg = 0; kg < kDimQk / 64; ++kg) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          uint32_t a[4];
          ldmatrix_x4(a, q_base + (q_off ^ (c << 5)) + kg * 128);
          if constexpr (R::kNTiles >= 2) {
#pragma unroll
            for (int np = 0; np < R::kNTiles / 2; ++np) {
              uint32_t b[4];
              ldmatrix_x4(b, stage + (k_off ^ (c << 5)) + kg * 128 + np * 16 * kRowBytes);
              Bf16Mma::run(s[2 * np], a, b[0], b[1]);
              Bf16Mma::run(s[2 * np + 1], a, b[2], b[3]);
            }
          } else {
            uint32_t b[2];
            ldmatrix_x2(b, stage + (k_off ^ (c << 5)) + kg * 128);
            Bf16Mma::run(s[0], a, b[0], b[1]);
          }
        }
      }
      // Offsets of tile + 2 (its buffer's previous tile was issued before the barrier above).
      if (tile + 2 < num_tiles && tid < kBlockN) {
        int64_t* off = s_off + (tile & 1) * 2 * kBlockN;
        token_offsets(p, pages, page_guard, page_ahead, n0 + 2 * kBlockN, block_end, off,
                      off + kBlockN);
        if (tile + 3 < num_tiles) {
          page_ahead = token_page(p, pages, n0 + 3 * kBlockN, block_end);
        }
      }

      // Mask, then this half's row maxima (in base-2 logit units) to shared memory.
      const bool needs_mask = n0 + kBlockN > block_end || (p.causal && n0 + kBlockN - 1 > limit[0]);
      float half_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < R::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (needs_mask) {
            const int key = n0 + nw * R::kTokensPerWarp + nt * 8 + 2 * (lane & 3) + (e & 1);
            if (key >= block_end || key > limit[e >> 1]) s[nt][e] = -INFINITY;
          }
          half_max[e >> 1] = fmaxf(half_max[e >> 1], s[nt][e]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        half_max[h] = fmaxf(half_max[h], __shfl_xor_sync(0xffffffffu, half_max[h], 1));
        half_max[h] = fmaxf(half_max[h], __shfl_xor_sync(0xffffffffu, half_max[h], 2));
        half_max[h] *= p.scale_log2;
        if ((lane & 3) == 0) s_red[nw * kRows + mw * 16 + (lane >> 2) + 8 * h] = half_max[h];
      }
      __syncthreads();

      // ---- softmax: P = exp2(S * scale - max) to shared memory (bf16), alpha per row ----
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mw * 16 + (lane >> 2) + 8 * h;
        float m_new = fmaxf(row_max[h], half_max[h]);
#pragma unroll
        for (int g = 0; g < R::kTokenGroups; ++g) m_new = fmaxf(m_new, s_red[g * kRows + row]);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing seen yet
        const float alpha = fast_exp2(row_max[h] - m_use);
        row_max[h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < R::kNTiles; ++nt) {
          s[nt][2 * h] = fast_exp2(fmaf(s[nt][2 * h], p.scale_log2, -m_use));
          s[nt][2 * h + 1] = fast_exp2(fmaf(s[nt][2 * h + 1], p.scale_log2, -m_use));
          sum += s[nt][2 * h] + s[nt][2 * h + 1];
          const uint32_t packed = Bf16Mma::pack(s[nt][2 * h], s[nt][2 * h + 1]);
          *reinterpret_cast<uint32_t*>(
              smem + Smem::kP + swz<Smem::kPRowBytes>(row, nw * R::kNTiles + nt) + 4 * (lane & 3)) =
              packed;
        }
        row_sum[h] = row_sum[h] * alpha + sum;
        if (nw == 0 && (lane & 3) == 0) s_alpha[row] = alpha;
      }
      __syncthreads();

      // ---- O = O * alpha + P V: all rows, columns warp * 64 + [0, 64) ----
      const uint32_t p_off = opaque(p_lane), v_off = opaque(v_lane);
#pragma unroll
      for (int mt = 0; mt < R::kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float alpha = s_alpha[mt * 16 + (lane >> 2) + 8 * h];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            o[mt][nt][2 * h] *= alpha;
            o[mt][nt][2 * h + 1] *= alpha;
          }
        }
      }
// Two k-steps per unrolled body: fully unrolled, the ldmatrix prefetch runs past 255 registers.
#pragma unroll 2
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[R::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < R::kMTiles; ++mt) {
          ldmatrix_x4(a[mt], s_p + mt * 16 * Smem::kPRowBytes + (p_off ^ (kk << 5)));
        }
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, stage + kk * 16 * kRowBytes + (v_off ^ (dp << 5)) + warp * 128);
#pragma unroll
          for (int mt = 0; mt < R::kMTiles; ++mt) {
            Bf16Mma::run(o[mt][2 * dp], a[mt], b[0], b[1]);
            Bf16Mma::run(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }

    // ---- epilogue: row sums of both halves and the final max through shared memory ----
    // Every warp is done reading s_red / s_alpha of the last tile; and whether a page id was bad
    // (then 0 / -inf for the block's rows, or a poisoned partial lse).
    const bool bad_page = __syncthreads_or(page_guard.bad) != 0;
    if (bad_page) {
#pragma unroll
      for (int mt = 0; mt < R::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
        }
      }
      row_sum[0] = row_sum[1] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = mw * 16 + (lane >> 2) + 8 * h;
      if ((lane & 3) == 0) {
        s_red[nw * kRows + row] = l;
        if (nw == 0) s_alpha[row] = row_max[h];
      }
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < R::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + (lane >> 2) + 8 * h;
        const int row = row0 + r;
        if (row >= num_rows || (split && row >= p.partial_rows)) continue;
        float l = 0.0f;
#pragma unroll
        for (int g = 0; g < R::kTokenGroups; ++g) l += s_red[g * kRows + r];
        const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
        const float lse = l > 0.0f ? (s_alpha[r] + __log2f(l)) * kLn2 : -INFINITY;
        store_row<8>(p, work, row, warp * 64 + 2 * (lane & 3), inv,
                     [&](int nt) { return make_float2(o[mt][nt][2 * h], o[mt][nt][2 * h + 1]); });
        if (warp == 0 && (lane & 3) == 0) {
          if (float* slot = lse_slot(p, work, row))
            *slot = bad_page && split ? poisoned_partial() : lse;
        }
      }
    }
    if (bad_page && tid == 0) report_noted_page(p.guard, request, page_guard.note);
    __syncthreads();  // shared memory is reused by the next row block
  }
}

// Combines the partials of split requests: one CTA per (request, row stripe), 128 threads x 4
// columns; requests served by one item exit at once.
//   lse = M + log(sum_i exp(lse_i - M)),  out = sum_i exp(lse_i - lse) * out_i.
// The items of a row are taken kMergeBatch at a time with every load of a batch issued before any
// is used (an item past the last re-reads the last one and weighs 0): one memory latency per
// batch, not two per item. Across batches M moves on as in an online softmax.
inline constexpr int kMergeThreads = kRank / 4;
inline constexpr int kMergeBatch = 8;

__global__ void __launch_bounds__(kMergeThreads)
    mla_merge_kernel(const __grid_constant__ MlaParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int request = static_cast<int>(blockIdx.x);
  // The request's item range and rows, loaded together.
  const int first = p.partition.merge_indptr[request];
  const int last = p.partition.merge_indptr[request + 1];
  const int q_begin = p.qo_indptr[request];
  const int q_end = p.qo_indptr[request + 1];
  if (last - first <= 1) return;
  // A bad query range (common/guard.h; the attention kernel reported it) has no rows to write.
  if (q_begin < 0 || q_end < q_begin || q_end > p.guard.num_rows) return;
  const int num_rows = min((q_end - q_begin) * p.num_heads, p.partial_rows);
  const int col = 4 * static_cast<int>(threadIdx.x);
  for (int row = static_cast<int>(blockIdx.y); row < num_rows; row += static_cast<int>(gridDim.y)) {
    float max_lse = -INFINITY, weight_sum = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    bool poisoned = false;  // an item met a page id outside the pool: the row is 0 / -inf
    for (int i0 = first; i0 < last && !poisoned; i0 += kMergeBatch) {
      float lse[kMergeBatch];
      float4 part[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const int64_t slot = int64_t{min(i0 + j, last - 1)} * p.partial_rows + row;
        lse[j] = p.partial_lse[slot];
        part[j] = *reinterpret_cast<const float4*>(p.partial_out + slot * kRank + col);
      }
      float batch_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        if (i0 + j >= last) lse[j] = -INFINITY;
        poisoned |= is_poisoned(lse[j]);
        batch_max = fmaxf(batch_max, lse[j]);
      }
      if (poisoned) break;
      if (batch_max == -INFINITY) continue;  // nothing seen by this batch's items
      if (batch_max > max_lse) {  // rescale what the earlier batches added (0 before the first)
        const float scale = __expf(max_lse - batch_max);
        weight_sum *= scale;
        acc.x *= scale;
        acc.y *= scale;
        acc.z *= scale;
        acc.w *= scale;
        max_lse = batch_max;
      }
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const float weight = lse[j] == -INFINITY ? 0.0f : __expf(lse[j] - max_lse);
        weight_sum += weight;
        acc.x += weight * part[j].x;
        acc.y += weight * part[j].y;
        acc.z += weight * part[j].z;
        acc.w += weight * part[j].w;
      }
    }
    if (poisoned) {
      weight_sum = 0.0f;
      acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
    const int t = row / p.num_heads;
    const int head = row - t * p.num_heads;
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) + (q_begin + t) * p.out_stride_token +
                         head * p.out_stride_head + col;
    const uint2 packed = make_uint2(Bf16Mma::pack(acc.x * inv, acc.y * inv),
                                    Bf16Mma::pack(acc.z * inv, acc.w * inv));
    *reinterpret_cast<uint2*>(dst) = packed;
    if (p.lse != nullptr && threadIdx.x == 0) {
      p.lse[(q_begin + t) * p.lse_stride_token + head * p.lse_stride_head] =
          weight_sum > 0.0f ? max_lse + __logf(weight_sum) : -INFINITY;
    }
  }
}

}  // namespace pagedattn::cuda::mla
