// Batch prefill / extend over the paged KV: FlashAttention-2 on tensor cores (mma.sync m16n8k16).
//
// Work: one CTA per (query tile, KV head). The rows of a tile are (token, query head) pairs of one
// request and one KV group, packed token-major: row r is token r / g, query head kvh * g + r % g
// (g = group size), so GQA/MQA share each K/V tile across the group and a short extend still fills
// the tile. The CTA finds its request by a block-wide scan of the per-request tile counts (no plan
// on the host, no sync) and takes the request's tiles last-first, so the long causal tiles start
// first.
//
// Per CTA: 4 warps, each owning kMTiles x 16 rows. Q stays in shared memory; K and V tiles of
// kBlockN keys are gathered by cp.async (16 bytes per thread; keys past the KV end re-read the last
// key and are masked) from
// their pages: the 64 threads of the first two warps translate the next tile's key positions into
// element offsets (attention page -> allocation page, see kv_cache.h) one tile ahead. Loads overlap
// compute as in FlashAttention-2: V_j streams in during S = Q K_j^T and the softmax, K_{j+1} during
// O += P V_j. Shared rows are 16-byte-chunk XOR-swizzled (chunk ^ row % 8), so the ldmatrix reads
// are conflict-free. Online softmax in base 2 in registers, one quad of lanes per row.
// Split-KV (params.h): grid y is the KV chunk; each CTA then writes f32 partials instead of out.
// An fp8 e4m3 cache (KV = __nv_fp8_e4m3, its own instantiation) is gathered the same way, half the
// bytes, and widened in shared memory to T before the barrier that publishes each tile
// (fp8_tile.cuh); K's scale is folded into sm_scale, V's applied to the output in f32.
// Metadata on trust (common/guard.h), for both kernels: find_tile gives a request whose query
// range is bad no tiles; request_kv runs a request with bad KV metadata (or q_len > kv_len)
// without keys; key_offsets reads page 0 in place of an id outside the pool, and the CTA writes
// its rows as 0 / -inf (a split chunk poisons its partial lse, and the merge writes 0 / -inf).
// Launched with programmatic dependent launch (cuda/launch.h), as are the wgmma kernel and the
// merge: pdl_wait() is each one's first statement, before the tile search and its early return.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/guard.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/prefill/fp8_tile.cuh"
#include "cuda/prefill/params.h"

namespace pagedattn::cuda::prefill {

template <int kHeadDimQk, int kHeadDimVo>
struct TileConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  // Two m16 tiles per warp halve the shared-memory reads per MMA (each K/V fragment feeds two);
  // head dim 256 has no registers for a 32 x 256 f32 accumulator, so one.
  static constexpr int kMTiles = kHeadDimVo <= 128 ? 2 : 1;
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  static constexpr int kBlockN = 64;
  static constexpr int kChunksQk = kHeadDimQk / 8;  // 16-byte chunks per row
  static constexpr int kChunksVo = kHeadDimVo / 8;
  static constexpr int kQBytes = kBlockM * kHeadDimQk * 2;
  static constexpr int kKBytes = kBlockN * kHeadDimQk * 2;
  static constexpr int kVBytes = kBlockN * kHeadDimVo * 2;
  static constexpr int kOffsetBytes = 2 * 2 * kBlockN * 8;  // K and V offsets, two tiles
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kOffsetBytes;
  static_assert(kHeadDimQk % 64 == 0 && kHeadDimVo % 16 == 0 && kHeadDimVo % 64 == 0);
  static_assert(kBlockN <= kThreads);
};

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global -> shared copy; src_bytes 0 zero-fills the destination (rows past the end).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of `kRowBytes` per row.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// The first page id outside the pool a CTA's key_offsets met (common/guard.h), in shared memory:
// cleared by find_tile (before its first barrier), claimed by the first thread to meet one, read
// after the key loop (a barrier follows every key_offsets call).
struct CtaPageFault {
  int flag;
  int page;
  int64_t index;  // in kv_indices
};
__device__ __forceinline__ CtaPageFault& cta_page_fault() {
  __shared__ CtaPageFault fault;
  return fault;
}

// Byte offsets of keys [n0, n0 + kBlockN) in the K and V pools, run by threads 0 .. kBlockN - 1,
// one key each. A key past the KV end takes the last key's slot: it is read (real data, never an
// unwritten slot's NaN) and masked out of the softmax, so its P is exactly 0 and no zero-fill or
// per-copy test is needed in the loads. Requires kv_len >= 1. A page id outside the pool is not
// read: page 0 (which exists, request_kv) stands in, and cta_page_fault() records it.
template <class T>
__device__ __forceinline__ void key_offsets(const PrefillParams& p, const int32_t* pages,
                                            int kv_len, int n0, int64_t* k_off, int64_t* v_off,
                                            CtaPageFault& fault = cta_page_fault()) {
  const int key = min(n0 + static_cast<int>(threadIdx.x), kv_len - 1);
  const int slot = key / p.page_size;
  const int in_page = key - slot * p.page_size;
  int page = __ldg(pages + slot);
  if (!page_in_pool(p.guard, page)) [[unlikely]] {
    if (atomicCAS(&fault.flag, 0, 1) == 0) {
      fault.page = page;
      fault.index = (pages - p.kv_indices) + slot;
    }
    page = 0;
  }
  const int alloc = page / p.pages_per_alloc;
  const int64_t token = int64_t{page - alloc * p.pages_per_alloc} * p.page_size + in_page;
  k_off[threadIdx.x] = (alloc * p.k_stride_page + token * p.k_stride_token) * int64_t{sizeof(T)};
  v_off[threadIdx.x] = (alloc * p.v_stride_page + token * p.v_stride_token) * int64_t{sizeof(T)};
}

// 16-byte global -> shared copy of real data (no zero-fill).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Gathers kBlockN rows of kChunks 16-byte chunks (byte offsets from key_offsets) into a swizzled
// tile. When a pass of the block covers a multiple of 8 rows, a thread keeps one chunk column and
// one swizzle for all its rows, so each copy costs an offset load and an add (head dims 64, 128).
// An fp8 cache (1-byte KV) has half the bytes per row: copy c lands in tile chunk 2c, to be
// widened by widen_e4m3_tile (fp8_tile.cuh, which numbers the copies the same way).
template <int kChunks, int kBlockN, int kThreads, class KV>
__device__ __forceinline__ void load_kv_tile(uint32_t tile, const KV* base,
                                             const int64_t* offsets) {
  constexpr int kRowBytes = kChunks * 16;
  constexpr int kStep = 2 / static_cast<int>(sizeof(KV));  // tile chunks per copy: 1, fp8 2
  constexpr int kCopies = kChunks / kStep;                 // copies per row
  static_assert(kBlockN * kCopies % kThreads == 0);
  if constexpr (kThreads % kCopies == 0 && (kThreads / kCopies) % 8 == 0) {
    constexpr int kRowsPerPass = kThreads / kCopies;
    const int row = static_cast<int>(threadIdx.x) / kCopies;
    const int copy = static_cast<int>(threadIdx.x) % kCopies;
    const uint32_t dst = tile + swizzled<kRowBytes>(row, copy * kStep);
    const char* src = reinterpret_cast<const char*>(base) + copy * 16;
#pragma unroll
    for (int it = 0; it < kBlockN / kRowsPerPass; ++it) {
      cp_async_16(dst + it * kRowsPerPass * kRowBytes, src + offsets[it * kRowsPerPass + row]);
    }
  } else {
#pragma unroll
    for (int it = 0; it < kBlockN * kCopies / kThreads; ++it) {
      const int i = it * kThreads + static_cast<int>(threadIdx.x);
      const int row = i / kCopies;
      const int copy = i % kCopies;
      cp_async_16(tile + swizzled<kRowBytes>(row, copy * kStep),
                  reinterpret_cast<const char*>(base) + offsets[row] + copy * 16);
    }
  }
}

// 2^x on the special-function unit (flushes subnormal results to 0; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The query tiles of request r (`count`: 0 past the batch or for a bad query range, which
// common/guard.h reports and which then has nothing read or written) and their inclusive prefix
// sum over the warp's lanes (lane l holding request r - (lane - l)).
template <int kBlockM>
__device__ __forceinline__ int warp_tile_scan(const PrefillParams& p, int r, int lane, int& count) {
  count = 0;
  if (r < p.batch_size) {
    const int q_begin = __ldg(p.qo_indptr + r), q_end = __ldg(p.qo_indptr + r + 1);
    if (query_rows_ok(p.guard, r, q_begin, q_end)) {
      count = ((q_end - q_begin) * p.group_size + kBlockM - 1) / kBlockM;
    }
  }
  int inclusive = count;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  return inclusive;
}

// Finds this CTA's (request, tile) from the per-request tile counts ceil(q_len * g / kBlockM).
// Returns false when the CTA is past the last tile.
template <int kBlockM, int kThreads>
__device__ __forceinline__ bool find_tile(const PrefillParams& p, int target, int& request,
                                          int& tile) {
  __shared__ int s_warp_sums[kThreads / 32];
  __shared__ int s_found[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    s_found[0] = -1;
    cta_page_fault().flag = 0;
  }
  // The grid's last CTA scans every request, so that a bad query range is reported even past the
  // requests with tiles; the others stop at their own.
  const bool scan_all = target == p.num_tiles_bound - 1;
  int base = 0;
  for (int chunk = 0; chunk < p.batch_size; chunk += kThreads) {
    const int r = chunk + static_cast<int>(threadIdx.x);
    int count;
    const int inclusive = warp_tile_scan<kBlockM>(p, r, lane, count);
    if (lane == 31) s_warp_sums[warp] = inclusive;
    __syncthreads();
    int before = base, total = base;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) before += s_warp_sums[w];
      total += s_warp_sums[w];
    }
    const int first = before + inclusive - count;
    if (count > 0 && target >= first && target < first + count) {
      s_found[0] = r;
      s_found[1] = count - 1 - (target - first);  // last tile first
    }
    base = total;
    __syncthreads();
    // Uniform: all threads read the same values.
    if ((s_found[0] >= 0 || target < base) && !scan_all) break;
  }
  request = s_found[0];
  tile = s_found[1];
  return request >= 0;
}

// find_tile for one warp, with no barrier (every warp that calls it finds the same tile): the
// warp-specialized kernel's roles look up each of their work units on their own.
template <int kBlockM>
__device__ __forceinline__ bool find_tile_warp(const PrefillParams& p, int target, int& request,
                                               int& tile) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const bool scan_all = target == p.num_tiles_bound - 1;  // reports every bad range (find_tile)
  int base = 0, found_request = -1, found_tile = 0;
  for (int chunk = 0; chunk < p.batch_size; chunk += 32) {
    const int r = chunk + lane;
    int count;
    const int inclusive = warp_tile_scan<kBlockM>(p, r, lane, count);
    const int first = base + inclusive - count;
    const unsigned mine =
        __ballot_sync(0xffffffffu, count > 0 && target >= first && target < first + count);
    if (mine != 0) {
      const int src = __ffs(mine) - 1;
      found_request = __shfl_sync(0xffffffffu, r, src);
      found_tile = __shfl_sync(0xffffffffu, count - 1 - (target - first), src);  // last first
    }
    base += __shfl_sync(0xffffffffu, inclusive, 31);
    if ((found_request >= 0 || target < base) && !scan_all) break;
  }
  request = found_request;
  tile = found_tile;
  return request >= 0;
}

// The KV of request `request` (q_len query rows): its page ids and kv_len, the metadata checked
// (common/guard.cuh): kv_len 0 (rows 0 / -inf) when it is bad or q_len > kv_len.
struct RequestKv {
  const int32_t* pages;
  int kv_len;
};
__device__ __forceinline__ RequestKv request_kv(const PrefillParams& p, int request, int q_len) {
  const int page_begin = p.kv_indptr[request];
  const int page_end = p.kv_indptr[request + 1];
  const int last_page_len = p.kv_last_page_len[request];
  int kv_len = 0;
  if (kv_metadata_ok(p.guard, p.kv_indices, request, page_begin, page_end, last_page_len,
                     p.page_size)) {
    kv_len = page_end > page_begin ? (page_end - page_begin - 1) * p.page_size + last_page_len : 0;
    if (!q_len_within_kv(p.guard, request, q_len, kv_len)) kv_len = 0;
  }
  return {p.kv_indices + page_begin, kv_len};
}

// Whether this CTA's keys met a page id outside the pool (key_offsets): the caller then writes the
// CTA's rows as 0 / -inf, and reports it at its end (report_cta_bad_page: one thread, once the
// accumulators are dead, so that no call holds them). After the key loop.
__device__ __forceinline__ bool cta_met_bad_page() { return cta_page_fault().flag != 0; }
__device__ __forceinline__ void report_cta_bad_page(const PrefillParams& p, int request) {
  const CtaPageFault& fault = cta_page_fault();
  report_page(p.guard, request, fault.index, fault.page);
}

// This CTA's keys: [lo, hi) of its rows' causal / window range, cut to its KV chunk when the
// launcher split the KV (params.h). `end` bounds the visible keys (kv_len, or the chunk's end; the
// last chunk always runs to kv_len, so a low page-count hint costs speed, never keys).
struct KeyRange {
  int lo, hi, end;
};
__device__ __forceinline__ KeyRange split_range(const PrefillParams& p, int lo, int hi,
                                                int kv_len) {
  if (p.num_kv_chunks <= 1) return {lo, hi, kv_len};
  const int chunk = static_cast<int>(blockIdx.y);
  const int begin = chunk * p.kv_chunk_tokens;
  const int end = chunk + 1 == p.num_kv_chunks ? kv_len : min(kv_len, begin + p.kv_chunk_tokens);
  return {max(lo, begin), min(hi, end), end};
}

// The work of a query tile (request `request`'s tile `tile`, KV head `kv_head`), as every prefill
// kernel sets it up: its rows, its KV (request_kv: checked) and its keys [lo, hi) of the rows'
// causal / window range, cut to the CTA's KV chunk (split_range), in kBlockN-key blocks. Query
// token t sits at KV position pos_shift + t; first_pos / last_pos are the tile's first and last
// rows' positions.
struct TileWork {
  int kv_head, request, row0, q_begin, num_rows, kv_len, pos_shift, first_pos, last_pos;
  int lo, hi, end, num_blocks;
  const int32_t* pages;
};
template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileWork tile_work(const PrefillParams& p, int request, int tile,
                                              int kv_head) {
  TileWork w;
  w.kv_head = kv_head;
  w.request = request;
  const int g = p.group_size;
  w.q_begin = p.qo_indptr[request];
  const int q_len = p.qo_indptr[request + 1] - w.q_begin;
  w.num_rows = q_len * g;
  w.row0 = tile * kBlockM;
  const RequestKv request_keys = request_kv(p, request, q_len);
  w.kv_len = request_keys.kv_len;
  w.pages = request_keys.pages;
  w.pos_shift = w.kv_len - q_len;
  w.first_pos = w.pos_shift + w.row0 / g;
  w.last_pos = w.pos_shift + (min(w.row0 + kBlockM, w.num_rows) - 1) / g;
  const KeyRange range = split_range(
      p, p.window_left >= 0 ? max(0, w.first_pos - p.window_left) / kBlockN * kBlockN : 0,
      p.causal ? min(w.kv_len, w.last_pos + 1) : w.kv_len, w.kv_len);
  w.lo = range.lo;
  w.hi = range.hi;
  w.end = range.end;
  w.num_blocks = w.hi > w.lo ? (w.hi - w.lo + kBlockN - 1) / kBlockN : 0;
  return w;
}

// Split-KV epilogue of one (row, head): where its partials live (params.h).
__device__ __forceinline__ int64_t partial_index(const PrefillParams& p, int64_t token, int head) {
  return (int64_t{blockIdx.y} * p.num_qo_rows + token) * p.num_qo_heads + head;
}

// T: q, out and the MMA inputs (bf16 / f16); KV: the cache, T or __nv_fp8_e4m3 (widened to T).
template <class T, int kHeadDimQk, int kHeadDimVo, class KV = T>
__global__ void __launch_bounds__(TileConfig<kHeadDimQk, kHeadDimVo>::kThreads, 2)
    prefill_kernel(const __grid_constant__ PrefillParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  constexpr bool kFp8 = std::is_same_v<KV, __nv_fp8_e4m3>;
  static_assert(kFp8 || std::is_same_v<KV, T>, "KV: the q dtype or fp8 e4m3");
  using Config = TileConfig<kHeadDimQk, kHeadDimVo>;
  constexpr int kThreads = Config::kThreads;
  constexpr int kMTiles = Config::kMTiles;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kNTiles = kBlockN / 8;     // n8 tiles of S
  constexpr int kOTiles = kHeadDimVo / 8;  // n8 tiles of O
  constexpr int kQkRowBytes = kHeadDimQk * 2;
  constexpr int kVoRowBytes = kHeadDimVo * 2;
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem);
  const uint32_t s_k = s_q + Config::kQBytes;
  const uint32_t s_v = s_k + Config::kKBytes;
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + Config::kQBytes + Config::kKBytes +
                                              Config::kVBytes);  // [2 tiles][K, V][kBlockN]

  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  int request, tile;
  if (!find_tile<kBlockM, kThreads>(p, static_cast<int>(blockIdx.x / p.num_kv_heads), request,
                                    tile)) {
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = p.group_size;
  const TileWork w = tile_work<kBlockM, kBlockN>(p, request, tile, kv_head);
  const int q_begin = w.q_begin, num_rows = w.num_rows, row0 = w.row0;
  const int kv_len = w.kv_len, pos_shift = w.pos_shift;
  const int32_t* pages = w.pages;

  // The KV position of each of this thread's rows (2 per m16 tile; rows past the end repeat the
  // last one).
  int row_pos[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + warp * Config::kRowsPerWarp + mt * 16 + (lane >> 2) + h * 8;
      row_pos[mt][h] = pos_shift + min(row, num_rows - 1) / g;
    }
  }
  // The CTA's key range: from the first row's window start to the last row's causal end.
  const int first_pos = w.first_pos, last_pos = w.last_pos;
  const int cta_lo = w.lo, cta_hi = w.hi, key_end = w.end, num_blocks = w.num_blocks;

  const KV* k_base = static_cast<const KV*>(p.k) + kv_head * p.k_stride_head;
  const KV* v_base = static_cast<const KV*>(p.v) + kv_head * p.v_stride_head;

  float o[kMTiles][kOTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // max in log2 units (scaled logits)
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = -INFINITY;
      row_sum[mt][h] = 0.0f;
    }
  }

  if (num_blocks > 0) {
    // Q tile: row r is token r / g, head kv_head * g + r % g; rows past the end are zero.
    const T* q = static_cast<const T*>(p.q);
    static_assert(kBlockM * Config::kChunksQk % kThreads == 0);
#pragma unroll 4
    for (int it = 0; it < kBlockM * Config::kChunksQk / kThreads; ++it) {
      const int i = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = i / Config::kChunksQk, chunk = i % Config::kChunksQk;
      const int row = row0 + r;
      const bool valid = row < num_rows;
      const int token = valid ? row / g : 0;
      const int head = kv_head * g + (valid ? row - token * g : 0);
      const T* src = q + (q_begin + token) * p.q_stride_token + head * p.q_stride_head + chunk * 8;
      cp_async_16(s_q + swizzled<kQkRowBytes>(r, chunk), src, valid ? 16 : 0);
    }
    if (threadIdx.x < kBlockN) {
      key_offsets<KV>(p, pages, kv_len, cta_lo, s_off, s_off + kBlockN);
    }
    __syncthreads();
    load_kv_tile<Config::kChunksQk, kBlockN, kThreads>(s_k, k_base, s_off);
    cp_async_commit();
  }

  const float scale_log2 = p.sm_scale * kLog2e;
  const bool soft_cap = p.logits_soft_cap > 0.0f;
  const float cap_inv = soft_cap ? p.sm_scale / p.logits_soft_cap : 0.0f;
  const float cap_log2 = p.logits_soft_cap * kLog2e;

  // Per-lane ldmatrix byte offsets. In every fragment below a lane reads row (lane % 8) of an 8-row
  // group and chunk 2 * c + hi; chunk 2 * c + hi ^ row % 8 only changes the low 3 bits, so the
  // swizzle of chunk 8 * j + 2 * c + hi is 128 * j bytes plus one of four per-lane offsets, and all
  // the rest of each address is a compile-time immediate (keeps the addresses out of registers).
  uint32_t q_lane[4], k_lane[4], v_lane[4];
  {
    const int q_row = warp * Config::kRowsPerWarp + (lane & 15);
    const int k_row = ((lane >> 4) << 3) + (lane & 7);
    const int v_row = (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      q_lane[c] = s_q + swizzled<kQkRowBytes>(q_row, 2 * c + (lane >> 4));
      k_lane[c] = s_k + swizzled<kQkRowBytes>(k_row, 2 * c + ((lane >> 3) & 1));
      v_lane[c] = s_v + swizzled<kVoRowBytes>(v_row, 2 * c + (lane >> 4));
    }
  }

  for (int block = 0; block < num_blocks; ++block) {
    const int n0 = cta_lo + block * kBlockN;
    const int64_t* offsets = s_off + (block & 1) * 2 * kBlockN;
    cp_async_wait_all();   // K_j (and Q)
    if constexpr (kFp8) {  // this thread's copies of K_j, widened in place (fp8_tile.cuh)
      widen_e4m3_tile<T, Config::kChunksQk, kBlockN, kThreads>(
          s_k, [](int row, int chunk) { return swizzled<kQkRowBytes>(row, chunk); });
    }
    __syncthreads();  // ... visible to all; every warp is done with V_{j-1}
    load_kv_tile<Config::kChunksVo, kBlockN, kThreads>(s_v, v_base, offsets + kBlockN);
    cp_async_commit();

    // S = Q K^T
    float s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kHeadDimQk / 16; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ldmatrix_x4(a[mt], q_lane[ks % 4] + (ks / 4) * 128 + mt * 16 * kQkRowBytes);
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_lane[ks % 4] + (ks / 4) * 128 + np * 16 * kQkRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma<T>::run(s[mt][2 * np], a[mt], b[0], b[1]);
          Mma<T>::run(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Soft-cap (then S is in log2 units already) and mask; otherwise the scale is folded into the
    // exponent below (max of raw S times a positive scale = max of scaled S).
    float mul = scale_log2;
    if (soft_cap) {
      mul = 1.0f;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = cap_log2 * tanhf(s[mt][nt][e] * cap_inv);
        }
      }
    }
    const bool needs_mask = n0 + kBlockN > cta_hi || (p.causal && n0 + kBlockN - 1 > first_pos) ||
                            (p.window_left >= 0 && n0 < last_pos - p.window_left);
    if (needs_mask) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
            const int pos = row_pos[mt][e >> 1];
            const bool visible = key < key_end && (!p.causal || key <= pos) &&
                                 (p.window_left < 0 || key >= pos - p.window_left);
            if (!visible) s[mt][nt][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax: new row max, P = exp2(S * mul - max), rescale the running sum and, when a
    // max moved anywhere in the warp, O.
    float alpha[kMTiles][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = s[mt][0][2 * h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          m = fmaxf(m, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = fmaxf(row_max[mt][h], m * mul);
        const float m_use = m == -INFINITY ? 0.0f : m;  // a row with nothing seen yet
        alpha[mt][h] = fast_exp2(row_max[mt][h] - m_use);
        moved |= m != row_max[mt][h];
        row_max[mt][h] = m;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          s[mt][nt][2 * h] = fast_exp2(fmaf(s[mt][nt][2 * h], mul, -m_use));
          s[mt][nt][2 * h + 1] = fast_exp2(fmaf(s[mt][nt][2 * h + 1], mul, -m_use));
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
      }
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][nt][e] *= alpha[mt][e >> 1];
        }
      }
    }

    // Offsets of the next tile's keys, then wait for V_j; every warp is done with K_j after this.
    const bool has_next = block + 1 < num_blocks;
    if (has_next && threadIdx.x < kBlockN) {
      int64_t* next = s_off + ((block + 1) & 1) * 2 * kBlockN;
      key_offsets<KV>(p, pages, kv_len, n0 + kBlockN, next, next + kBlockN);
    }
    cp_async_wait_all();
    if constexpr (kFp8) {  // ... of V_j
      widen_e4m3_tile<T, Config::kChunksVo, kBlockN, kThreads>(
          s_v, [](int row, int chunk) { return swizzled<kVoRowBytes>(row, chunk); });
    }
    __syncthreads();
    if (has_next) {
      load_kv_tile<Config::kChunksQk, kBlockN, kThreads>(s_k, k_base,
                                                         s_off + ((block + 1) & 1) * 2 * kBlockN);
      cp_async_commit();
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_lane[dp % 4] + (dp / 4) * 128 + kk * 16 * kVoRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma<T>::run(o[mt][2 * dp], a[mt], b[0], b[1]);
          Mma<T>::run(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // Epilogue: out = O / l (0 for a row that saw no key), lse = ln(sum exp(logits)); 0 / -inf (or a
  // poisoned partial) when the keys met a page id outside the pool.
  const bool bad_page = cta_met_bad_page();
  if (bad_page) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
      }
      row_sum[mt][0] = row_sum[mt][1] = 0.0f;
    }
  }
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row0 + warp * Config::kRowsPerWarp + mt * 16 + (lane >> 2) + h * 8;
      if (row >= num_rows) continue;
      const int token = row / g;
      const int head = kv_head * g + (row - token * g);
      const float inv = l > 0.0f ? (kFp8 ? p.v_scale : 1.0f) / l : 0.0f;
      if (p.num_kv_chunks > 1) {
        const int64_t index = partial_index(p, q_begin + token, head);
        float* part = p.partial_out + index * kHeadDimVo + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt) {
          *reinterpret_cast<float2*>(part + nt * 8) =
              make_float2(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
        }
        if ((lane & 3) == 0) {
          p.partial_lse[index] = bad_page   ? poisoned_partial()
                                 : l > 0.0f ? row_max[mt][h] + __log2f(l)
                                            : -INFINITY;
        }
        continue;
      }
      T* dst =
          out + (q_begin + token) * p.out_stride_token + head * p.out_stride_head + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        const uint32_t packed = Mma<T>::pack(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(dst + nt * 8) = packed;
      }
      if (p.lse != nullptr && (lane & 3) == 0) {
        p.lse[(q_begin + token) * p.lse_stride_token + head * p.lse_stride_head] =
            l > 0.0f ? (row_max[mt][h] + __log2f(l)) / kLog2e : -INFINITY;
      }
    }
  }
  if (bad_page && threadIdx.x == 0) report_cta_bad_page(p, request);
}

}  // namespace pagedattn::cuda::prefill
