// MoE routing, sorting and the grouped expert GEMM on the device (see moe.h). Each kernel is
// launched with programmatic dependent launch (cuda/launch.h): pdl_wait() is its first statement,
// before the early returns of warps past the last token and of tiles without an expert.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/prefill/wgmma.cuh"
#include "model/cuda/activation.cuh"
#include "model/cuda/moe.h"

namespace pagedattn::model::cuda {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::cp_async_16;  // cuda/common/device_utils.cuh
using ::pagedattn::cuda::cp_async_commit;
using ::pagedattn::cuda::cp_async_wait;
using ::pagedattn::cuda::launch_kernel;
using ::pagedattn::cuda::pdl_trigger;
using ::pagedattn::cuda::pdl_wait;

// ---- routing: one warp per token, ops::moe_route's steps ----
//
// The lanes hold experts lane, lane + 32, ...; what ops::moe_route sums in a loop (the softmax
// denominator, the chosen weights) lane 0 sums in the same order, so the scores are the CPU's to
// the bit; the top-k is k warp argmax rounds (largest value, then the lower index: the serial
// scan's pick for every value but NaN). One thread per token took 90 us per layer for 64 tokens
// (DeepSeek-V2-Lite decode on the H200: the serial top-k over 64 experts in local memory).

// Indices of the k largest of values[0, n) (ties: the lower index), best first: the order of
// ops::moe_route's partial sort. One thread (the group steps: at most kMoeMaxGroups values).
__device__ void top_k_indices(const float* values, int32_t n, int32_t k, int32_t* out) {
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int32_t i = 0; i < j; ++i) taken = taken || out[i] == e;
      if (taken) continue;
      if (best < 0 || values[e] > values[best]) best = e;
    }
    out[j] = best;
  }
}

constexpr int kRouteWarps = 4;
constexpr int kExpertsPerLane = kMoeMaxExperts / 32;

struct Candidate {
  float value;
  int32_t index;  // -1: none
};

// The better of two candidates: larger value, then the lower index. Symmetric, so a butterfly
// reduction leaves every lane with the same winner.
__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (a.value > b.value) return a;
  if (b.value > a.value) return b;
  return a.index < b.index ? a : b;
}

__global__ void __launch_bounds__(32 * kRouteWarps)
    route_kernel(const float* logits, int64_t tokens, ops::MoeRouterConfig config,
                 const float* bias, int32_t* expert_ids, float* weights) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  __shared__ float shared_scores[kRouteWarps][kMoeMaxExperts];
  __shared__ float shared_choice[kRouteWarps][kMoeMaxExperts];
  __shared__ float shared_group[kRouteWarps][kMoeMaxGroups];
  __shared__ int32_t shared_keep[kRouteWarps][kMoeMaxGroups];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (t >= tokens) return;  // the whole warp
  float* scores = shared_scores[warp];
  float* choice = shared_choice[warp];
  const int32_t experts = config.num_experts, k = config.top_k;
  const int32_t groups = config.num_groups > 0 ? config.num_groups : 1;
  const int32_t per_group = experts / groups;
  const float* row = logits + t * experts;
  if (config.method == ops::MoeRouting::kSigmoidNoAuxTc) {
    for (int32_t e = lane; e < experts; e += 32) {
      scores[e] = 1.0f / (1.0f + expf(-row[e]));
      choice[e] = scores[e] + bias[e];
    }
    __syncwarp();
  } else {
    float max = -INFINITY;
    for (int32_t e = lane; e < experts; e += 32) max = fmaxf(max, row[e]);
    for (int offset = 16; offset > 0; offset >>= 1)
      max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
    for (int32_t e = lane; e < experts; e += 32) scores[e] = expf(row[e] - max);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0) {
      for (int32_t e = 0; e < experts; ++e) sum += scores[e];  // ops::moe_route's order
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp();
    for (int32_t e = lane; e < experts; e += 32) choice[e] = (scores[e] /= sum);
    __syncwarp();
  }
  if (config.method != ops::MoeRouting::kSoftmaxGreedy) {
    float* group_score = shared_group[warp];
    int32_t* keep = shared_keep[warp];
    for (int32_t g = lane; g < groups; g += 32) {
      const float* c = choice + g * per_group;
      if (config.method == ops::MoeRouting::kSoftmaxGroupLimited) {
        float best = c[0];
        for (int32_t i = 1; i < per_group; ++i) best = c[i] > best ? c[i] : best;
        group_score[g] = best;
      } else {
        int32_t best[2];
        top_k_indices(c, per_group, 2, best);
        group_score[g] = c[best[0]] + c[best[1]];
      }
      keep[g] = 0;
    }
    __syncwarp();
    if (lane == 0) {
      int32_t kept[kMoeMaxGroups];
      top_k_indices(group_score, groups, config.topk_groups, kept);
      for (int32_t i = 0; i < config.topk_groups; ++i) keep[kept[i]] = 1;
    }
    __syncwarp();
    for (int32_t e = lane; e < experts; e += 32) {
      if (!keep[e / per_group]) {
        choice[e] = config.method == ops::MoeRouting::kSigmoidNoAuxTc ? -INFINITY : 0.0f;
      }
    }
    __syncwarp();
  }
  // The top k: k rounds of a warp argmax over the untaken experts.
  float value[kExpertsPerLane];
  unsigned taken = 0;
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) {
    const int32_t e = lane + 32 * i;
    value[i] = e < experts ? choice[e] : 0.0f;
  }
  int32_t* ids = expert_ids + t * k;
  float* w = weights + t * k;
  float sum = 0.0f;
  for (int32_t j = 0; j < k; ++j) {
    Candidate mine{0.0f, -1};
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int32_t e = lane + 32 * i;
      if (e >= experts || (taken >> i & 1u)) continue;
      if (mine.index < 0 || value[i] > mine.value) mine = Candidate{value[i], e};
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const Candidate other{__shfl_xor_sync(0xffffffffu, mine.value, offset),
                            __shfl_xor_sync(0xffffffffu, mine.index, offset)};
      mine = better(mine, other);
    }
    // mine.index >= 0: k <= experts (checked on the host), so an untaken expert is left.
    if (mine.index % 32 == lane) taken |= 1u << (mine.index / 32);
    if (lane == 0) {
      ids[j] = mine.index;
      sum += (w[j] = scores[mine.index]);  // ops::moe_route's order
    }
  }
  if (lane == 0) {
    const bool normalize =
        config.norm_topk_prob && (config.method == ops::MoeRouting::kSigmoidNoAuxTc || k > 1);
    const float denominator =
        config.method == ops::MoeRouting::kSigmoidNoAuxTc ? sum + 1e-20f : sum;
    for (int32_t j = 0; j < k; ++j) {
      if (normalize) w[j] /= denominator;
      w[j] *= config.routed_scaling_factor;
    }
  }
}

// ---- the counting sort and the tile table: one block ----

constexpr int kSortThreads = 1024;

__global__ void __launch_bounds__(kSortThreads)
    sort_kernel(const int32_t* expert_ids, int64_t pairs, int32_t top_k, int32_t experts,
                int32_t* position, int32_t* source_row, int32_t* tiles, int64_t max_tiles,
                int32_t tile_rows) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  __shared__ int32_t count[kMoeMaxExperts];
  __shared__ int32_t start[kMoeMaxExperts];
  for (int32_t e = threadIdx.x; e < experts; e += kSortThreads) count[e] = 0;
  __syncthreads();
  // The pair's index inside its expert, kept in `position` until the starts are known.
  for (int64_t p = threadIdx.x; p < pairs; p += kSortThreads) {
    position[p] = atomicAdd(&count[expert_ids[p]], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t row = 0;
    int64_t tile = 0;
    for (int32_t e = 0; e < experts; ++e) {
      start[e] = row;
      for (int32_t first = 0; first < count[e]; first += tile_rows, ++tile) {
        tiles[tile * 3] = e;
        tiles[tile * 3 + 1] = row + first;
        tiles[tile * 3 + 2] = min(tile_rows, count[e] - first);
      }
      row += count[e];
    }
    for (; tile < max_tiles; ++tile) tiles[tile * 3] = -1;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += kSortThreads) {
    const int32_t row = start[expert_ids[p]] + position[p];
    position[p] = row;
    source_row[row] = static_cast<int32_t>(p / top_k);
  }
}

// ---- the grouped GEMM: mma.sync m16n8k16, kBm x 128 tiles, K in steps of 64 ----
//
// Decode is memory-bound here (each expert's few rows against its whole weight), so the reads
// are what matters: a stage takes 128 bytes of each of the tile's 128 weight rows (a whole line;
// 64 bytes, half-lines, ran at ~1.9 TB/s over DeepSeek-V2-Lite's experts at 64 tokens on the
// H100), and kStages - 1 stages are in flight while one is multiplied (with two stages a CTA
// waited a full memory latency per step: 2.3 TB/s on the H200).
//
// GemmTile<kBm>: 32-row tiles (decode) take 4 warps side by side over the 128 columns, each 32
// rows x 32 columns; 128-row tiles (prefill, moe.h) 8 warps, 2 x 4, each 64 rows x 32 columns,
// two CTAs an SM (3 stages of 36 KiB each; 128 registers a thread at most). A warp skips the
// products of its 16-row slices that lie wholly past the tile's rows (an expert's last tile).

constexpr int kBn = 128, kBk = 64;
constexpr int kStride = kBk + 8;  // shared row stride in elements (144 bytes: ldmatrix rows
                                  // 16-byte aligned, 8 rows on distinct banks)
constexpr int kChunks = kBk / 8;  // 16-byte chunks per row of a stage
constexpr int kStages = 3;

template <int kBm>
struct GemmTile {
  static_assert(kBm == kMoeTileRows || kBm == kMoeLargeTileRows);
  static constexpr int kWarpsN = 4;  // warps side by side over the columns
  static constexpr int kWarpsM = kBm == kMoeTileRows ? 1 : 2;  // ... and over the rows
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpRows = kBm / kWarpsM;  // 32 or 64
  static constexpr int kMTiles = kWarpRows / 16;   // m16 slices of a warp
  // __launch_bounds__'s blocks an SM: 2 of 256 threads for the large tiles (unstated, 0, for
  // the small ones, which ptxas fits in fewer registers anyway).
  static constexpr int kMinBlocks = kWarpsM == 1 ? 0 : 2;
  static constexpr int kStageElems = (kBm + kBn) * kStride;                // A then B
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageElems * 2;  // 16-bit elements
  static_assert(kBm * kChunks % kThreads == 0 && kBn * kChunks % kThreads == 0);
  static_assert(kBn == kWarpsN * 32);
  static_assert((kSmemBytes + 1024) * (kMinBlocks > 0 ? kMinBlocks : 1) <= 228 * 1024);
};

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                                   unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                            unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A CTA's work in both grouped GEMM kernels: tile blockIdx.y of the table (its rows [first, first +
// rows) of A, its expert's weights w) and the 128 columns from col0 = 128 blockIdx.x; false for
// an unused entry (expert -1).
template <class T>
struct TileWork {
  int32_t first = 0, rows = 0;
  int64_t col0 = 0;
  const T* w = nullptr;
};
template <class T>
__device__ __forceinline__ bool tile_work(const int32_t* tiles, const void* const* weights,
                                          TileWork<T>& work) {
  const int32_t expert = tiles[blockIdx.y * 3];
  if (expert < 0) return false;
  work.first = tiles[blockIdx.y * 3 + 1];
  work.rows = tiles[blockIdx.y * 3 + 2];
  work.col0 = int64_t{blockIdx.x} * kBn;
  work.w = static_cast<const T*>(weights[expert]);
  return true;
}

// Two adjacent outputs of 16-bit T as one 32-bit store (the column even, the row stride even).
template <class T>
__device__ __forceinline__ void store_pair(T* out, float x, float y) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x, y);
  } else {
    *reinterpret_cast<__half2*>(out) = __floats2half2_rn(x, y);
  }
}

// kSilu false: c is f32 [rows, ldc]. kSilu true: the weight rows come in blocks of kMoePairBlock
// gates then their ups (n a multiple of 2 kMoePairBlock), and c is T [rows, ldc] of n / 2 columns:
// act = silu(gate) * up, column 16 b + i from weight rows 32 b + i and 32 b + 16 + i.
template <class T, int kBm, bool kSilu>
__global__ void __launch_bounds__(GemmTile<kBm>::kThreads, GemmTile<kBm>::kMinBlocks)
    grouped_gemm_kernel(const T* a, int64_t lda, const void* const* weights, int64_t n, int64_t k,
                        const int32_t* tiles, void* c, int64_t ldc) {
  using G = GemmTile<kBm>;
  constexpr int kThreads = G::kThreads, kStageElems = G::kStageElems, kMTiles = G::kMTiles;
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  TileWork<T> work;
  if (!tile_work(tiles, weights, work)) return;
  const int32_t first = work.first, rows = work.rows;
  const int64_t col0 = work.col0;
  const T* const w = work.w;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  T* const stages = reinterpret_cast<T*>(gemm_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_n = warp % G::kWarpsN;                    // the warp's 32 columns
  const int warp_row0 = warp / G::kWarpsN * G::kWarpRows;  // and its first row

  // Stage loads: A 32 rows x kChunks chunks of 8 halves, B 128 rows x kChunks (consecutive
  // threads on consecutive chunks of a row: whole lines); one cp.async group per stage.
  const auto load = [&](int stage, int64_t k0) {
    T* sa = stages + stage * kStageElems;
    T* sb = sa + kBm * kStride;
#pragma unroll
    for (int i = 0; i < kBm * kChunks / kThreads; ++i) {
      const int index = tid + i * kThreads;
      const int r = index / kChunks, chunk = index % kChunks;
      const int64_t kk = k0 + chunk * 8;
      const bool valid = r < rows && kk < k;
      cp_async_16(&sa[r * kStride + chunk * 8], valid ? a + (int64_t{first} + r) * lda + kk : a,
                  valid);
    }
#pragma unroll
    for (int i = 0; i < kBn * kChunks / kThreads; ++i) {
      const int index = tid + i * kThreads;
      const int r = index / kChunks, chunk = index % kChunks;
      const int64_t kk = k0 + chunk * 8, col = col0 + r;
      const bool valid = col < n && kk < k;
      cp_async_16(&sb[r * kStride + chunk * 8], valid ? w + col * k + kk : w, valid);
    }
  };

  float acc[kMTiles][4][4] = {};
  const int64_t steps = (k + kBk - 1) / kBk;
  // Groups are committed uniformly (an empty one past the last step), so that at step s the
  // groups committed are kStages - 1 + s and "at most kStages - 2 pending" means step s landed.
#pragma unroll
  for (int s0 = 0; s0 < kStages - 1; ++s0) {
    if (s0 < steps) load(s0, s0 * kBk);
    cp_async_commit();
  }
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step's stage is visible to all; every warp is done with step - 1's
    const int64_t next = step + kStages - 1;
    if (next < steps) load(static_cast<int>(next % kStages), next * kBk);  // step - 1's stage
    cp_async_commit();
    const T* sa = stages + static_cast<int>(step % kStages) * kStageElems;
    const T* sb = sa + kBm * kStride;
#pragma unroll
    for (int kk = 0; kk < kBk; kk += 16) {
      unsigned af[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        if (warp_row0 + m * 16 >= rows) continue;  // past the tile's rows: no product (below)
        ldmatrix_x4(af[m],
                    &sa[(warp_row0 + m * 16 + (lane & 15)) * kStride + kk + (lane >> 4) * 8]);
      }
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        // Two n8 tiles: lanes 0-7 / 8-15 their first 8 columns at k and k + 8, 16-31 the next 8.
        unsigned bf[4];
        const int row = warp_n * 32 + pair * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(bf, &sb[row * kStride + kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          if (warp_row0 + m * 16 >= rows) continue;  // warp-uniform
          mma<T>(acc[m][pair * 2], af[m], bf[0], bf[1]);
          mma<T>(acc[m][pair * 2 + 1], af[m], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the CTA (the trailing groups are empty)
  // C fragments: c0, c1 at (row g, columns 2t, 2t + 1), c2, c3 at row g + 8.
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kSilu) {
    // The warp's 32 columns are one pair block: n8 tiles 0, 1 its gates, 2, 3 their ups.
    static_assert(2 * kMoePairBlock == 32);
    const int64_t block_col = col0 + warp_n * 32;
    if (block_col >= n) return;  // n is a multiple of 32: the whole block is past it
    T* const act = static_cast<T*>(c);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = warp_row0 + m * 16 + g + half * 8;
          if (r >= rows) continue;
          const float x = silu_times(acc[m][j][half * 2], acc[m][j + 2][half * 2]);
          const float y = silu_times(acc[m][j][half * 2 + 1], acc[m][j + 2][half * 2 + 1]);
          store_pair(act + (int64_t{first} + r) * ldc + block_col / 2 + j * 8 + 2 * t, x, y);
        }
      }
    }
    return;
  }
  float* const out_f32 = static_cast<float*>(c);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + warp_n * 32 + j * 8 + 2 * t;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = warp_row0 + m * 16 + g + half * 8;
        if (r >= rows) continue;
        float* out = out_f32 + (int64_t{first} + r) * ldc + col;
        if (col < n) out[0] = acc[m][j][half * 2];
        if (col + 1 < n) out[1] = acc[m][j][half * 2 + 1];
      }
    }
  }
}

// ---- the grouped GEMM on wgmma (sm_90a): the 128-row tiles on Hopper (use_wgmma) ----
//
// mma.sync with 64 x 32 warp tiles reads 3 KiB of shared memory (ldmatrix) per 16 products, more
// than an SM's shared memory feeds at the tensor cores' rate: the 128-row tiles ran the routed
// experts at ~200 TFLOP/s on an H100 (bench/RESULTS.md). Here two warpgroups each take 64 rows
// x the tile's 128 columns with m64n128k16 products whose operands both stay in shared memory
// (wgmma's descriptors, no register staging). A stage is 64 columns of K in wgmma's 128-byte
// swizzle (prefill/kernel_sm90.cuh): the tile's 128 rows of A (16 KiB), then its 128 weight
// rows (16 KiB); kWgStages of them, loaded by cp.async from all 256 threads kWgAhead stages
// ahead of the one multiplied. Each step's products are committed as a group and the
// warpgroup waits only for the step before's (wgmma_wait<1>), so the loads, the barrier and
// the next step's issue overlap a step of products; the stage a load overwrites is two steps
// old, done by both warpgroups (the barrier at the top of the step orders it). A warpgroup
// whose 64 rows lie wholly past the tile's rows (an expert's last tile) only loads.
// Three stages (97 KiB) let two CTAs share an SM, one CTA's loads, prologue and epilogue under
// the other's products: against six stages and one CTA an SM, DeepSeek-V2-Lite's prefill 16 x
// 512 took 4% less time and 1 x 2048 the same (H100, bench/RESULTS.md, "MoE").

constexpr int kWgThreads = 256;
constexpr int kWgStages = 3;
constexpr int kWgMinBlocks = 2;  // CTAs an SM
constexpr int kWgAhead = kWgStages - 2;
constexpr int kWgTileBytes = kMoeLargeTileRows * kBk * 2;  // 128 rows x 128 bytes
constexpr int kWgStageBytes = 2 * kWgTileBytes;            // A, then B
// + 1024: the dynamic shared memory is aligned up to 1024 bytes (the swizzle's period).
constexpr size_t kWgSmemBytes = 1024 + size_t{kWgStages} * kWgStageBytes;
static_assert(kBn == kMoeLargeTileRows && kWgMinBlocks * kWgSmemBytes <= 228 * 1024 - 2048);

template <class T>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b,
                                                 int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    ::pagedattn::cuda::prefill::sm90::ss_m64n128k16_bf16(d, a, b, scale_d);
  } else {
    ::pagedattn::cuda::prefill::sm90::ss_m64n128k16_f16(d, a, b, scale_d);
  }
}

// kSilu: as grouped_gemm_kernel's.
template <class T, bool kSilu>
__global__ void __launch_bounds__(kWgThreads, kWgMinBlocks)
    grouped_gemm_wgmma_kernel(const T* a, int64_t lda, const void* const* weights, int64_t n,
                              int64_t k, const int32_t* tiles, void* c, int64_t ldc) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace wg = ::pagedattn::cuda::prefill::sm90;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  TileWork<T> work;
  if (!tile_work(tiles, weights, work)) return;
  const int32_t first = work.first, rows = work.rows;
  const int64_t col0 = work.col0;
  const T* const w = work.w;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(gemm_smem));
  const uint32_t base = (raw + 1023u) & ~1023u;  // shared-window address of stage 0
  unsigned char* const smem = gemm_smem + (base - raw);
  const int tid = threadIdx.x;
  const int group = tid / 128;                // the warpgroup: rows [64 group, + 64)
  const bool group_live = group * 64 < rows;  // warpgroup-uniform

  // A stage: row r's 16-byte chunk `chunk` of K at tile_offset<128>(r, chunk), consecutive threads
  // on consecutive chunks of a row (whole lines); rows past the tile, columns past n and K past k
  // zero-filled.
  const auto load = [&](int stage, int64_t k0) {
    unsigned char* const sa = smem + stage * kWgStageBytes;
    unsigned char* const sb = sa + kWgTileBytes;
#pragma unroll
    for (int i = 0; i < kMoeLargeTileRows * kChunks / kWgThreads; ++i) {
      const int index = tid + i * kWgThreads;
      const int r = index / kChunks, chunk = index % kChunks;
      const uint32_t offset = wg::tile_offset<kMoeLargeTileRows>(r, chunk);
      const int64_t kk = k0 + chunk * 8, col = col0 + r;
      const bool a_valid = r < rows && kk < k, b_valid = col < n && kk < k;
      cp_async_16(sa + offset, a_valid ? a + (int64_t{first} + r) * lda + kk : a, a_valid);
      cp_async_16(sb + offset, b_valid ? w + col * k + kk : w, b_valid);
    }
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const int64_t steps = (k + kBk - 1) / kBk;
  // Groups are committed uniformly (empty past the last step): at step s, "at most kWgAhead - 1
  // pending" means step s landed.
#pragma unroll
  for (int s0 = 0; s0 < kWgAhead; ++s0) {
    if (s0 < steps) load(s0, s0 * kBk);
    cp_async_commit();
  }
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kWgAhead - 1>();  // this thread's copies of the step
    wg::fence_proxy_async();        // ... visible to the tensor cores' reads
    __syncthreads();                // every thread's; both warpgroups done with step - 2's stage
    const int64_t next = step + kWgAhead;
    if (next < steps) load(static_cast<int>(next % kWgStages), next * kBk);
    cp_async_commit();
    if (group_live) {
      const uint32_t stage = base + static_cast<uint32_t>(step % kWgStages) * kWgStageBytes;
      const uint32_t sa = stage + group * 64 * 128, sb = stage + kWgTileBytes;
      wg::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBk / 16; ++ks) {  // k16 steps, 32 bytes apart in the swizzled rows
        wgmma_m64n128k16<T>(acc, wg::descriptor(sa + ks * 32, 16, 1024),
                            wg::descriptor(sb + ks * 32, 16, 1024), 1);
      }
      wg::wgmma_commit();
      wg::wgmma_wait<1>();  // the step before's products are done
    }
  }
  wg::wgmma_wait<0>();
  wg::fence_registers(acc);
  cp_async_wait<0>();  // no copy outlives the CTA (the trailing groups are empty)
  if (!group_live) return;
  // Accumulators (prefill/wgmma.cuh): register 4 j + e holds row 16 warp + lane / 4 + 8 (e / 2),
  // column 8 j + 2 (lane % 4) + e % 2 of the warpgroup's 64 x 128.
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kSilu) {
    // Columns 32 b .. 32 b + 31 of the tile are a pair block: chunks 4 b, 4 b + 1 its gates,
    // 4 b + 2, 4 b + 3 their ups (n a multiple of 32: a block is wholly inside n or past it).
    T* const act = static_cast<T*>(c);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if ((j & 3) >= 2) continue;
      const int64_t block_col = col0 + (j >> 2) * 32;
      if (block_col >= n) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = group * 64 + warp * 16 + g + half * 8;
        if (r >= rows) continue;
        const float x = silu_times(acc[4 * j + 2 * half], acc[4 * (j + 2) + 2 * half]);
        const float y = silu_times(acc[4 * j + 2 * half + 1], acc[4 * (j + 2) + 2 * half + 1]);
        store_pair(act + (int64_t{first} + r) * ldc + block_col / 2 + (j & 3) * 8 + 2 * t, x, y);
      }
    }
    return;
  }
  float* const out_f32 = static_cast<float*>(c);
  const bool pairs_aligned = ldc % 2 == 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int64_t col = col0 + j * 8 + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = group * 64 + warp * 16 + g + half * 8;
      if (r >= rows) continue;
      float* out = out_f32 + (int64_t{first} + r) * ldc + col;
      const float x = acc[4 * j + 2 * half], y = acc[4 * j + 2 * half + 1];
      if (col + 1 < n && pairs_aligned) {
        *reinterpret_cast<float2*>(out) = make_float2(x, y);
      } else {
        if (col < n) out[0] = x;
        if (col + 1 < n) out[1] = y;
      }
    }
  }
#endif
}

// Whether the 128-row tiles run on wgmma: by default where the binary has the kernel's sm_90a
// code and the device is a 9.x (DeepSeek-V2-Lite prefill on an H100: 1 x 2048 47.3 -> 38.5 ms,
// 16 x 512 154.6 -> 124.8 ms against the mma.sync kernel, bench/RESULTS.md); mma.sync elsewhere.
// PAGEDATTN_MOE_GEMM=mma forces the mma.sync kernel, =wgmma the wgmma one (an error where it
// cannot run); any other value is an error. Decided once per process.
template <class T>
bool use_wgmma() {
  static const bool chosen = [] {
    const char* forced = std::getenv("PAGEDATTN_MOE_GEMM");  // ARCHITECTURE.md, "Switches"
    const std::string choice = forced == nullptr ? "" : forced;
    if (choice == "mma") return false;
    if (!choice.empty() && choice != "wgmma") {
      throw_error("PAGEDATTN_MOE_GEMM=" + choice + " (expected mma or wgmma)");
    }
    const bool usable = ::pagedattn::cuda::hopper_code(
        reinterpret_cast<const void*>(grouped_gemm_wgmma_kernel<T, false>));
    if (!usable && choice == "wgmma") {
      throw_error("PAGEDATTN_MOE_GEMM=wgmma: needs sm_90a code in this build and a 9.x device");
    }
    return usable;
  }();
  return chosen;
}

// kKernel with `smem` bytes of dynamic shared memory, more than the 48 KB a launch gets without
// asking: the attribute is set once per kernel (as decode's and MLA's launchers do), not at every
// layer's launch.
template <auto kKernel, class... Args>
void launch_with_smem(dim3 grid, int threads, size_t smem, cudaStream_t stream,
                      const Args&... args) {
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  PA_CUDA_CHECK(attribute_status);
  launch_kernel(kKernel, grid, threads, smem, stream, args...);
}

// The grouped GEMM on one dtype: the kernel of the tile height (the 128-row tiles' wgmma kernel
// where use_wgmma says so).
template <class T, bool kSilu>
void launch_grouped_gemm(int32_t tile_rows, const T* a, int64_t lda, const void* const* weights,
                         int64_t n, int64_t k, const int32_t* tiles, void* c, int64_t ldc,
                         dim3 grid, cudaStream_t stream) {
  using Small = GemmTile<kMoeTileRows>;
  using Large = GemmTile<kMoeLargeTileRows>;
  if (tile_rows == kMoeTileRows) {
    launch_with_smem<grouped_gemm_kernel<T, kMoeTileRows, kSilu>>(
        grid, Small::kThreads, Small::kSmemBytes, stream, a, lda, weights, n, k, tiles, c, ldc);
  } else if (use_wgmma<T>()) {
    launch_with_smem<grouped_gemm_wgmma_kernel<T, kSilu>>(grid, kWgThreads, kWgSmemBytes, stream, a,
                                                          lda, weights, n, k, tiles, c, ldc);
  } else {
    launch_with_smem<grouped_gemm_kernel<T, kMoeLargeTileRows, kSilu>>(
        grid, Large::kThreads, Large::kSmemBytes, stream, a, lda, weights, n, k, tiles, c, ldc);
  }
}

void check_tile_rows(const char* what, int32_t tile_rows) {
  if (tile_rows != kMoeTileRows && tile_rows != kMoeLargeTileRows) {
    throw_error(std::string(what) + ": tile_rows " + std::to_string(tile_rows) + " (expected " +
                std::to_string(kMoeTileRows) + " or " + std::to_string(kMoeLargeTileRows) + ")");
  }
}

}  // namespace

int32_t moe_tile_rows(int64_t pairs, int32_t experts) {
  static const int32_t forced = [] {
    const char* value = std::getenv("PAGEDATTN_MOE_TILE_ROWS");  // ARCHITECTURE.md, "Switches"
    if (value == nullptr || *value == '\0') return 0;
    const std::string text(value);
    if (text == std::to_string(kMoeTileRows)) return kMoeTileRows;
    if (text == std::to_string(kMoeLargeTileRows)) return kMoeLargeTileRows;
    throw_error("PAGEDATTN_MOE_TILE_ROWS=" + text + " (expected " + std::to_string(kMoeTileRows) +
                " or " + std::to_string(kMoeLargeTileRows) + ")");
  }();
  if (forced != 0) return forced;
  return experts > 0 && pairs >= int64_t{experts} * (kMoeLargeTileRows / 2) ? kMoeLargeTileRows
                                                                            : kMoeTileRows;
}

void moe_route_device(const float* logits, int64_t tokens, const ops::MoeRouterConfig& config,
                      const float* correction_bias, int32_t* expert_ids, float* weights,
                      void* stream) {
  if (tokens == 0) return;
  if (config.num_experts < 1 || config.num_experts > kMoeMaxExperts || config.top_k < 1 ||
      config.top_k > config.num_experts) {
    throw_error("moe_route_device: " + std::to_string(config.num_experts) + " experts, top " +
                std::to_string(config.top_k) +
                " (expected 1 <= top_k <= experts <= " + std::to_string(kMoeMaxExperts) + ")");
  }
  if (config.method == ops::MoeRouting::kSigmoidNoAuxTc && correction_bias == nullptr) {
    throw_error("moe_route_device: noaux_tc routing without its correction bias");
  }
  if (config.method != ops::MoeRouting::kSoftmaxGreedy &&
      (config.num_groups < 1 || config.num_groups > kMoeMaxGroups ||
       config.num_experts % config.num_groups != 0 || config.topk_groups < 1 ||
       config.topk_groups > config.num_groups ||
       (config.method == ops::MoeRouting::kSigmoidNoAuxTc &&
        config.num_experts / config.num_groups < 2))) {
    throw_error("moe_route_device: n_group " + std::to_string(config.num_groups) + ", topk_group " +
                std::to_string(config.topk_groups) + " for " + std::to_string(config.num_experts) +
                " experts (expected at most " + std::to_string(kMoeMaxGroups) +
                " groups dividing the experts, 1 <= topk_group <= n_group, >= 2 experts per "
                "group for noaux_tc)");
  }
  launch_kernel(route_kernel, static_cast<unsigned>((tokens + kRouteWarps - 1) / kRouteWarps),
                32 * kRouteWarps, 0, static_cast<cudaStream_t>(stream), logits, tokens, config,
                correction_bias, expert_ids, weights);
  check_launch("moe route_kernel");
}

void moe_sort_device(const int32_t* expert_ids, int64_t pairs, int32_t top_k, int32_t experts,
                     int32_t* position, int32_t* source_row, int32_t* tiles, int64_t max_tiles,
                     void* stream, int32_t tile_rows) {
  check_tile_rows("moe_sort_device", tile_rows);
  if (experts < 1 || experts > kMoeMaxExperts) {
    throw_error("moe_sort_device: " + std::to_string(experts) + " experts (expected 1 .. " +
                std::to_string(kMoeMaxExperts) + ")");
  }
  if (max_tiles < moe_max_tiles(pairs, experts, tile_rows)) {
    throw_error("moe_sort_device: a tile table of " + std::to_string(max_tiles) +
                " entries (needs " + std::to_string(moe_max_tiles(pairs, experts, tile_rows)) +
                ")");
  }
  launch_kernel(sort_kernel, 1, kSortThreads, 0, static_cast<cudaStream_t>(stream), expert_ids,
                pairs, top_k, experts, position, source_row, tiles, max_tiles, tile_rows);
  check_launch("moe sort_kernel");
}

namespace {

// moe_grouped_gemm and moe_grouped_gemm_silu: the checks they share, then the kernel for the dtype.
template <bool kSilu>
void grouped_gemm(const char* what, const void* a, int64_t lda, const void* const* weights,
                  DType dtype, int64_t n, int64_t k, const int32_t* tiles, int64_t max_tiles,
                  void* c, int64_t ldc, void* stream, int32_t tile_rows) {
  check_tile_rows(what, tile_rows);
  if (max_tiles == 0 || n == 0) return;
  if (k % 8 != 0 || lda % 8 != 0 || k < 8) {
    throw_error(std::string(what) + ": k " + std::to_string(k) + ", lda " + std::to_string(lda) +
                " (expected multiples of 8)");
  }
  if (max_tiles > 65535) {
    throw_error(std::string(what) + ": " + std::to_string(max_tiles) + " tiles (at most 65535)");
  }
  const dim3 grid(static_cast<unsigned>((n + kBn - 1) / kBn), static_cast<unsigned>(max_tiles));
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kBF16) {
    launch_grouped_gemm<__nv_bfloat16, kSilu>(tile_rows, static_cast<const __nv_bfloat16*>(a), lda,
                                              weights, n, k, tiles, c, ldc, grid, s);
  } else if (dtype == DType::kF16) {
    launch_grouped_gemm<__half, kSilu>(tile_rows, static_cast<const __half*>(a), lda, weights, n, k,
                                       tiles, c, ldc, grid, s);
  } else {
    throw_error(std::string(what) + ": dtype " + std::string(dtype_name(dtype)) +
                " (expected bf16 or f16)");
  }
  check_launch(what);
}

}  // namespace

void moe_grouped_gemm(const void* a, int64_t lda, const void* const* weights, DType dtype,
                      int64_t n, int64_t k, const int32_t* tiles, int64_t max_tiles, float* c,
                      int64_t ldc, void* stream, int32_t tile_rows) {
  grouped_gemm<false>("moe_grouped_gemm", a, lda, weights, dtype, n, k, tiles, max_tiles, c, ldc,
                      stream, tile_rows);
}

void moe_grouped_gemm_silu(const void* a, int64_t lda, const void* const* weights, DType dtype,
                           int64_t n, int64_t k, const int32_t* tiles, int64_t max_tiles, void* act,
                           int64_t ld_act, void* stream, int32_t tile_rows) {
  if (n % (2 * kMoePairBlock) != 0 || ld_act % 2 != 0 || ld_act < n / 2 ||
      reinterpret_cast<uintptr_t>(act) % 4 != 0) {
    throw_error("moe_grouped_gemm_silu: n " + std::to_string(n) + ", ld_act " +
                std::to_string(ld_act) + " (expected n a multiple of " +
                std::to_string(2 * kMoePairBlock) +
                ", an even ld_act >= n / 2, act 4-byte aligned)");
  }
  grouped_gemm<true>("moe_grouped_gemm_silu", a, lda, weights, dtype, n, k, tiles, max_tiles, act,
                     ld_act, stream, tile_rows);
}

}  // namespace pagedattn::model::cuda
