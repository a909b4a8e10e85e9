// Row sampling on the device (see sampling.h and include/pagedattn/sampling.h for the algorithm),
// one cluster of blocks of kThreads per logits row (passes 1 and 2 split over the cluster, the rest
// on its first block), no sort:
//
//   pass 1  raw max and (greedy) argmax: (value, id) pairs reduced with "non-NaN beats NaN, larger
//           value, then lower id; two NaN: higher id", the CPU loop's result; the scaled max.
//   pass 2  the raw softmax denominator (f32 terms, a double sum) for the logprob; the count and
//           the mass of the min-p candidates.
//   top-k, top-p and the draw are each a selection: the largest key K over the kept tokens whose
//   cumulative weight from the top, M(key >= K), reaches an integer target. Keys: the 64-bit
//   composite (order-preserving bits of the scaled f32 logit << 32 | 0xFFFFFFFF - id), whose
//   descending order is (value descending, id ascending), the CPU's order, one key per token;
//   for the id-ordered draw, 0xFFFFFFFF - id. The selection is a radix select from the top, 8
//   bits a pass: a shared-memory histogram of count and mass over the next digit of the tokens
//   that share the digits found so far, then one thread walks the 256 bins down. Every kept set
//   is then "composite key >= cut":
//     top-k   target k by count over the value bits only: K = the k-th largest value; cut =
//             its lowest composite (ties at the boundary kept);
//     top-p   target ceil(top_p * total) by mass: K = the last token of the fewest-top tokens
//             (ties by lower id: the composite breaks them); cut = K;
//     draw    target floor(u * kept) + 1 by mass (the first token whose cumulative weight
//             exceeds u * kept), composite keys when top_p < 1 (the order top-p made), id keys
//             else.
//   Weights are exp(scaled - max) in double rounded to 2^-40 fixed point: integer histograms
//   (deterministic, whatever the atomics' order; exact totals), at most vocab * 2^-41 from the
//   CPU's double sums (< 1e-7 of the kept mass for 152k tokens, ~1e-10 typically): only a top-p
//   or draw target that close to a boundary can pick another token than the CPU reference.
//
// The f32 arithmetic that decides kept sets (the temperature multiply, the min-p floor) uses
// __fmul_rn / __fadd_rn so that no contraction changes a rounding against the CPU; -0 is keyed as
// +0 since the CPU compares them equal.
//
// Cost. A few rows (a decode step at a small batch) leave most SMs idle while one block per row
// walks 152k logits, with a double exp per token in pass 2 (all of them, for a random-weight
// model's flat logits): so a row gets a cluster of up to 8 blocks (sample_cluster_size), each
// taking whole tiles of the row in passes 1 and 2; their maxima and sums meet in distributed
// shared memory in rank order, and the first block gathers the tile masses and goes on alone
// (the draw reads one tile; the selections, for top-k / top-p, walk the row as before). Within a
// block every pass is latency-bound unless each thread keeps several loads in flight: rows whose
// length is a multiple of 4 (and 16-byte aligned) are read as float4 groups, kUnroll groups per
// thread issued before any is used (for_each_group). The common draw,
// temperature / min-p with no top-k or top-p (nano-vllm's and most benchmarks' sampling), needs no
// selection: draw order is id order, so the weights pass 2 computes anyway are also summed per
// tile of 128 consecutive ids (one warp's float4 groups in one sweep) into shared memory; a block
// scan over the tiles finds the tile holding the target and one warp scans that tile: the same
// token as the id-key selection (the smallest id whose inclusive cumulative weight reaches the
// target), from 2 passes over the row instead of 6. Otherwise: 2 passes for greedy; 2 + 4 (id
// draw) + 4 (top-k) + 8 (top-p) + 8 (value draw) at most, each reading the row from L2 / HBM; the
// passes after the first digit touch only the tokens that share it.
//
// Launched with programmatic dependent launch (cuda/launch.h): pdl_wait() comes before the row's
// spec is read, so also before a row that samples nothing returns.
#include <cuda_runtime.h>

#include <cstdint>
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "model/cuda/sampling.h"
#include "pagedattn/error.h"

namespace pagedattn::model::cuda {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::launch_kernel;
using ::pagedattn::cuda::pdl_trigger;
using ::pagedattn::cuda::pdl_wait;

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // float4 groups in flight per thread
// The id-order draw's tiles (128 ids each) in shared memory: vocabularies up to 2^18 ids (Qwen's
// 151,936, Llama 3's 128,256, DeepSeek's 129,280); larger ones take the id-key selection.
constexpr int kMaxTiles = 2048;
constexpr double kFixedScale = 1099511627776.0;  // 2^40
using Mass = unsigned long long;

struct ArgMax {
  float value;
  int32_t index;
};

struct Better {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    const bool a_nan = isnan(a.value), b_nan = isnan(b.value);
    if (a_nan != b_nan) return a_nan ? b : a;
    if (a_nan) return a.index > b.index ? a : b;
    if (a.value != b.value) return a.value > b.value ? a : b;
    return a.index < b.index ? a : b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// The block's reduction of `value` (a fixed tree: deterministic), returned to every thread.
template <class T, class Op>
__device__ T block_reduce(T value, Op op) {
  using Reduce = cub::BlockReduce<T, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ T result;
  const T reduced = Reduce(storage).Reduce(value, op);
  if (threadIdx.x == 0) result = reduced;
  __syncthreads();
  const T out = result;
  __syncthreads();  // storage and result are reused by the next call
  return out;
}

// Order-preserving bits of a float (larger float, larger key); -0 keyed as +0. Not for NaN.
__device__ __forceinline__ uint32_t value_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ uint64_t composite_key(float v, int32_t t) {
  return (static_cast<uint64_t>(value_key(v)) << 32) |
         static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(t));
}

// exp(v - top) in 2^-40 fixed point. Below -30 the product is under 0.11 and rounds to 0: the
// double exp is skipped there (most of a long row's tokens), with the same result.
__device__ __forceinline__ Mass fixed_weight(float v, double top) {
  const double d = static_cast<double>(v) - top;
  return d < -30.0 ? 0 : __double2ull_rn(exp(d) * kFixedScale);
}

// One row as the selections see it.
struct RowView {
  const float* logits;
  int32_t vocab;
  float inverse_temperature;
  float floor;   // min-p: kept iff scaled >= floor (and > -inf); -inf when off
  double top;    // the scaled max
  uint64_t cut;  // kept iff composite key >= cut
};

// Whether token t with raw logit l is kept so far; its scaled logit and composite key.
__device__ __forceinline__ bool kept(const RowView& row, float l, int32_t t, float* v,
                                     uint64_t* key) {
  *v = __fmul_rn(l, row.inverse_temperature);
  if (!(*v >= row.floor && *v > -INFINITY)) return false;  // NaN fails both
  *key = composite_key(*v, t);
  return *key >= row.cut;
}

// Whether the row can be read as float4 groups: a length that is a multiple of 4 and a 16-byte
// aligned start (every row then, since rows are contiguous).
__device__ __forceinline__ bool vector_row(const float* x, int32_t vocab) {
  return vocab % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
}

// Calls f(j, v, valid) for the float4 groups j < groups of x (tokens 4j .. 4j + 3), kUnroll groups
// per thread loaded before any is used. Every lane of a warp makes the same calls (valid false
// past the end), so f may use warp shuffles; in one call the warp's lanes hold the 32 consecutive
// groups starting at j - lane (128 consecutive ids: "tile" (j >> 5)).
template <class F>
__device__ __forceinline__ void for_each_group(const float* x, int32_t groups, F&& f) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int32_t lane = static_cast<int32_t>(threadIdx.x & 31u);
  for (int32_t base = static_cast<int32_t>(threadIdx.x) - lane; base < groups;
       base += kUnroll * kThreads) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kThreads + lane;
      v[u] = j < groups ? __ldg(x4 + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kThreads + lane;
      if (base + u * kThreads < groups) f(j, v[u], j < groups);  // warp-uniform condition
    }
  }
}

// Calls f(t, x[t]) for every token t of the row, in some order (float4 groups when the row allows,
// else a strided scalar loop with kUnroll loads in flight).
template <class F>
__device__ __forceinline__ void for_each_token(const float* x, int32_t vocab, F&& f) {
  if (vector_row(x, vocab)) {
    for_each_group(x, vocab / 4, [&](int32_t j, float4 v, bool valid) {
      if (!valid) return;
      f(4 * j, v.x);
      f(4 * j + 1, v.y);
      f(4 * j + 2, v.z);
      f(4 * j + 3, v.w);
    });
    return;
  }
  for (int32_t base = static_cast<int32_t>(threadIdx.x); base < vocab; base += kUnroll * kThreads) {
    float l[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = base + u * kThreads;
      l[u] = t < vocab ? __ldg(x + t) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = base + u * kThreads;
      if (t < vocab) f(t, l[u]);
    }
  }
}

// A cluster's share of a row (sample_kernel): CTA `rank` of `size` takes the float4 groups
// [begin, end), whole tiles of 32 groups (128 ids) each, so that a tile's mass is summed by one
// warp of one CTA. A cluster of one takes the whole row (any length, any alignment).
struct Segment {
  int32_t begin = 0, end = 0;  // float4 groups
  bool whole = true;
};

__device__ __forceinline__ Segment segment_of(int32_t vocab, unsigned rank, unsigned size) {
  if (size == 1) return Segment{0, vocab / 4, true};
  const int32_t groups = vocab / 4, tiles = (groups + 31) / 32;
  const int32_t per = (tiles + static_cast<int32_t>(size) - 1) / static_cast<int32_t>(size);
  const int32_t begin = min(groups, static_cast<int32_t>(rank) * per * 32);
  return Segment{begin, min(groups, begin + per * 32), false};
}

// for_each_group over the segment's groups, j the group's index in the row.
template <class F>
__device__ __forceinline__ void for_each_group_in(const float* x, Segment seg, F&& f) {
  for_each_group(x + 4 * static_cast<int64_t>(seg.begin), seg.end - seg.begin,
                 [&](int32_t j, float4 v, bool valid) { f(seg.begin + j, v, valid); });
}

// for_each_token over the segment (the whole row for a cluster of one).
template <class F>
__device__ __forceinline__ void for_each_token_in(const float* x, int32_t vocab, Segment seg,
                                                  F&& f) {
  if (seg.whole) return for_each_token(x, vocab, f);
  for_each_group_in(x, seg, [&](int32_t j, float4 v, bool valid) {
    if (!valid) return;
    f(4 * j, v.x);
    f(4 * j + 1, v.y);
    f(4 * j + 2, v.z);
    f(4 * j + 3, v.w);
  });
}

enum class Keys : int {
  kValue,      // the composite's value bits only (top-k)
  kComposite,  // (value descending, id ascending)
  kId,         // id ascending
};

struct Selection {
  int found;
  uint64_t key;
  Mass above_mass, at_mass;  // of the kept tokens above key, and at key
  uint32_t above_count, at_count;
};

// The largest key K over the kept tokens with (count or mass of the tokens whose key >= K) >=
// target; found 0 when all of them fall short.
__device__ Selection select(const RowView& row, Keys keys, bool by_count, Mass target) {
  __shared__ Mass mass[256];
  __shared__ uint32_t count[256];
  __shared__ Selection state;
  const int high = keys == Keys::kId ? 24 : 56;
  const int low = keys == Keys::kValue ? 32 : 0;
  if (threadIdx.x == 0) state = Selection{1, 0, 0, 0, 0, 0};
  __syncthreads();
  for (int shift = high; shift >= low; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      mass[b] = 0;
      count[b] = 0;
    }
    const uint64_t prefix = state.key;
    __syncthreads();
    // Each thread sums its tokens while their digit stays the same and adds the run to the
    // shared bins when it changes: the id keys' high digits (and runs of similar logits) would
    // otherwise send every token's atomic to one bin. Integer sums: the order does not matter.
    uint32_t run_digit = 0;
    Mass run_mass = 0;
    uint32_t run_count = 0;
    for_each_token(row.logits, row.vocab, [&](int32_t t, float l) {
      float v;
      uint64_t key;
      if (!kept(row, l, t, &v, &key)) return;
      if (keys == Keys::kId) key = 0xFFFFFFFFu - static_cast<uint32_t>(t);
      if (shift + 8 < 64 && (key >> (shift + 8)) != (prefix >> (shift + 8))) return;
      const uint32_t digit = static_cast<uint32_t>(key >> shift) & 255u;
      if (run_count > 0 && digit != run_digit) {
        atomicAdd(&mass[run_digit], run_mass);
        atomicAdd(&count[run_digit], run_count);
        run_mass = 0;
        run_count = 0;
      }
      run_digit = digit;
      run_mass += fixed_weight(v, row.top);
      ++run_count;
    });
    if (run_count > 0) {
      atomicAdd(&mass[run_digit], run_mass);
      atomicAdd(&count[run_digit], run_count);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      Mass above_mass = state.above_mass;
      uint32_t above_count = state.above_count;
      int found = -1;
      for (int d = 255; d >= 0; --d) {
        const Mass reach =
            by_count ? static_cast<Mass>(above_count) + count[d] : above_mass + mass[d];
        if (reach >= target) {
          found = d;
          break;
        }
        above_mass += mass[d];
        above_count += count[d];
      }
      if (found < 0) {
        state.found = 0;  // only at the first digit: later ones search a bin that reaches it
      } else {
        state.key |= static_cast<uint64_t>(found) << shift;
        state.above_mass = above_mass;
        state.above_count = above_count;
        state.at_mass = mass[found];
        state.at_count = count[found];
      }
    }
    __syncthreads();
    if (!state.found) break;
  }
  const Selection out = state;
  __syncthreads();  // state is rewritten by the next call
  return out;
}

// The id-order draw from tile masses (see the header comment): the smallest id t whose inclusive
// cumulative weight (ids 0 .. t, kept tokens only) reaches target, 1 <= target <= the sum of
// tile_mass[0 .. tiles). Called by the whole block; returns the token to every thread.
__device__ int32_t draw_by_tiles(const RowView& row, const Mass* tile_mass, int32_t tiles,
                                 Mass target) {
  using Scan = cub::BlockScan<Mass, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t found_tile;
  __shared__ Mass found_rest;
  __shared__ int32_t found_token;
  // Thread i sums tiles [i * per, (i + 1) * per); the block's exclusive scan gives each range's
  // start; the range that holds the target walks its tiles.
  const int32_t per = (tiles + kThreads - 1) / kThreads;
  const int32_t first = static_cast<int32_t>(threadIdx.x) * per;
  const int32_t last = min(first + per, tiles);
  Mass sum = 0;
  for (int32_t i = first; i < last; ++i) sum += tile_mass[i];
  Mass before = 0;
  Scan(scan_storage).ExclusiveSum(sum, before);
  if (threadIdx.x == 0) {
    found_tile = -1;
    found_token = -1;
  }
  __syncthreads();
  if (before < target && target <= before + sum) {  // exactly one thread
    Mass cumulative = before;
    for (int32_t i = first; i < last; ++i) {
      if (target <= cumulative + tile_mass[i]) {
        found_tile = i;
        found_rest = target - cumulative;  // in [1, tile_mass[i]]
        break;
      }
      cumulative += tile_mass[i];
    }
  }
  __syncthreads();
  if (threadIdx.x < 32 && found_tile >= 0) {
    // One warp over the tile: lane l holds ids 128 * tile + 4 l .. + 3.
    const int32_t lane = static_cast<int32_t>(threadIdx.x);
    const int32_t groups = row.vocab / 4;
    const int32_t j = found_tile * 32 + lane;
    Mass w[4] = {0, 0, 0, 0};
    if (j < groups) {
      const float4 v4 = __ldg(reinterpret_cast<const float4*>(row.logits) + j);
      const float l[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v;
        uint64_t key;
        if (kept(row, l[e], 4 * j + e, &v, &key)) w[e] = fixed_weight(v, row.top);
      }
    }
    const Mass lane_sum = w[0] + w[1] + w[2] + w[3];
    Mass inclusive = lane_sum;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const Mass up = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    const unsigned reach = __ballot_sync(0xffffffffu, inclusive >= found_rest);
    if (reach != 0 && lane == __ffs(static_cast<int>(reach)) - 1) {
      Mass cumulative = inclusive - lane_sum;
      for (int e = 0; e < 4; ++e) {
        cumulative += w[e];
        if (cumulative >= found_rest) {
          found_token = 4 * j + e;
          break;
        }
      }
    }
  }
  __syncthreads();
  const int32_t token = found_token;
  __syncthreads();  // the shared results are rewritten by the next row's call
  return token;
}

// The cluster's partial results, in each CTA's shared memory, combined by every CTA in rank
// order (a fixed order: the same bits at every launch of the same cluster size).
struct ClusterPartial {
  float raw_max, scaled_max;
  ArgMax best;
  double denominator;
  Mass mass;
  uint32_t count;
};

// Grid: rows x cluster size CTAs, clusters of `size` consecutive CTAs along x (sample_rows picks
// the size: several CTAs per row when the rows are too few to fill the SMs). Passes 1 and 2 are
// split over the cluster's CTAs (segment_of) and combined through distributed shared memory;
// what follows (the tile draw or the selections) runs on rank 0 over the whole row, with the
// tile masses gathered from the other CTAs first.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int32_t vocab, const DeviceRowSampling* rows,
                  ops::SampledToken* out) {
  pdl_wait();  // first (cuda/launch.h): before the spec is read and before the return below
  pdl_trigger();
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned size = cluster.num_blocks(), rank = cluster.block_rank();
  __shared__ Mass tile_mass[kMaxTiles];
  __shared__ ClusterPartial partial;
  const int64_t row_index = blockIdx.x / size;
  const DeviceRowSampling spec = rows[row_index];
  if (!spec.sample) return;  // the whole cluster (one row)
  const ops::RowFilter& f = spec.filter;
  const float* x = logits + row_index * vocab;
  const Segment seg = segment_of(vocab, rank, size);

  // Pass 1: maxima and the greedy argmax.
  float raw_max = -INFINITY, scaled_max = -INFINITY;
  ArgMax best{__int_as_float(0x7fffffff), -1};  // NaN, below every token
  for_each_token_in(x, vocab, seg, [&](int32_t t, float l) {
    raw_max = fmaxf(raw_max, l);
    if (f.greedy) {
      best = Better{}(best, ArgMax{l, t});
    } else {
      scaled_max = fmaxf(scaled_max, __fmul_rn(l, f.inverse_temperature));
    }
  });
  raw_max = block_reduce(raw_max, MaxOp{});
  scaled_max = block_reduce(scaled_max, MaxOp{});
  best = block_reduce(best, Better{});
  if (size > 1) {
    if (threadIdx.x == 0) {
      partial.raw_max = raw_max;
      partial.scaled_max = scaled_max;
      partial.best = best;
    }
    cluster.sync();
    for (unsigned r = 0; r < size; ++r) {
      const ClusterPartial* p = cluster.map_shared_rank(&partial, r);
      raw_max = fmaxf(raw_max, p->raw_max);
      scaled_max = fmaxf(scaled_max, p->scaled_max);
      best = Better{}(best, p->best);
    }
  }

  RowView row{x, vocab, f.inverse_temperature, -INFINITY, static_cast<double>(scaled_max), 0};
  if (!f.greedy && f.has_min_p && scaled_max > -INFINITY) {
    row.floor = __fadd_rn(scaled_max, f.log_min_p);
  }
  // The id-order draw over tiles: no top-k or top-p, a float4 row of at most kMaxTiles tiles.
  const int32_t tiles = (vocab / 4 + 31) / 32;
  const bool by_tiles = !f.greedy && (f.top_k <= 0 || f.top_k >= vocab) && !f.sorted_draw &&
                        vector_row(x, vocab) && tiles <= kMaxTiles;

  // Pass 2: the softmax denominator; the min-p candidates' count and mass (per tile too).
  double denominator = 0.0;
  Mass mass = 0;
  uint32_t count = 0;
  const auto weigh = [&](int32_t t, float l, Mass* weight) {
    // The logprob's denominator: f32 terms (1 ulp each) summed in double, ~1e-7 relative.
    denominator += static_cast<double>(expf(l - raw_max));
    float v;
    uint64_t key;
    if (!f.greedy && kept(row, l, t, &v, &key)) {
      *weight = fixed_weight(v, row.top);
      mass += *weight;
      ++count;
    }
  };
  if (by_tiles) {
    for_each_group_in(x, seg, [&](int32_t j, float4 v4, bool valid) {
      Mass tile = 0;
      if (valid) {
        Mass w[4] = {0, 0, 0, 0};
        weigh(4 * j, v4.x, &w[0]);
        weigh(4 * j + 1, v4.y, &w[1]);
        weigh(4 * j + 2, v4.z, &w[2]);
        weigh(4 * j + 3, v4.w, &w[3]);
        tile = w[0] + w[1] + w[2] + w[3];
      }
      for (int offset = 16; offset > 0; offset >>= 1)
        tile += __shfl_down_sync(0xffffffffu, tile, offset);
      if ((threadIdx.x & 31u) == 0) tile_mass[j >> 5] = tile;
    });
  } else {
    for_each_token_in(x, vocab, seg, [&](int32_t t, float l) {
      Mass unused = 0;
      weigh(t, l, &unused);
    });
  }
  denominator = block_reduce(denominator, SumOp{});  // also orders the tile_mass writes
  mass = block_reduce(mass, SumOp{});
  count = block_reduce(count, SumOp{});
  if (size > 1) {
    if (threadIdx.x == 0) {
      partial.denominator = denominator;
      partial.mass = mass;
      partial.count = count;
    }
    cluster.sync();  // the partials and every CTA's tile masses
    denominator = 0.0;
    mass = 0;
    count = 0;
    for (unsigned r = 0; r < size; ++r) {
      const ClusterPartial* p = cluster.map_shared_rank(&partial, r);
      denominator += p->denominator;
      mass += p->mass;
      count += p->count;
    }
    // Rank 0 goes on alone over the whole row: it takes the other CTAs' tiles first, and they
    // leave once it has (their shared memory must outlive its reads).
    if (rank == 0 && by_tiles) {
      for (unsigned r = 1; r < size; ++r) {
        const Segment other = segment_of(vocab, r, size);
        if (other.begin >= other.end) continue;  // an empty share (short rows): no tiles written
        const Mass* remote = cluster.map_shared_rank(tile_mass, r);
        for (int32_t tile = other.begin / 32 + static_cast<int32_t>(threadIdx.x);
             tile < (other.end + 31) / 32; tile += kThreads) {
          tile_mass[tile] = remote[tile];
        }
      }
    }
    cluster.sync();  // also a barrier of rank 0's threads over its gathered tiles
    if (rank != 0) return;
  }

  int32_t token = -1;
  if (f.greedy) {
    token = best.index;
  } else if (scaled_max > -INFINITY) {
    Mass total = mass;
    if (f.top_k > 0 && static_cast<uint32_t>(f.top_k) < count) {
      const Selection k = select(row, Keys::kValue, true, static_cast<Mass>(f.top_k));
      row.cut = (k.key >> 32) << 32;
      total = k.above_mass + k.at_mass;
    }
    if (f.sorted_draw) {
      const double want = ceil(f.top_p * static_cast<double>(total));
      const Selection p =
          select(row, Keys::kComposite, false, want < 1.0 ? 1 : static_cast<Mass>(want));
      if (p.found) {
        row.cut = p.key;
        total = p.above_mass + p.at_mass;
      }
    }
    Mass target = static_cast<Mass>(floor(f.uniform * static_cast<double>(total))) + 1;
    if (target > total) target = total;  // u * total rounded up to total: the last token
    // total >= 2^40 (the max's own weight) unless the max is +inf: then no token (an Error).
    if (total > 0) {
      if (by_tiles) {
        token = draw_by_tiles(row, tile_mass, tiles, target);
      } else {
        const Selection d =
            select(row, f.sorted_draw ? Keys::kComposite : Keys::kId, false, target);
        if (d.found) token = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(d.key));
      }
    }
  }
  if (threadIdx.x == 0) {
    out[row_index].token = token;
    out[row_index].logprob =
        token >= 0 ? static_cast<float>(static_cast<double>(x[token]) -
                                        (static_cast<double>(raw_max) + log(denominator)))
                   : 0.0f;
  }
}

}  // namespace

int sample_cluster_size(int64_t rows, int64_t vocab, int sm_count) {
  // Clusters of up to 8 CTAs (the portable maximum) per row while the rows' CTAs fit two per SM;
  // a cluster splits the row by float4 tiles of 128 ids, at least one tile a CTA.
  if (vocab % 4 != 0) return 1;
  int size = 1;
  for (int next = 2; next <= 8 && rows * next <= 2 * int64_t{sm_count} && vocab >= 128 * next;
       next *= 2) {
    size = next;
  }
  return size;
}

void sample_rows(const float* logits, int64_t rows, int64_t vocab,
                 const DeviceRowSampling* rows_spec, ops::SampledToken* out, void* stream,
                 int cluster_size) {
  if (rows == 0) return;
  if (vocab < 1 || vocab > kMaxSampledVocab) {
    throw_error("sample_rows: vocabulary " + std::to_string(vocab) + " (expected 1 .. " +
                std::to_string(kMaxSampledVocab) + ")");
  }
  if (cluster_size == 0) {
    int device = 0, sms = 0;
    PA_CUDA_CHECK(cudaGetDevice(&device));
    PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cluster_size = sample_cluster_size(rows, vocab, sms);
  }
  if (cluster_size != 1 && (cluster_size > 8 || (cluster_size & (cluster_size - 1)) != 0 ||
                            vocab % 4 != 0 || vocab < 4 * 32 * cluster_size)) {
    throw_error("sample_rows: cluster size " + std::to_string(cluster_size) + " for vocabulary " +
                std::to_string(vocab) +
                " (expected 1, or 2, 4 or 8 with a vocabulary of float4s, a tile per CTA)");
  }
  if (rows * cluster_size > INT32_MAX) {
    throw_error("sample_rows: " + std::to_string(rows) + " rows");
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(rows * cluster_size));
  config.blockDim = dim3(kThreads);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  launch_kernel(config, sample_kernel, logits, static_cast<int32_t>(vocab), rows_spec, out);
  check_launch("sample_kernel");
}

}  // namespace pagedattn::model::cuda
