// The split-KV paged decode kernel on tensor cores (mma.sync m16n8k16, f32 accumulate), for bf16
// or f16 KV with q of the same dtype. The CUDA-core kernel (decode_kernel.cuh) serves the rest.
//
// Grid: work item x (KV head x group tile), head tiles fastest: a CTA takes one work item (a chunk
// of one request's KV from the split-KV partition) for one KV head and up to 16 of its query
// heads. Those heads are the 16 rows of the MMA (M = 16, padded with zero rows), so each K/V byte
// is read from memory once for the whole group, and the MMA does the group's QK and PV at once.
//
// Warps are independent: the chunk is cut into steps of kStep tokens, and warp w takes steps
// w, w + kWarps, ... with its own shared-memory ring of kStages steps, its own cp.async groups
// (__syncwarp only) and its own online softmax. Per step:
//   load  cp.async 16-byte chunks, two token rows of D per warp instruction (coalesced); lane t
//         finds the page of token t once (kv_indices read one step ahead, so its latency hides
//         behind the compute) and the lanes exchange it by shuffle. Rows past the chunk's end are
//         zero-filled (the KV lines enter L2 evict-normal, an explicit cache policy). Rows
//         are XOR-swizzled by 16-byte chunk (chunk ^ row % 8): the ldmatrix reads below are free of
//         bank conflicts. (Per-lane 64-bit row offsets, the page slot advanced by constants,
//         issue fewer instructions but measured 10% slower at P 16 on 16-256 x 8192-32768 and 3%
//         faster at P 1, side by side on the H200: bench/RESULTS.md, session 3.)
//   S     = Q K^T: Q's A fragments (ldmatrix from shared memory, kept in registers for D <= 128),
//         K's B fragments by ldmatrix; f32 accumulators, scaled (and soft-capped) in f32.
//   soft  rows live in 4 lanes: max by two shuffles, exp2 in place, per-lane partial sums.
//   O    += P V: P's A fragments are the S accumulators packed to 16 bits (no shared memory);
//         V's B fragments by ldmatrix.trans.
// At the end the warps' (m, l, O) meet once in shared memory (reusing the rings): each row's warp
// weights and lse are computed once, then the CTA writes out / lse directly (request served by
// one item) or the f32 partials of its item; the last CTA of a split request's head tile to
// finish (an acquire-release arrival count in the workspace, reset to zero by that CTA; no fences)
// merges the request's partials from L2 in one pass, a batch of items' lse and partials read at
// once (or, with DecodeParams::merge_read, the partials staged in shared memory by bulk copies
// first): no merge kernel. These three cut the CUDA-graph step at B 1 x 1024 by 15% (H100,
// bench/RESULTS.md, session 30), from where the phase stamps (DecodeParams::trace) showed the
// time going: the merge 2.8 us of a 7.7 us layer.
// (Thread block clusters that combine in distributed shared memory instead of the L2 were built
// and measured three times, sessions 19, 30 and 32, and lost or tied each time: bench/RESULTS.md,
// "Tried and retired", "Thread-block clusters ...". Read those entries before a fourth.)
// Metadata on trust (common/guard.h): a request with bad KV metadata gets no keys (decode_work);
// a page id outside the pool is zero-filled instead of read, and the CTA's rows are written as
// 0 / -inf (a split item poisons its partial lse, and the merge writes 0 / -inf for the row).
//
// Diagnostic: with DecodeParams::trace set, thread 0 of each CTA stamps the global timer at each
// phase (DecodeTrace in include/pagedattn/cuda_graph.h names them); a null trace costs a branch.
// Launched with programmatic dependent launch (cuda/launch.h): pdl_wait() is the kernel's first
// statement, before the partition is read and before a CTA past the item count returns, except
// where the launcher sets DecodeParams::early_metadata: then the partition, the request's
// metadata and its first page ids are read before the wait (their round trips overlap the
// previous kernel's tail), and q, K / V and every write come after it (decode_params.h says why
// that is safe). (K / V before the wait too, all but the newest token's row, made the CUDA-graph
// step of attention alone 10-16% faster but Qwen3-0.6B's decode step 3-7% slower: bench/RESULTS.md,
// "Tried and retired".) An L2 prefetch of those rows before the wait instead (DecodeKvPrefetch, off
// by default until a model step is measured with it) made the graph step with a cache per layer
// 12-27% faster and the single kernels at B 1 up to 13% slower (bulk; bench/RESULTS.md, session
// 31).
#pragma once

#include <cmath>
#include <type_traits>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/guard.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_work.cuh"
#include "cuda/launch.h"
#include "cuda/prefill/wgmma.cuh"

namespace pagedattn::cuda {

template <int kHeadDim>
struct TcDecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16;                        // MMA M: query heads of the CTA
  static constexpr int kStep = kHeadDim == 64 ? 32 : 16;  // tokens per warp step
  static constexpr int kStages = 3;                       // steps in a warp's ring
  static constexpr int kChunksPerRow = kHeadDim / 8;      // 16-byte chunks per token row
  static constexpr int kRowsPerCopy = 32 / kChunksPerRow < 1 ? 1 : 32 / kChunksPerRow;
  static constexpr int kCopyIters = kStep * kChunksPerRow / 32;  // per K (and per V) per step
  static constexpr int kStepElems = kStep * kHeadDim;            // one step of K (or V)
  static constexpr int kRingElems = 2 * kStages * kStepElems;    // K and V stages of one warp
  static constexpr bool kQInRegisters = kHeadDim <= 128;
  static constexpr int kCombineStride = kHeadDim + 8;  // f32 row stride of the final combine
  static constexpr int kMinCtasPerSm = kHeadDim <= 128 ? 2 : 1;

  static constexpr size_t kRingBytes = size_t{2} * kWarps * kRingElems;
  static constexpr size_t kQBytes = size_t{2} * kRows * kHeadDim;
  static constexpr size_t kSmemBytes = kRingBytes + kQBytes;

  static_assert(kStep % 16 == 0 && kStep <= 32);
  static_assert(kChunksPerRow <= 32 && 32 % kChunksPerRow == 0);
  static_assert(kCopyIters * 32 == kStep * kChunksPerRow);
  // The combine (warps' O, m, l in f32) reuses the rings.
  // ... and so do the rows' warp weights and lse after it.
  static_assert(sizeof(float) * (kWarps * kRows * (kCombineStride + 3) + kRows) <= kRingBytes);
  static_assert(kCombineStride % 4 == 0);  // float4 rows
  static_assert(kSmemBytes * kMinCtasPerSm <= 227 * 1024);

  // Element offset of (row, 16-byte chunk) in a [rows][kHeadDim] swizzled tile.
  __device__ static int offset(int row, int chunk) {
    return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
  }
};

namespace tc {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The L2 policy of the KV loads: evict-normal. (Evict-first gained 7% at B 1 and lost 5% at 16 and
// 64 x 8192 on the H200: bench/RESULTS.md, "Tried and retired".)
__device__ __forceinline__ uint64_t kv_load_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp_async_16 (zero fill when !valid) with an L2 cache policy.
__device__ __forceinline__ void cp_async_16_policy(void* smem, const void* gmem, bool valid,
                                                   uint64_t policy) {
  const uint32_t dst = smem_address(smem);
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(gmem), "r"(src_bytes), "l"(policy)
               : "memory");
}

// d += a b for one m16n8k16 tile; T picks the 16-bit input type.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// atomicAdd with acquire-release semantics at GPU scope; returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* address, int value) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(address), "r"(value)
               : "memory");
  return old;
}

// ---- the merge's bulk read (DecodeParams::merge_read, sm_90+) ----
// Orders this thread's earlier generic-proxy accesses (global and shared) before later
// async-proxy ones (bulk copies).
__device__ __forceinline__ void fence_proxy_async_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async;\n" ::: "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// SM's copy engine, completing on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes,
                                                    uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      :
      : "r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

// Two floats as one register of two 16-bit T (x in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  uint32_t word;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
    memcpy(&word, &pair, 4);
  } else {
    const __half2 pair = __floats2half2_rn(x, y);
    memcpy(&word, &pair, 4);
  }
  return word;
}

}  // namespace tc

template <int kHeadDim, class T>
__global__ void __launch_bounds__(TcDecodeConfig<kHeadDim>::kThreads,
                                  TcDecodeConfig<kHeadDim>::kMinCtasPerSm)
    decode_tc_kernel(const DecodeParams p) {
  // Diagnostic phase stamps (DecodeParams::trace, DecodeTrace's phases): thread 0's global timer.
  // The stamp rows are this launch's own, so their stores may come before the wait.
  unsigned long long* const trace = p.trace != nullptr && threadIdx.x == 0
                                        ? p.trace + int64_t{blockIdx.x} * kDecodeTraceWords
                                        : nullptr;
  const auto stamp = [trace](DecodeTracePhase phase) {
    if (trace != nullptr) [[unlikely]] {
      trace[phase] = global_timer_ns();
      // The SM's cycles beside the first and last stamps: its clock rate while the CTA ran.
      if (phase == kTraceStart) trace[kDecodeTracePhases] = clock64();
      if (phase == kTraceEnd) trace[kDecodeTracePhases + 1] = clock64();
    }
  };
  stamp(kTraceStart);
  const bool early = p.early_metadata;
  if (!early) pdl_wait();  // first (cuda/launch.h), unless the metadata may be read before it
  using C = TcDecodeConfig<kHeadDim>;
  constexpr int kStep = C::kStep;
  constexpr int kNTiles = kStep / 8;      // n8 tiles of S per step
  constexpr int kKSteps = kHeadDim / 16;  // k16 steps of QK
  constexpr int kOTiles = kHeadDim / 8;   // n8 tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* ring_base = reinterpret_cast<T*>(smem_raw);
  T* q_smem = reinterpret_cast<T*>(smem_raw + C::kRingBytes);  // [16][D], swizzled

  // Grid: items x head tiles, the head tiles of an item side by side. The work (decode_work.cuh,
  // shared with the CUDA-core kernel): the metadata reads are issued together (a chain of
  // dependent reads is a chain of latencies).
  const int head_tiles = p.num_kv_heads * p.group_tiles;
  const int item = blockIdx.x / head_tiles;
  const int head_tile = blockIdx.x - item * head_tiles;
  DecodeWork work;
  if (!decode_work(p, item, head_tile, work)) {
    if (early) pdl_wait();  // every CTA waits: this grid's end implies its predecessor's
    stamp(kTraceEnd);
    return;
  }
  stamp(kTraceMetadata);
  const int request = work.request;
  const bool split = work.split;
  const int merge_first = work.merge_first;  // this request's items (the merge in the last CTA)
  const int merge_items = work.merge_items;
  const int page_begin = work.page_begin;
  const int tok_begin = work.tok_begin, tok_end = work.tok_end;
  const int kv_head = work.kv_head, qo_head0 = work.qo_head0, heads = work.heads;
  const int page_size = p.page_size;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int num_steps = tok_end > tok_begin ? (tok_end - tok_begin + kStep - 1) / kStep : 0;
  const int my_steps = num_steps > warp ? (num_steps - warp + C::kWarps - 1) / C::kWarps : 0;

  // ---- this warp's K/V pipeline ----
  T* k_ring = ring_base + warp * C::kRingElems;
  T* v_ring = k_ring + C::kStages * C::kStepElems;
  const T* k_cache = static_cast<const T*>(p.k) + kv_head * p.k_stride_head;
  const T* v_cache = static_cast<const T*>(p.v) + kv_head * p.v_stride_head;
  const uint64_t stream_policy = tc::kv_load_policy();
  // Lane l owns token (l % kStep) of a step: its page id, read one step ahead (-1: past the end,
  // or an id outside the pool: zero-filled, never read; the CTA's rows then get 0 / -inf).
  bool saw_bad_page = false;
  // Lane l's token of step j (its position in the request), and where the row of a token at
  // `pos` on attention page `page` (>= 0) lies: its allocation page and its row in that page.
  auto step_pos = [&](int j) { return tok_begin + (warp + j * C::kWarps) * kStep + lane % kStep; };
  auto alloc_of = [&](int page) { return page / p.pages_per_alloc; };
  auto row_in_alloc = [&](int page, int pos) {
    return (page - alloc_of(page) * p.pages_per_alloc) * page_size + pos % page_size;
  };
  auto fetch_page = [&](int j) {
    const int pos = step_pos(j);
    if (j >= my_steps || pos >= tok_end) return -1;
    const int index = page_begin + pos / page_size;
    const int page = __ldcg(p.kv_indices + index);  // L2: it may be read before pdl_wait()
    if (!page_in_pool(p.guard, page)) [[unlikely]] {
      saw_bad_page = true;
      note_bad_page(cta_bad_page_note(), index, page);  // reported after the combine (guard.cuh)
      return -1;
    }
    return page;
  };
  auto load_step = [&](int j, int stage, int page) {
    const int alloc = page >= 0 ? alloc_of(page) : -1;
    const int token_in_alloc = page >= 0 ? row_in_alloc(page, step_pos(j)) : 0;
    T* k_stage = k_ring + stage * C::kStepElems;
    T* v_stage = v_ring + stage * C::kStepElems;
    const int chunk_in_row = lane % C::kChunksPerRow;
#pragma unroll
    for (int i = 0; i < C::kCopyIters; ++i) {
      const int row = i * C::kRowsPerCopy + lane / C::kChunksPerRow;
      const int row_alloc = __shfl_sync(0xffffffffu, alloc, row);
      const int row_token = __shfl_sync(0xffffffffu, token_in_alloc, row);
      const bool valid = row_alloc >= 0;
      const T* k_src = k_cache;
      const T* v_src = v_cache;
      if (valid) {
        k_src += row_alloc * p.k_stride_page + row_token * p.k_stride_token + chunk_in_row * 8;
        v_src += row_alloc * p.v_stride_page + row_token * p.v_stride_token + chunk_in_row * 8;
      }
      const int dst = C::offset(row, chunk_in_row);
      tc::cp_async_16_policy(k_stage + dst, k_src, valid, stream_policy);
      tc::cp_async_16_policy(v_stage + dst, v_src, valid, stream_policy);
    }
  };
  int next_page;
  {
    int pages[C::kStages];  // all issued before the first is used
#pragma unroll
    for (int s = 0; s < C::kStages; ++s) pages[s] = fetch_page(s);
    if (early && p.kv_prefetch != kKvPrefetchNone && lane < kStep) {
      // Those steps' K / V rows asked of the L2 now (DecodeKvPrefetch: safe before the wait).
      constexpr int kRowBytes = kHeadDim * sizeof(T);
#pragma unroll
      for (int s = 0; s < C::kStages; ++s) {
        if (pages[s] < 0) continue;
        const int alloc = alloc_of(pages[s]);
        const int token = row_in_alloc(pages[s], step_pos(s));
        const char* k_row = reinterpret_cast<const char*>(k_cache + alloc * p.k_stride_page +
                                                          token * p.k_stride_token);
        const char* v_row = reinterpret_cast<const char*>(v_cache + alloc * p.v_stride_page +
                                                          token * p.v_stride_token);
        if (p.kv_prefetch == kKvPrefetchBulk) {
          prefetch_l2_bulk(k_row, kRowBytes);
          prefetch_l2_bulk(v_row, kRowBytes);
        } else {
#pragma unroll
          for (int line = 0; line < kRowBytes; line += 128) {
            prefetch_l2_line(k_row + line);
            prefetch_l2_line(v_row + line);
          }
        }
      }
    }
    stamp(kTracePageIds);
    if (early) pdl_wait();  // K / V, q and every write come after it
    stamp(kTraceWaitDone);
    pdl_trigger();          // after the wait: the next kernel's early reads rely on it
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < my_steps) load_step(s, s, pages[s]);
      cp_async_commit();
    }
    next_page = pages[C::kStages - 1];
  }

  // ---- q of this CTA's heads: [16][D] in shared memory, rows past `heads` zero ----
  // 16-byte pieces where q's rows are 16-byte aligned (the usual case), each thread's loads all
  // issued before its first store: one round trip after the wait, where element by element took
  // several. Through L2 (ld.global.cg): q is the previous kernel's output.
  {
    const T* q =
        static_cast<const T*>(p.q) + request * p.q_stride_batch + qo_head0 * p.q_stride_head;
    constexpr int kChunks = kHeadDim / 8;  // 16-byte pieces of a row
    constexpr int kPerThread = C::kRows * kChunks / C::kThreads;
    static_assert(kPerThread * C::kThreads == C::kRows * kChunks);
    const uintptr_t alignment =
        reinterpret_cast<uintptr_t>(q) | static_cast<uintptr_t>(p.q_stride_head * sizeof(T));
    if (alignment % 16 == 0) {
      uint4 piece[kPerThread];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int idx = tid + i * C::kThreads;
        const int row = idx / kChunks;
        piece[i] =
            row < heads
                ? __ldcg(reinterpret_cast<const uint4*>(q + row * p.q_stride_head) + idx % kChunks)
                : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int idx = tid + i * C::kThreads;
        *reinterpret_cast<uint4*>(q_smem + C::offset(idx / kChunks, idx % kChunks)) = piece[i];
      }
    } else {
      const T zero = from_float<T>(0.0f);
      for (int idx = tid; idx < C::kRows * kHeadDim; idx += C::kThreads) {
        const int row = idx / kHeadDim;
        const int d = idx % kHeadDim;
        q_smem[C::offset(row, d / 8) + d % 8] = row < heads ? q[row * p.q_stride_head + d] : zero;
      }
    }
  }
  __syncthreads();
  stamp(kTraceQLoaded);

  // Per-lane ldmatrix offsets (elements). Matrix j = lane / 8 of an x4 gets row lane % 8.
  const int group_row = lane / 4;  // fragment row g: rows g and g + 8 of S and O
  const int quad = lane % 4;       // fragment column pair 2 * quad
  // A (q, row-major 16 x 16): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (0-7, 8-15), (8-15,
  // 8-15).
  const int a_row = (lane / 8 % 2) * 8 + lane % 8;
  const int a_chunk = lane / 16;
  // B of QK (K rows, 16 tokens x 16 dims): (tokens 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15,
  // 8-15).
  const int k_row = (lane / 16) * 8 + lane % 8;
  const int k_chunk = lane / 8 % 2;
  // B of PV (V rows, 16 tokens x 16 dims, transposed): (tokens 0-7, d 0-7), (8-15, 0-7),
  // (0-7, 8-15), (8-15, 8-15).
  const int v_row = (lane / 8 % 2) * 8 + lane % 8;
  const int v_chunk = lane / 16;
  const uint32_t q_base = tc::smem_address(q_smem);

  uint32_t q_frag[C::kQInRegisters ? kKSteps : 1][4];
  if constexpr (C::kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      tc::ldmatrix_x4(q_frag[kk], q_base + 2 * C::offset(a_row, 2 * kk + a_chunk));
    }
  }

  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 domain)
  float l[2] = {0.0f, 0.0f};            // this lane's partial row sums

  for (int j = 0; j < my_steps; ++j) {
    cp_async_wait<C::kStages - 2>();
    __syncwarp();  // step j landed for every lane; every lane is done with step j - 1's stage
    if (j == 0) stamp(kTraceFirstKv);
    {
      const int ahead = j + C::kStages - 1;
      if (ahead < my_steps) load_step(ahead, ahead % C::kStages, next_page);
      cp_async_commit();
      next_page = fetch_page(ahead + 1);
    }
    const int stage = j % C::kStages;
    const uint32_t k_base = tc::smem_address(k_ring + stage * C::kStepElems);
    const uint32_t v_base = tc::smem_address(v_ring + stage * C::kStepElems);
    const int t0 = tok_begin + (warp + j * C::kWarps) * kStep;

    // ---- S = Q K^T ----
    float s[kNTiles][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a_reg[4];
      if constexpr (C::kQInRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a_reg[r] = q_frag[kk][r];
      } else {
        tc::ldmatrix_x4(a_reg, q_base + 2 * C::offset(a_row, 2 * kk + a_chunk));
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        tc::ldmatrix_x4(b, k_base + 2 * C::offset(np * 16 + k_row, 2 * kk + k_chunk));
        tc::mma<T>(s[2 * np], a_reg, b[0], b[1]);
        tc::mma<T>(s[2 * np + 1], a_reg, b[2], b[3]);
      }
    }

    // ---- online softmax (log2 domain) ----
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * p.q_scale;
        if (p.soft_cap > 0.0f) x = p.soft_cap_log2 * tanhf(x / p.soft_cap);
        const int pos = t0 + n * 8 + 2 * quad + (e & 1);
        x = pos < tok_end ? x : -INFINITY;
        s[n][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      alpha[r] = m_new == -INFINITY ? 1.0f : fast_exp2(m[r] - m_new);
      m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float row_max = m[e / 2];
        s[n][e] = row_max == -INFINITY ? 0.0f : fast_exp2(s[n][e] - row_max);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) sum += s[n][2 * r] + s[n][2 * r + 1];
      l[r] = l[r] * alpha[r] + sum;
    }
    // alpha is exactly 1 where a row's max did not move (most steps after the first few).
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }

    // ---- O += P V ----
#pragma unroll
    for (int kp = 0; kp < kStep / 16; ++kp) {
      const uint32_t p_frag[4] = {tc::pack2<T>(s[2 * kp][0], s[2 * kp][1]),
                                  tc::pack2<T>(s[2 * kp][2], s[2 * kp][3]),
                                  tc::pack2<T>(s[2 * kp + 1][0], s[2 * kp + 1][1]),
                                  tc::pack2<T>(s[2 * kp + 1][2], s[2 * kp + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        uint32_t b[4];
        tc::ldmatrix_x4_trans(b, v_base + 2 * C::offset(kp * 16 + v_row, 2 * dp + v_chunk));
        tc::mma<T>(o[2 * dp], p_frag, b[0], b[1]);
        tc::mma<T>(o[2 * dp + 1], p_frag, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();
  stamp(kTraceLoopDone);

  // ---- combine the warps: [warp][16][kCombineStride] O, then [warp][16] m and l ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // Every warp is done with its ring; and whether any lane met a page id outside the pool.
  const bool bad_page = __syncthreads_or(saw_bad_page) != 0;
  stamp(kTraceCombined);
  float* combine_o = reinterpret_cast<float*>(smem_raw);
  float* combine_m = combine_o + C::kWarps * C::kRows * C::kCombineStride;
  float* combine_l = combine_m + C::kWarps * C::kRows;
  {
    float* mine = combine_o + warp * C::kRows * C::kCombineStride;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      const int d = n * 8 + 2 * quad;
      *reinterpret_cast<float2*>(mine + group_row * C::kCombineStride + d) =
          make_float2(o[n][0], o[n][1]);
      *reinterpret_cast<float2*>(mine + (group_row + 8) * C::kCombineStride + d) =
          make_float2(o[n][2], o[n][3]);
    }
    if (quad == 0) {
      combine_m[warp * C::kRows + group_row] = m[0];
      combine_m[warp * C::kRows + group_row + 8] = m[1];
      combine_l[warp * C::kRows + group_row] = l[0];
      combine_l[warp * C::kRows + group_row + 8] = l[1];
    }
  }
  __syncthreads();
  // Per row, once (a thread a row): each warp's weight exp2(m_w - M) times v_scale / total, and
  // the row's lse; then every 4 dims of a row are a kWarps-term sum of float4 (where each element
  // recomputed the row's maximum and weights).
  float* row_weight = combine_l + C::kWarps * C::kRows;  // [16][kWarps]
  float* row_lse = row_weight + C::kRows * C::kWarps;    // [16]
  if (tid < heads) {
    const int row = tid;
    float row_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) row_max = fmaxf(row_max, combine_m[w * C::kRows + row]);
    float weight[C::kWarps];
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      const float mw = combine_m[w * C::kRows + row];
      weight[w] = mw == -INFINITY ? 0.0f : fast_exp2(mw - row_max);
      total += weight[w] * combine_l[w * C::kRows + row];
    }
    // 0 / -inf, or a poisoned partial that makes the merge write them, for a bad page id.
    const float scale = total > 0.0f && !bad_page ? p.v_scale / total : 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) row_weight[row * C::kWarps + w] = weight[w] * scale;
    float lse = total > 0.0f ? (row_max + log2f(total)) * kLn2 : -INFINITY;
    if (bad_page) lse = split ? poisoned_partial() : -INFINITY;
    row_lse[row] = lse;
  }
  __syncthreads();
  constexpr int kRowQuads = kHeadDim / 4;
  for (int idx = tid; idx < heads * kRowQuads; idx += C::kThreads) {
    const int row = idx / kRowQuads;
    const int d = (idx % kRowQuads) * 4;
    float4 result = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      const float weight = row_weight[row * C::kWarps + w];
      const float4 x = *reinterpret_cast<const float4*>(
          combine_o + (w * C::kRows + row) * C::kCombineStride + d);
      result.x += weight * x.x;
      result.y += weight * x.y;
      result.z += weight * x.z;
      result.w += weight * x.w;
    }
    const float lse = row_lse[row];
    const int qo_head = qo_head0 + row;
    if (!split) {
      T* out =
          static_cast<T*>(p.out) + request * p.out_stride_batch + qo_head * p.out_stride_head + d;
      out[0] = from_float<T>(result.x);
      out[1] = from_float<T>(result.y);
      out[2] = from_float<T>(result.z);
      out[3] = from_float<T>(result.w);
      if (p.lse != nullptr && d == 0) {
        p.lse[request * p.lse_stride_batch + qo_head * p.lse_stride_head] = lse;
      }
    } else {
      *reinterpret_cast<float4*>(
          p.partial_out + (int64_t{item} * p.num_qo_heads + qo_head) * kHeadDim + d) = result;
      if (d == 0) p.partial_lse[int64_t{item} * p.num_qo_heads + qo_head] = lse;
    }
  }
  if (bad_page && tid == 0) report_noted_page(p.guard, request, cta_bad_page_note());
  stamp(kTraceWritten);
  if (!split) {
    stamp(kTraceEnd);
    return;
  }

  // ---- split request: the last of its items to finish (for this head tile) merges them ----
  //   lse = M + log(sum_i exp(lse_i - M)),  out = sum_i exp(lse_i - lse) * out_i.
  __shared__ int last_arrival;
  __syncthreads();  // every thread's partials are written; and the combine buffers are free
  if (tid == 0) {
    // One acquire-release atomic at GPU scope, no fences: its release is cumulative (the CTA's
    // partials, ordered before it by the barrier), its acquire makes the earlier items' partials
    // visible to the last one (and, through the barrier below, to all its threads).
    int* counter = p.merge_counters + int64_t{request} * head_tiles + head_tile;
    const int arrived = tc::atomic_add_acq_rel_gpu(counter, 1) + 1;
    last_arrival = arrived == merge_items;
    if (arrived == merge_items) *counter = 0;  // zero again for the next call (graph replays)
  }
  __syncthreads();
  stamp(kTraceCounted);
  if (!last_arrival) {
    stamp(kTraceEnd);
    return;
  }
  // The other CTAs' partials: read below with ld.cg (L2, never a stale L1).
  // A thread per 4 output dims of a row (float4 partials), in one pass: each batch of up to
  // kMergeBatch items has every item's lse and partial read at once (one L2 round trip a batch,
  // where the row's lse first and the weighted sum after took two or three), the running maximum
  // rescaling the sums between batches. A poisoned partial (an item that met a bad page id, a NaN)
  // makes the row 0 / -inf.
  constexpr int kQuads = kHeadDim / 4;
  constexpr int kMergeBatch = 16;
  T* out = static_cast<T*>(p.out) + request * p.out_stride_batch;
  // DecodeMergeRead kBulk: every item's partial rows of this head tile (heads x D f32, contiguous)
  // staged in the free rings by the copy engine first, where they all fit (sm_90+); the loop
  // below then reads them from shared memory instead of the L2.
  const float* staged = nullptr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t item_bytes = static_cast<uint32_t>(heads) * kHeadDim * sizeof(float);
  if (p.merge_read == kMergeReadBulk && int64_t{merge_items} * item_bytes <= C::kRingBytes) {
    __shared__ __align__(8) uint64_t staged_bar;
    const uint32_t bar = tc::smem_address(&staged_bar);
    float* stage = reinterpret_cast<float*>(smem_raw);
    tc::fence_proxy_async_all();  // each thread's combine accesses of the rings, before the copies
    __syncthreads();
    if (tid == 0) {
      prefill::sm90::mbarrier_init(bar, 1);
      tc::fence_proxy_async_all();  // the barrier's init, and the partials acquired above
      prefill::sm90::mbarrier_arrive_expect_tx(bar, merge_items * item_bytes);
      for (int i = 0; i < merge_items; ++i) {
        const int64_t slot = int64_t{merge_first + i} * p.num_qo_heads + qo_head0;
        tc::bulk_copy_to_shared(tc::smem_address(stage + int64_t{i} * heads * kHeadDim),
                                p.partial_out + slot * kHeadDim, item_bytes, bar);
      }
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    prefill::sm90::mbarrier_wait(bar, 0);
    staged = stage;
  }
#endif
  for (int idx = tid; idx < heads * kQuads; idx += C::kThreads) {
    const int row = idx / kQuads;
    const int d = (idx % kQuads) * 4;
    const int64_t head = qo_head0 + row;
    float big = -INFINITY, sum = 0.0f;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    bool nan = false;
    for (int base = 0; base < merge_items; base += kMergeBatch) {
      float item_lse[kMergeBatch];
      float4 part[kMergeBatch];
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        item_lse[i] = -INFINITY;
        if (base + i < merge_items) {
          const int64_t slot = int64_t{merge_first + base + i} * p.num_qo_heads + head;
          item_lse[i] = __ldcg(p.partial_lse + slot);
          part[i] =
              staged != nullptr
                  ? *reinterpret_cast<const float4*>(
                        staged + (int64_t{base + i} * heads + row) * kHeadDim + d)
                  : __ldcg(reinterpret_cast<const float4*>(p.partial_out + slot * kHeadDim + d));
        }
      }
      float batch_big = big;
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        nan |= item_lse[i] != item_lse[i];
        batch_big = fmaxf(batch_big, item_lse[i]);
      }
      if (batch_big == -INFINITY) continue;  // no keys in any item so far
      const float rescale = big == -INFINITY ? 0.0f : __expf(big - batch_big);
      sum *= rescale;
      value =
          make_float4(value.x * rescale, value.y * rescale, value.z * rescale, value.w * rescale);
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        if (!(item_lse[i] > -INFINITY)) continue;  // no keys (or past the items, or a NaN)
        const float w = __expf(item_lse[i] - batch_big);
        sum += w;
        value.x += w * part[i].x;
        value.y += w * part[i].y;
        value.z += w * part[i].z;
        value.w += w * part[i].w;
      }
      big = batch_big;
      if (base == 0 && idx == tid) stamp(kTraceMergeRead);  // the first batch read and summed
    }
    const bool keys = sum > 0.0f && !nan;
    const float inv = keys ? 1.0f / sum : 0.0f;
    T* dst = out + head * p.out_stride_head + d;
    dst[0] = from_float<T>(value.x * inv);
    dst[1] = from_float<T>(value.y * inv);
    dst[2] = from_float<T>(value.z * inv);
    dst[3] = from_float<T>(value.w * inv);
    if (p.lse != nullptr && d == 0) {
      p.lse[request * p.lse_stride_batch + head * p.lse_stride_head] =
          keys ? big + __logf(sum) : -INFINITY;
    }
  }
  stamp(kTraceEnd);
}

template <int kHeadDim, class T>
void launch_decode_tc_kernel(const DecodeParams& params, int grid_items, void* stream) {
  using C = TcDecodeConfig<kHeadDim>;
  auto* kernel = decode_tc_kernel<kHeadDim, T>;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmemBytes));
  PA_CUDA_CHECK(attribute_status);
  // One dimension, the head tiles of an item side by side: CTAs that run together read the same
  // pages (neighbouring rows of NHD pages, neighbouring blocks of HND pages).
  const int grid = grid_items * params.num_kv_heads * params.group_tiles;
  launch_kernel(kernel, grid, C::kThreads, C::kSmemBytes, static_cast<cudaStream_t>(stream),
                params);
  check_launch("decode_tc_kernel");
}

}  // namespace pagedattn::cuda
