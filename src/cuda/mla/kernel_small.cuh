// The CUDA MLA kernel for requests of at most 16 query rows (H <= 16 decode), bf16 cache: the
// contract of kernel.cuh (one CTA per block of request rows and work item of the split-KV
// partition, masking, partials of split requests), shaped for a read-bound step. The products are
// cheap there (16 rows against each 1152-byte latent row); what counts is keeping the cache read
// going with few instructions and no CTA-wide barrier per tile.
//
// The 8 warps are 4 independent pairs. Pair q takes the 32-token tiles q, q + 4, q + 8, ... of the
// CTA's range into a stage of its own (cp.async, 36 KiB; 64 threads, nine 16-byte copies per row
// slice) and runs its own online softmax over them; the pairs meet once, at the end, where their
// (O, max, sum) are combined through shared memory. Inside a pair (mma.sync m16n8k16, bf16 in, f32
// accumulate), warp w of the pair:
//   S [16 x 32] = Q K^T   the partial product over the k16 steps 18 w .. 18 w + 17 (4 token
//                         tiles of 8: four independent accumulator chains); the two partials meet
//                         through shared memory and both warps hold the whole S (a + b = b + a,
//                         bit for bit), so both take the same softmax decisions,
//   softmax               online, base 2, lazy: the reference max moves only when a row's max
//                         passes it by more than 2^8 (O is rarely rescaled),
//   O [16 x 256] += P V   output columns 256 w .. + 256 (128 f32 accumulators per thread), P from
//                         the S registers (the accumulator layout is the A operand layout).
// Three 64-thread barriers per tile (tile landed, partials written, stage read) and none across
// pairs: while one pair computes, the others' tiles stream in (up to 4 x 36 KiB in flight per SM).
// Rows are 16-byte-chunk XOR-swizzled (chunk ^ row % 8) so the ldmatrix reads are conflict-free.
// Each thread gathers 4 token rows of its pair's tiles; their attention pages are loaded one tile
// of the pair ahead. Tokens past the range re-read the last one (real data, masked). Every pair
// runs every round's barriers, idle or not, so all threads pass the same barrier sequence.
// Split requests: partials, merged by the merge kernel (a merge by the last CTA of the request
// lost to it: bench/RESULTS.md, "Tried and retired").
// Clusters (MlaParams::cluster = C > 1, sm_90): the C CTAs of a cluster share a work item, rank k
// taking the k-th run of whole tiles of its chunk; after the pairs are combined, each CTA's
// (O, lse) is combined across the cluster through distributed shared memory, rank k writing
// columns 512 k / C .. of every row (the output, or the item's partial when the request is split).
#pragma once

#include "cuda/mla/kernel.cuh"

namespace pagedattn::cuda::mla::small {

struct Tile {
  static constexpr int kRows = 16;
  static constexpr int kTokens = 32;
  static constexpr int kPairs = kWarps / 2;
  static constexpr int kPairThreads = 64;
  static constexpr int kRowBytes = kDimQk * 2;  // 1152
  static constexpr int kStageBytes = kTokens * kRowBytes;
  static constexpr int kSteps = kDimQk / 16 / 2;          // S k16 steps per warp
  static constexpr int kRowsPerThread = kTokens * 8 / kPairThreads;  // token rows gathered: 4
  static constexpr int kQ = 0;                                // [16][576] bf16
  static constexpr int kKv = kQ + kRows * kRowBytes;          // [pairs][32][576] bf16
  static constexpr int kExchange = kKv + kPairs * kStageBytes;  // f32 [pairs][2][4][32 lanes][4]
  // f32 [pairs][max|sum][16], then the combined lse [16]
  static constexpr int kStats = kExchange + kPairs * 2 * 4 * 32 * 16;
  static constexpr int kNote = kStats + (kPairs * 2 + 1) * kRows * 4;  // u64: a bad page id
  static constexpr int kBytes = kNote + 8;
  // The combine at the end reuses the stages: f32 [pairs][16][kORowFloats]. Rows are padded by 8
  // floats so that the eight rows a warp's float2 stores touch start in different banks (with
  // 512 they all start in bank 0: 8-way conflicts).
  static constexpr int kORowFloats = kRank + 8;
  static_assert(kPairs * kRows * kORowFloats * 4 <= kPairs * kStageBytes);
  static_assert(kBytes <= 227 * 1024, "one CTA per SM must fit");
};

// ---- clusters (sm_90): the CTA's rank, a barrier over the cluster, distributed shared memory ----
inline constexpr int kMaxCluster = 8;  // the portable cluster size

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define PAGEDATTN_NO_CLUSTERS  // the helpers trap (launch.cu never asks for a cluster there)
#endif
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank = 0;
#ifdef PAGEDATTN_NO_CLUSTERS
  __trap();
#else
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}
// Every thread of the cluster's CTAs: shared memory writes before it are visible to the cluster's
// reads after it.
__device__ __forceinline__ void cluster_sync() {
#ifdef PAGEDATTN_NO_CLUSTERS
  __trap();
#else
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
// The address of this CTA's shared memory address `addr` in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t map_cluster(uint32_t addr, int rank) {
  uint32_t out = addr;
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)rank;
  __trap();
#else
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v = 0.0f;
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)addr;
  __trap();
#else
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)addr;
  __trap();
#else
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

#undef PAGEDATTN_NO_CLUSTERS

__device__ __forceinline__ void pair_barrier(int pair) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(pair + 1), "n"(Tile::kPairThreads) : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_kernel_small(const __grid_constant__ MlaParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  using T = Tile;
  constexpr int kN = T::kTokens;
  constexpr int kRowBytes = T::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem + T::kQ);
  float* s_stats = reinterpret_cast<float*>(smem + T::kStats);

  // A cluster of p.cluster CTAs shares an item: rank k takes the k-th run of whole tiles of its
  // chunk. Every CTA of a cluster has the same item, so they return (or not) together.
  const int cluster = p.cluster;
  const int rank = cluster > 1 ? static_cast<int>(cluster_rank()) : 0;
  ItemWork work;
  if (!item_work(p, work, static_cast<int>(blockIdx.y) / cluster)) return;
  if (cluster > 1) {
    const int per = ((work.chunk_end - work.chunk_begin + kN - 1) / kN + cluster - 1) / cluster;
    const int begin = min(work.chunk_end, work.chunk_begin + rank * per * kN);
    work.chunk_end = min(work.chunk_end, begin + per * kN);
    work.chunk_begin = begin;
  }
  const auto [item, request, split, q_begin, q_len, num_rows, kv_len, chunk_begin, chunk_end,
              pos_shift, pages] = work;
  const int H = p.num_heads;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int pair = warp >> 1;
  const int half = warp & 1;           // S: k16 steps 18 half ..; O: columns 256 half ..
  const int pt = tid & 63;             // thread in the pair
  const int gather_part = pt & 7;      // 16-byte chunk of each 128-byte run it copies
  const int gather_row = pt >> 3;      // first of its token rows (then + 8, + 16, + 24)
  const auto* ckv = static_cast<const __nv_bfloat16*>(p.ckv);
  const auto* kpe = static_cast<const __nv_bfloat16*>(p.kpe);
  const uint32_t stage = smem_u32(smem + T::kKv) + pair * T::kStageBytes;
  float4* x_mine = reinterpret_cast<float4*>(smem + T::kExchange) + (pair * 2 + half) * 4 * 32;
  const float4* x_other =
      reinterpret_cast<const float4*>(smem + T::kExchange) + (pair * 2 + 1 - half) * 4 * 32;

  // Per-lane ldmatrix offsets (kernel.cuh): Q x4 (16 rows x 2 chunks), K x4 (16 tokens x 2
  // chunks: two 8-token tiles), V x4.trans (16 tokens x 2 chunks).
  const uint32_t q_lane = swz<kRowBytes>(lane & 15, lane >> 4);
  const uint32_t k_lane = swz<kRowBytes>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t v_lane = swz<kRowBytes>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
  const uint32_t gather_dst = stage + swz<kRowBytes>(gather_row, gather_part);

  for (int rb = static_cast<int>(blockIdx.x); rb * T::kRows < num_rows;
       rb += static_cast<int>(gridDim.x)) {
    const int row0 = rb * T::kRows;
    int limit[2];  // this thread's S rows lane / 4 (+ 8): last visible key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + (lane >> 2) + 8 * h, num_rows - 1);
      limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
    }
    const int block_end = row_block_end(p, work, row0, T::kRows);
    const int num_tiles = (block_end - chunk_begin + kN - 1) / kN;

    // The pages of this thread's gather rows in tile t (t < num_tiles), and the copies of tile t
    // into the pair's stage from them.
    // Page ids are loaded a refill ahead and checked at use (page_or_zero, kernel.cuh), so the
    // load's latency stays hidden; the CTA that met one outside the pool rescans for the report.
    PageGuard page_guard{false, reinterpret_cast<unsigned long long*>(smem + T::kNote)};
    auto tile_pages = [&](int t, int (&pg)[T::kRowsPerThread]) {
#pragma unroll
      for (int i = 0; i < T::kRowsPerThread; ++i) {
        const int key = min(chunk_begin + t * kN + gather_row + 8 * i, block_end - 1);
        pg[i] = load_page(p, pages, key);  // checked in load_tile
      }
    };
    auto load_tile = [&](int t, const int (&pg)[T::kRowsPerThread]) {
#pragma unroll
      for (int i = 0; i < T::kRowsPerThread; ++i) {
        const int key = min(chunk_begin + t * kN + gather_row + 8 * i, block_end - 1);
        int64_t ckv_off, kpe_off;
        latent_offsets(p, page_or_zero(p, pg[i], page_guard.bad), key, ckv_off, kpe_off);
        const __nv_bfloat16* src = ckv + ckv_off + gather_part * 8;
        const uint32_t dst = gather_dst + i * 8 * kRowBytes;
#pragma unroll
        for (int b = 0; b < kRank / 64; ++b) prefill::cp_async_16(dst + b * 128, src + b * 64);
        prefill::cp_async_16(dst + kRank / 64 * 128, kpe + kpe_off + gather_part * 8);
      }
      prefill::cp_async_commit();
    };

    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    }
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    int pg_next[T::kRowsPerThread];  // pages of the pair's next tile

    // Q rows (zero past the request's rows), the pair's first tile, the pages of its second.
    for (int i = tid; i < T::kRows * (kDimQk / 8); i += kThreads) {
      const int r = i / (kDimQk / 8);
      const int c = i - r * (kDimQk / 8);
      int bytes;
      const __nv_bfloat16* src = q_chunk(p, work, row0 + r, c, bytes);
      prefill::cp_async_16(s_q + swz<kRowBytes>(r, c), src, bytes);
    }
    prefill::cp_async_commit();
    if (pair < num_tiles) {
      int pg[T::kRowsPerThread];
      tile_pages(pair, pg);
      load_tile(pair, pg);
    }
    if (pair + T::kPairs < num_tiles) tile_pages(pair + T::kPairs, pg_next);
    cp_async_wait<0>();
    __syncthreads();  // Q and every pair's first tile

    // Rounds of kPairs tiles; every pair runs every round's barriers (a pair past the last tile
    // idles through them), so all threads pass the same barrier sequence.
    const int rounds = (num_tiles + T::kPairs - 1) / T::kPairs;
    for (int round = 0; round < rounds; ++round) {
      const int tile = round * T::kPairs + pair;
      const bool active = tile < num_tiles;
      const int n0 = chunk_begin + tile * kN;
      if (round > 0) {
        cp_async_wait<0>();
        pair_barrier(pair);  // the tile landed (both warps' copies)
      }
      // ---- partial S over this warp's 18 k16 steps, four 8-token chains ----
      float s[4][4] = {};
      if (active) {
#pragma unroll
        for (int ks = 0; ks < T::kSteps; ++ks) {
          const int k = half * T::kSteps + ks;  // chunk pair 2 (k % 4) of block k / 4
          const uint32_t swizzle = (k & 3) << 5, column = (k >> 2) * 128;
          uint32_t a[4];
          ldmatrix_x4(a, s_q + (q_lane ^ swizzle) + column);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            uint32_t b[4];
            ldmatrix_x4(b, stage + (k_lane ^ swizzle) + column + jj * 16 * kRowBytes);
            Bf16Mma::run(s[2 * jj], a, b[0], b[1]);
            Bf16Mma::run(s[2 * jj + 1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          x_mine[j * 32 + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
        }
      }
      pair_barrier(pair);
      if (active) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 v = x_other[j * 32 + lane];
          s[j][0] += v.x;
          s[j][1] += v.y;
          s[j][2] += v.z;
          s[j][3] += v.w;
        }
        // ---- mask, online softmax (lazy), P as A fragments ----
        const bool needs_mask = n0 + kN > block_end || (p.causal && n0 + kN - 1 > limit[0]);
        if (needs_mask) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + j * 8 + 2 * (lane & 3) + (e & 1);
              if (key >= block_end || key > limit[e >> 1]) s[j][e] = -INFINITY;
            }
          }
        }
        float alpha[2];
        const bool moved = online_softmax(reinterpret_cast<float(&)[16]>(s), p.scale_log2,
                                          row_max, row_sum, alpha);
        if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
          for (int nt = 0; nt < 32; ++nt) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
          }
        }
        // ---- O += P V over this warp's 256 columns (4 blocks of 64) ----
#pragma unroll
        for (int kk = 0; kk < kN / 16; ++kk) {
          uint32_t a[4];
          a[0] = Bf16Mma::pack(s[2 * kk][0], s[2 * kk][1]);
          a[1] = Bf16Mma::pack(s[2 * kk][2], s[2 * kk][3]);
          a[2] = Bf16Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          a[3] = Bf16Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
          for (int blk = 0; blk < 4; ++blk) {
#pragma unroll
            for (int dp = 0; dp < 4; ++dp) {
              uint32_t b[4];
              ldmatrix_x4_trans(b, stage + kk * 16 * kRowBytes + (v_lane ^ (dp << 5)) +
                                       (half * 4 + blk) * 128);
              Bf16Mma::run(o[blk * 8 + 2 * dp], a, b[0], b[1]);
              Bf16Mma::run(o[blk * 8 + 2 * dp + 1], a, b[2], b[3]);
            }
          }
        }
      }
      // ---- the stage is read: the pair's next tile streams in; the pages of the one after ----
      if (round + 1 < rounds) {
        pair_barrier(pair);  // both warps are done with the stage and the partials
        const int next = tile + T::kPairs;
        if (next < num_tiles) {
          load_tile(next, pg_next);
          if (next + T::kPairs < num_tiles) tile_pages(next + T::kPairs, pg_next);
        }
      }
    }

    // ---- combine the pairs: max and sum per row, then O through shared memory ----
    // Every pair is done with its stage (reused below); and whether a page id was bad: then the
    // block's rows get 0 / -inf (a poisoned lse, s_lse, tells the cluster and the merge).
    const bool bad_page = __syncthreads_or(page_guard.bad) != 0;
    if (bad_page) {
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
      row_max[0] = row_max[1] = -INFINITY;
      row_sum[0] = row_sum[1] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // a thread's sums cover 8 of each tile's 32 tokens: add the quad
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    }
    if (half == 0 && (lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s_stats[(pair * 2) * T::kRows + (lane >> 2) + 8 * h] = row_max[h];
        s_stats[(pair * 2 + 1) * T::kRows + (lane >> 2) + 8 * h] = row_sum[h];
      }
    }
    __syncthreads();
    // Each pair scales its O by 2^(max_q - M) / L (M: the row's max over the pairs, L: the sum
    // over the pairs at M) and stores it; then every thread adds the four for its outputs.
    float* s_o = reinterpret_cast<float*>(smem + T::kKv);
    float* s_lse = s_stats + T::kPairs * 2 * T::kRows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (lane >> 2) + 8 * h;
      float big = -INFINITY;
#pragma unroll
      for (int q = 0; q < T::kPairs; ++q) big = fmaxf(big, s_stats[(q * 2) * T::kRows + r]);
      float total = 0.0f;
#pragma unroll
      for (int q = 0; q < T::kPairs; ++q) {
        const float m = s_stats[(q * 2) * T::kRows + r];
        if (m != -INFINITY) total += fast_exp2(m - big) * s_stats[(q * 2 + 1) * T::kRows + r];
      }
      const float w =
          row_max[h] != -INFINITY && total > 0.0f ? fast_exp2(row_max[h] - big) / total : 0.0f;
      if (pair == 0 && half == 0 && (lane & 3) == 0) {
        s_lse[r] = bad_page       ? poisoned_partial()
                   : total > 0.0f ? (big + __log2f(total)) * kLn2
                                  : -INFINITY;
      }
      float* dst = s_o + (pair * T::kRows + r) * T::kORowFloats + half * 256 + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        *reinterpret_cast<float2*>(dst + nt * 8) =
            make_float2(o[nt][2 * h] * w, o[nt][2 * h + 1] * w);
      }
    }
    __syncthreads();
    // Request row `row` (block row r), columns col .. col + 3: out (bf16) or the item's partial
    // (f32), and the row's lse with column 0.
    auto emit = [&](int row, int col, const float4& acc, float lse) {
      if (!split) {
        const int tok = row / H;
        const int head = row - tok * H;
        __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) +
                             (q_begin + tok) * p.out_stride_token + head * p.out_stride_head + col;
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(Bf16Mma::pack(acc.x, acc.y), Bf16Mma::pack(acc.z, acc.w));
      } else {
        const int64_t slot = int64_t{item} * p.partial_rows + row;
        *reinterpret_cast<float4*>(p.partial_out + slot * kRank + col) = acc;
      }
      if (col == 0) {  // a poisoned lse is kept for the merge of a split request
        if (float* slot = lse_slot(p, work, row))
          *slot = !split && is_poisoned(lse) ? -INFINITY : lse;
      }
    };
    // Thread t: float4 t, t + 256, ... of the [16 rows][512] block (consecutive threads,
    // consecutive columns: conflict-free reads, coalesced writes), summed over the pairs.
    constexpr int kPerThread = T::kRows * kRank / 4 / kThreads;
    float4 sums[kPerThread];
#pragma unroll
    for (int v = 0; v < kPerThread; ++v) {
      const int idx = v * kThreads + tid;
      const int r = idx / (kRank / 4);
      const int col = (idx % (kRank / 4)) * 4;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int q = 0; q < T::kPairs; ++q) {
        const float4 x =
            *reinterpret_cast<const float4*>(s_o + (q * T::kRows + r) * T::kORowFloats + col);
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      }
      sums[v] = acc;
    }
    if (cluster == 1) {
#pragma unroll
      for (int v = 0; v < kPerThread; ++v) {
        const int idx = v * kThreads + tid;
        const int r = idx / (kRank / 4);
        const int row = row0 + r;
        if (row >= num_rows || (split && row >= p.partial_rows)) continue;
        const float4 acc = sums[v];
        emit(row, (idx % (kRank / 4)) * 4,
             make_float4(acc.x * p.out_scale, acc.y * p.out_scale, acc.z * p.out_scale,
                         acc.w * p.out_scale),
             s_lse[r]);
      }
    } else {
      // ---- the cluster's CTAs combine their (O, lse) in distributed shared memory ----
      // Each CTA's O (normalised by its own sum) goes into pair 0's rows of s_o (every thread
      // rewrites only the elements it read); then rank k combines columns k * 512 / C .. for
      // every row from all C CTAs:  lse = M + log(sum_j exp(lse_j - M)),
      // O = sum_j exp(lse_j - lse) O_j.
#pragma unroll
      for (int v = 0; v < kPerThread; ++v) {
        const int idx = v * kThreads + tid;
        const int r = idx / (kRank / 4);
        const int col = (idx % (kRank / 4)) * 4;
        *reinterpret_cast<float4*>(s_o + r * T::kORowFloats + col) = sums[v];
      }
      cluster_sync();  // every CTA's O and lse are in its shared memory
      const uint32_t o_base = smem_u32(s_o);
      const uint32_t lse_base = smem_u32(s_lse);
      const int width = kRank / 4 / cluster;  // float4 columns per rank
      for (int idx = tid; idx < T::kRows * width; idx += kThreads) {
        const int r = idx / width;
        const int col = (rank * width + idx % width) * 4;
        const int row = row0 + r;
        if (row >= num_rows || (split && row >= p.partial_rows)) continue;
        float lse_j[kMaxCluster];
        float big = -INFINITY;
        bool poisoned = false;  // a CTA of the cluster met a page id outside the pool
#pragma unroll
        for (int j = 0; j < kMaxCluster; ++j) {
          lse_j[j] = j < cluster ? ld_cluster_f32(map_cluster(lse_base + 4 * r, j)) : -INFINITY;
          poisoned |= is_poisoned(lse_j[j]);
          big = fmaxf(big, lse_j[j]);
        }
        if (poisoned) {
          emit(row, col, make_float4(0.0f, 0.0f, 0.0f, 0.0f), poisoned_partial());
          continue;
        }
        float total = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < kMaxCluster; ++j) {
          if (lse_j[j] == -INFINITY) continue;  // past the cluster, or nothing seen
          const float w = __expf(lse_j[j] - big);
          const float4 x =
              ld_cluster_f32x4(map_cluster(o_base + 4 * (r * T::kORowFloats + col), j));
          total += w;
          acc.x += w * x.x;
          acc.y += w * x.y;
          acc.z += w * x.z;
          acc.w += w * x.w;
        }
        const float scale = total > 0.0f ? p.out_scale / total : 0.0f;
        emit(row, col,
             make_float4(acc.x * scale, acc.y * scale, acc.z * scale, acc.w * scale),
             total > 0.0f ? big + __logf(total) : -INFINITY);
      }
      cluster_sync();  // the others are done reading this CTA's shared memory
    }

    if (bad_page && tid == 0) report_first_bad_page(p, request, pages, chunk_begin, block_end);
    __syncthreads();  // shared memory is reused by the next row block
  }
}

}  // namespace pagedattn::cuda::mla::small
