// GEMV at a few rows (see gemv.h): y [m, n] f32 = x [m, k] · wᵀ, w [n, k] row-major, bf16 / f16.
//
// The work is reading w once; everything else is small. A block of kThreads threads owns a run
// of consecutive output rows (n). Its threads form groups of G = 2^group_shift threads (whole
// warps, 32 <= G <= kThreads); a group owns kRows<kM> consecutive rows, and its threads stride
// over those rows' 16-byte chunks of k (8 halves): thread j of a group reads chunks j, j + G,
// j + 2G, ... of each of its rows, kUnroll<kM> chunks per iteration, all of an iteration's loads
// issued before the first product (4 weight loads of 16 bytes in flight per thread). Each x chunk
// (kM rows, a few KiB in all: L1 / L2 hits) is read once per chunk and used for all of the
// thread's rows. Each thread keeps kM x kRows f32 sums over its chunks in order; a group's sums
// are reduced by a butterfly over each warp's lanes, then over the group's warps in warp order
// through shared memory: a fixed order, so the result is the same at every launch.
//
// G is chosen per launch (plan_launch): the narrowest group that covers k in one iteration, then
// wider while the grid would give the SMs fewer than two blocks each (k split over more threads,
// fewer rows per block), so that a small n (1024 rows: an o_proj or down_proj) still spreads its
// loads over every SM.
//
// Launched with programmatic dependent launch (cuda/launch.h): the kernel waits for the previous
// kernel (pdl_wait()) before its first load; before the wait, each block only asks the L2 to
// prefetch its weight rows (w is never written during a step), so a layer's weights stream in
// while the kernel before it (a norm, attention) still runs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "model/cuda/gemv.h"

namespace pagedattn::model::cuda {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::launch_kernel;
using ::pagedattn::cuda::pdl_trigger;
using ::pagedattn::cuda::pdl_wait;
using ::pagedattn::cuda::prefetch_l2_bulk;
using ::pagedattn::cuda::vec_to_float;
using ::pagedattn::cuda::warp_sum;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 8;                              // halves in one 16-byte vector
constexpr int kMinGroupShift = 5, kMaxGroupShift = 8;  // groups of 32 .. kThreads threads
static_assert(kThreads == 1 << kMaxGroupShift);

// Rows of w per thread: each x chunk serves kRows rows, so the L1 traffic for x is kM / kRows
// times the weight traffic; more rows cost registers (kM x kRows sums).
template <int kM>
constexpr int kRows = kM >= 4 ? 4 : 2;
// Chunks per thread per iteration: kRows x kUnroll = 4 weight loads in flight per thread.
template <int kM>
constexpr int kUnroll = 4 / kRows<kM>;

// Blocks per SM the registers must allow (__launch_bounds__'s second argument; 0: unstated, as
// if absent). Unstated up to m = 5: ptxas (CUDA 13, sm_90a) then takes 34 .. 80 registers without
// spills, 3 to 6 blocks per SM (stating 1 makes it take more). 2 from m = 6, where ptxas would
// squeeze into 80 registers and spill; 104 .. 120 registers, 2 blocks: 16 warps x 4 x 16 bytes =
// 32 KiB of weight loads in flight per SM, above what the memory latency asks for.
template <int kM>
constexpr int kMinBlocks = kM >= 6 ? 2 : 0;

// 16 bytes of weights. w is read-only while the kernel runs and each byte is read once: the
// non-coherent path, without allocating in L1 (which holds x).
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// x [kM, chunks * 8] (row stride ldx), w [n, chunks * 8] (ldw), y [kM, n] (ldy); grid: one block
// per kRows x (kThreads >> group_shift) rows of w.
template <class T, int kM>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kM>)
    gemv_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w, int64_t ldw,
                int64_t n, int chunks, int group_shift, float* __restrict__ y, int64_t ldy) {
  constexpr int kR = kRows<kM>, kU = kUnroll<kM>;
  constexpr int kSums = kM * kR;  // per thread, and per group after the reduction
  __shared__ float partial[kWarps][kSums];
  const int groups = kThreads >> group_shift;  // per block
  // This block's weight rows stream into the L2 while the previous kernel drains: w is no kernel's
  // output, and a prefetch reads no value (pdl.cuh), so it may precede the wait.
  if (const int64_t row = int64_t{blockIdx.x} * groups * kR + threadIdx.x;
      threadIdx.x < groups * kR && row < n) {
    prefetch_l2_bulk(w + row * ldw, static_cast<unsigned>(chunks) * 16u);
  }
  pdl_wait();  // first global access (cuda/launch.h)
  pdl_trigger();

  const int group_threads = 1 << group_shift;
  const int group = static_cast<int>(threadIdx.x) >> group_shift;
  const int member = static_cast<int>(threadIdx.x) & (group_threads - 1);
  const int64_t first_row = (int64_t{blockIdx.x} * groups + group) * kR;

  // Rows past n (the last block's) read nothing and are never stored; their threads still take
  // part in the shuffles and the barrier below.
  bool row_valid[kR];
  const uint4* w_row[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    row_valid[r] = first_row + r < n;
    w_row[r] = reinterpret_cast<const uint4*>(w + (row_valid[r] ? first_row + r : 0) * ldw);
  }

  float acc[kM][kR];
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[i][r] = 0.0f;

  for (int c0 = member; c0 < chunks; c0 += kU * group_threads) {
    // Loads first (chunks past k as zeros: 0 · 0 adds nothing), then the products.
    uint4 wv[kU][kR], xv[kU][kM];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * group_threads;
      const bool in_k = c < chunks;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        wv[u][r] = in_k && row_valid[r] ? load_weights(w_row[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        xv[u][i] = in_k ? reinterpret_cast<const uint4*>(x + i * ldx)[c] : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float wf[kR][kChunk];
#pragma unroll
      for (int r = 0; r < kR; ++r) vec_to_float<T>(wv[u][r], wf[r]);
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        float xf[kChunk];
        vec_to_float<T>(xv[u][i], xf);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int e = 0; e < kChunk; ++e) acc[i][r] = fmaf(xf[e], wf[r][e], acc[i][r]);
        }
      }
    }
  }

  // Every lane of every warp gets here (no early exit): full-mask shuffles, then the barrier.
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float sum = warp_sum(acc[i][r]);
      if (lane == 0) partial[warp][i * kR + r] = sum;
    }
  }
  __syncthreads();
  // One thread per (group, x row, w row) of the block: its group's warps summed in order.
  const int warps_per_group = group_threads >> 5;
  for (int o = static_cast<int>(threadIdx.x); o < groups * kSums; o += kThreads) {
    const int g = o / kSums, slot = o % kSums;
    const int i = slot / kR, r = slot % kR;
    const int64_t row = (int64_t{blockIdx.x} * groups + g) * kR + r;
    float sum = partial[g * warps_per_group][slot];
    for (int j = 1; j < warps_per_group; ++j) sum += partial[g * warps_per_group + j][slot];
    if (row < n) y[i * ldy + row] = sum;
  }
}

struct Plan {
  int group_shift;
  int64_t blocks;
};

template <int kM>
Plan plan_launch(int64_t n, int chunks, int sm_count) {
  const auto blocks = [n](int shift) {
    const int64_t rows = int64_t{kRows<kM>} * (kThreads >> shift);
    return (n + rows - 1) / rows;
  };
  // The narrowest group that covers k in one iteration (each thread kUnroll chunks)...
  int shift = kMinGroupShift;
  while (shift < kMaxGroupShift && (int64_t{kUnroll<kM>} << shift) < chunks) ++shift;
  // ...widened (k over more threads, fewer rows per block, more blocks) while the SMs would get
  // fewer than two blocks each and every thread of the wider group still has a chunk.
  while (shift < kMaxGroupShift && blocks(shift) < 2 * int64_t{sm_count} &&
         (int64_t{2} << shift) <= chunks) {
    ++shift;
  }
  return {shift, blocks(shift)};
}

struct Operands {
  const void* x;
  int64_t ldx;
  const void* w;
  int64_t ldw;
  int64_t n;
  int chunks;
  float* y;
  int64_t ldy;
  int sm_count;
  cudaStream_t stream;
};

template <class T, int kM>
void launch(const Operands& a) {
  const Plan plan = plan_launch<kM>(a.n, a.chunks, a.sm_count);
  if (plan.blocks > INT32_MAX) {
    throw_error("gemv: n = " + std::to_string(a.n) + " needs " + std::to_string(plan.blocks) +
                " blocks (at most 2^31 - 1)");
  }
  launch_kernel(gemv_kernel<T, kM>, static_cast<unsigned>(plan.blocks), kThreads, 0, a.stream,
                static_cast<const T*>(a.x), a.ldx, static_cast<const T*>(a.w), a.ldw, a.n, a.chunks,
                plan.group_shift, a.y, a.ldy);
  check_launch("gemv_kernel");
}

// launch<T, m> for the runtime m in [kM, kGemvMaxRows].
template <class T, int kM = 1>
void launch_rows(int64_t m, const Operands& a) {
  if constexpr (kM <= kGemvMaxRows) {
    if (m == kM) return launch<T, kM>(a);
    return launch_rows<T, kM + 1>(m, a);
  }
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
                    DType dtype) {
  return m >= 1 && m <= kGemvMaxRows && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         k >= kChunk && k <= INT32_MAX && k % kChunk == 0 && ldx % kChunk == 0 &&
         ldw % kChunk == 0 && ldx >= k && ldw >= k && x != nullptr && w != nullptr &&
         aligned_16(x) && aligned_16(w);
}

void gemv(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
          DType dtype, float* y, int64_t ldy, int sm_count, void* stream) {
  if (!gemv_supported(m, k, x, ldx, w, ldw, dtype)) {
    throw_error("gemv: m " + std::to_string(m) + ", k " + std::to_string(k) + ", ldx " +
                std::to_string(ldx) + ", ldw " + std::to_string(ldw) + ", dtype " +
                std::string(dtype_name(dtype)) +
                " (expected 1 <= m <= 8, bf16 or f16, k, ldx, ldw multiples of 8 with ldx, ldw "
                ">= k >= 8, x and w 16-byte aligned)");
  }
  if (n < 0 || ldy < n || (n > 0 && y == nullptr) || sm_count < 1) {
    throw_error("gemv: n " + std::to_string(n) + ", ldy " + std::to_string(ldy) + ", sm_count " +
                std::to_string(sm_count) + " (expected 0 <= n <= ldy, an output, sm_count >= 1)");
  }
  if (n == 0) return;
  const Operands a{.x = x,
                   .ldx = ldx,
                   .w = w,
                   .ldw = ldw,
                   .n = n,
                   .chunks = static_cast<int>(k / kChunk),
                   .y = y,
                   .ldy = ldy,
                   .sm_count = sm_count,
                   .stream = static_cast<cudaStream_t>(stream)};
  if (dtype == DType::kBF16) {
    launch_rows<__nv_bfloat16>(m, a);
  } else {
    launch_rows<__half>(m, a);
  }
}

}  // namespace pagedattn::model::cuda
