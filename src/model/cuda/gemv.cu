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
#include "model/cuda/activation.cuh"
#include "model/cuda/gemv.h"

namespace pagedattn::model::cuda {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::from_float;
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

// The kernel's operands (GemvArgs with k in 16-byte chunks and the launch's group width).
template <class T>
struct KernelArgs {
  const T* x;
  int64_t ldx;
  const float* norm_in;
  int64_t ld_norm_in;
  const float* norm_weight;
  float eps;
  const T* w;
  int64_t ldw;
  int64_t n;
  int chunks;
  int group_shift;
  GemvOutput output;
  float* y;
  int64_t ldy;
  const float* bias;
  T* act;
  int64_t ld_act;
};

// The row of w behind slot r (< kR) of group `unit` (blockIdx.x * groups + group), or n where
// there is none. kSiluPairs: a group owns kR / 2 pairs, gate row j in its first half of the
// slots, up row n / 2 + j in the second, so each thread's sums hold both factors of its outputs.
template <int kR>
__device__ __forceinline__ int64_t weight_row(int64_t unit, int r, int64_t n, bool pairs) {
  if (!pairs) return unit * kR + r < n ? unit * kR + r : n;
  constexpr int kHalf = kR / 2;
  const int64_t half_n = n / 2;
  const int64_t pair = unit * kHalf + r % kHalf;
  return pair < half_n ? (r < kHalf ? pair : half_n + pair) : n;
}

// x [kM, chunks * 8] (row stride ldx) or, with kNorm, the RMSNorm of norm_in's rows staged in
// shared memory; w [n, chunks * 8] (ldw); the output per a.output. Grid: one block per
// kRows x (kThreads >> group_shift) rows of w. Dynamic shared memory: kM x chunks x 16 bytes with
// kNorm, else none.
template <class T, int kM, bool kNorm>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kM>) gemv_kernel(const KernelArgs<T> a) {
  constexpr int kR = kRows<kM>, kU = kUnroll<kM>;
  constexpr int kSums = kM * kR;  // per thread, and per group after the reduction
  static_assert(kR % 2 == 0 && kSums >= kM);
  __shared__ float partial[kWarps][kSums];
  extern __shared__ uint4 staged[];              // kNorm: x [kM][chunks * 8] of T
  const int groups = kThreads >> a.group_shift;  // per block
  const bool pairs = a.output == GemvOutput::kSiluPairs;
  // This block's weight rows stream into the L2 while the previous kernel drains: w is no kernel's
  // output, and a prefetch reads no value (pdl.cuh), so it may precede the wait.
  if (threadIdx.x < groups * kR) {
    const int64_t row = weight_row<kR>(int64_t{blockIdx.x} * groups + threadIdx.x / kR,
                                       static_cast<int>(threadIdx.x) % kR, a.n, pairs);
    if (row < a.n) prefetch_l2_bulk(a.w + row * a.ldw, static_cast<unsigned>(a.chunks) * 16u);
  }
  pdl_wait();  // first global access (cuda/launch.h)
  pdl_trigger();

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const T* x = a.x;
  int64_t ldx = a.ldx;
  if constexpr (kNorm) {
    // add_rms_norm's arithmetic in its order (kernels.cu: the same 256-thread stride, the same
    // butterfly and warp order), so the staged x equals its output bit for bit.
    static_assert(kThreads == 256);
    const int k = a.chunks * kChunk;
    float squares[kM];
#pragma unroll
    for (int i = 0; i < kM; ++i) squares[i] = 0.0f;
    for (int d = static_cast<int>(threadIdx.x); d < k; d += kThreads) {
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        const float v = a.norm_in[i * a.ld_norm_in + d];
        squares[i] += v * v;
      }
    }
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      const float sum = warp_sum(squares[i]);
      if (lane == 0) partial[warp][i] = sum;
    }
    __syncthreads();
    float inverse[kM];
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      float total = 0.0f;
      for (int j = 0; j < kWarps; ++j) total += partial[j][i];
      inverse[i] = 1.0f / sqrtf(total / static_cast<float>(k) + a.eps);
    }
    T* xs = reinterpret_cast<T*>(staged);
    for (int d = static_cast<int>(threadIdx.x); d < k; d += kThreads) {
      const float weight = a.norm_weight[d];
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        xs[i * k + d] = from_float<T>(weight * (a.norm_in[i * a.ld_norm_in + d] * inverse[i]));
      }
    }
    __syncthreads();  // x staged; partial free again
    x = xs;
    ldx = k;
  }

  const int group_threads = 1 << a.group_shift;
  const int group = static_cast<int>(threadIdx.x) >> a.group_shift;
  const int member = static_cast<int>(threadIdx.x) & (group_threads - 1);
  const int64_t unit = int64_t{blockIdx.x} * groups + group;

  // Slots without a row (past n, or past the last pair) read nothing and are never stored; their
  // threads still take part in the shuffles and the barrier below.
  bool row_valid[kR];
  const uint4* w_row[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t row = weight_row<kR>(unit, r, a.n, pairs);
    row_valid[r] = row < a.n;
    w_row[r] = reinterpret_cast<const uint4*>(a.w + (row_valid[r] ? row : 0) * a.ldw);
  }

  float acc[kM][kR];
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[i][r] = 0.0f;

  const int chunks = a.chunks;
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
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float sum = warp_sum(acc[i][r]);
      if (lane == 0) partial[warp][i * kR + r] = sum;
    }
  }
  __syncthreads();
  // One thread per (group, x row, output) of the block: its group's warps summed in order.
  const int warps_per_group = group_threads >> 5;
  const auto group_sum = [&](int g, int slot) {
    float sum = partial[g * warps_per_group][slot];
    for (int j = 1; j < warps_per_group; ++j) sum += partial[g * warps_per_group + j][slot];
    return sum;
  };
  const int outputs = pairs ? kSums / 2 : kSums;  // per group
  for (int o = static_cast<int>(threadIdx.x); o < groups * outputs; o += kThreads) {
    const int g = o / outputs, slot = o % outputs;
    const int64_t g_unit = int64_t{blockIdx.x} * groups + g;
    if (!pairs) {
      const int i = slot / kR, r = slot % kR;
      const int64_t row = weight_row<kR>(g_unit, r, a.n, false);
      if (row >= a.n) continue;
      float sum = group_sum(g, slot);
      if (a.bias != nullptr) sum += a.bias[row];  // add_bias's order
      float* out = a.y + i * a.ldy + row;
      *out = a.output == GemvOutput::kAccumulate ? *out + sum : sum;  // add_rms_norm's order
      continue;
    }
    constexpr int kHalf = kR / 2;
    const int i = slot / kHalf, p = slot % kHalf;
    const int64_t gate_row = weight_row<kR>(g_unit, p, a.n, true);
    if (gate_row >= a.n) continue;
    const int64_t up_row = gate_row + a.n / 2;
    float gate = group_sum(g, i * kR + p), up = group_sum(g, i * kR + kHalf + p);
    if (a.bias != nullptr) {
      gate += a.bias[gate_row];
      up += a.bias[up_row];
    }
    a.act[i * a.ld_act + gate_row] = from_float<T>(silu_times(gate, up));
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

template <class T, int kM>
void launch(const GemvArgs& g) {
  const int chunks = static_cast<int>(g.k / kChunk);
  const Plan plan = plan_launch<kM>(g.n, chunks, g.sm_count);
  if (plan.blocks > INT32_MAX) {
    throw_error("gemv: n = " + std::to_string(g.n) + " needs " + std::to_string(plan.blocks) +
                " blocks (at most 2^31 - 1)");
  }
  const KernelArgs<T> a{.x = static_cast<const T*>(g.x),
                        .ldx = g.ldx,
                        .norm_in = g.norm_in,
                        .ld_norm_in = g.ld_norm_in,
                        .norm_weight = g.norm_weight,
                        .eps = g.eps,
                        .w = static_cast<const T*>(g.w),
                        .ldw = g.ldw,
                        .n = g.n,
                        .chunks = chunks,
                        .group_shift = plan.group_shift,
                        .output = g.output,
                        .y = g.y,
                        .ldy = g.ldy,
                        .bias = g.bias,
                        .act = static_cast<T*>(g.act),
                        .ld_act = g.ld_act};
  const auto stream = static_cast<cudaStream_t>(g.stream);
  if (g.input == GemvInput::kRmsNorm) {
    const size_t smem = static_cast<size_t>(kM) * static_cast<size_t>(g.k) * sizeof(T);
    launch_kernel(gemv_kernel<T, kM, true>, static_cast<unsigned>(plan.blocks), kThreads, smem,
                  stream, a);
  } else {
    launch_kernel(gemv_kernel<T, kM, false>, static_cast<unsigned>(plan.blocks), kThreads, 0,
                  stream, a);
  }
  check_launch("gemv_kernel");
}

// launch<T, m> for the runtime m in [kM, kGemvMaxRows].
template <class T, int kM = 1>
void launch_rows(const GemvArgs& g) {
  if constexpr (kM <= kGemvMaxRows) {
    if (g.m == kM) return launch<T, kM>(g);
    return launch_rows<T, kM + 1>(g);
  }
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

std::string plain_form(int64_t m, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
                       DType dtype) {
  return "m " + std::to_string(m) + ", k " + std::to_string(k) + ", ldx " + std::to_string(ldx) +
         ", ldw " + std::to_string(ldw) + ", dtype " + std::string(dtype_name(dtype)) +
         (x == nullptr ? ", no x" : "") + (w == nullptr ? ", no w" : "") +
         " (expected 1 <= m <= 8, bf16 or f16, k, ldx, ldw multiples of 8 with ldx, ldw >= k >= "
         "8, x and w 16-byte aligned)";
}

// The rules on m, k, w and the dtype; and on x where it is read from memory (kX: kRmsNorm stages
// its own, row stride k, aligned).
bool weights_supported(int64_t m, int64_t k, const void* w, int64_t ldw, DType dtype) {
  return m >= 1 && m <= kGemvMaxRows && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         k >= kChunk && k <= INT32_MAX && k % kChunk == 0 && ldw % kChunk == 0 && ldw >= k &&
         w != nullptr && aligned_16(w);
}
bool x_supported(int64_t k, const void* x, int64_t ldx) {
  return ldx % kChunk == 0 && ldx >= k && x != nullptr && aligned_16(x);
}

}  // namespace

bool gemv_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
                    DType dtype) {
  return weights_supported(m, k, w, ldw, dtype) && x_supported(k, x, ldx);
}

std::string gemv_unsupported(const GemvArgs& g) {
  const bool norm = g.input == GemvInput::kRmsNorm;
  if (!weights_supported(g.m, g.k, g.w, g.ldw, g.dtype) ||
      (!norm && !x_supported(g.k, g.x, g.ldx))) {
    return plain_form(g.m, g.k, g.x, g.ldx, g.w, g.ldw, g.dtype);
  }
  if (g.n < 0 || g.sm_count < 1) {
    return "n " + std::to_string(g.n) + ", sm_count " + std::to_string(g.sm_count) +
           " (expected n >= 0, sm_count >= 1)";
  }
  if (norm) {
    if (g.norm_in == nullptr || g.norm_weight == nullptr || g.ld_norm_in < g.k) {
      return "RMSNorm input: norm_in " + std::string(g.norm_in ? "set" : "missing") +
             ", norm_weight " + (g.norm_weight ? "set" : "missing") + ", ld_norm_in " +
             std::to_string(g.ld_norm_in) + " (expected both, ld_norm_in >= k " +
             std::to_string(g.k) + ")";
    }
    if (g.m * g.k * 2 > kGemvNormMaxBytes) {
      return "RMSNorm input: m " + std::to_string(g.m) + " x k " + std::to_string(g.k) +
             " staged x needs " + std::to_string(g.m * g.k * 2) +
             " bytes of shared memory (at most " + std::to_string(kGemvNormMaxBytes) + ")";
    }
  }
  if (g.output == GemvOutput::kSiluPairs) {
    if (g.n % 2 != 0 || g.act == nullptr || g.ld_act < g.n / 2) {
      return "SiLU pairs output: n " + std::to_string(g.n) + ", act " +
             (g.act ? "set" : "missing") + ", ld_act " + std::to_string(g.ld_act) +
             " (expected n even, act, ld_act >= n / 2)";
    }
  } else if (g.ldy < g.n || (g.n > 0 && g.y == nullptr)) {
    return "output: n " + std::to_string(g.n) + ", ldy " + std::to_string(g.ldy) +
           (g.y == nullptr ? ", no y" : "") + " (expected y with ldy >= n)";
  }
  return "";
}

void gemv(const GemvArgs& args) {
  if (const std::string problem = gemv_unsupported(args); !problem.empty()) {
    throw_error("gemv: " + problem);
  }
  if (args.n == 0) return;
  if (args.dtype == DType::kBF16) {
    launch_rows<__nv_bfloat16>(args);
  } else {
    launch_rows<__half>(args);
  }
}

void gemv(int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx, const void* w, int64_t ldw,
          DType dtype, float* y, int64_t ldy, int sm_count, void* stream) {
  gemv(GemvArgs{.m = m,
                .n = n,
                .k = k,
                .dtype = dtype,
                .w = w,
                .ldw = ldw,
                .x = x,
                .ldx = ldx,
                .y = y,
                .ldy = ldy,
                .sm_count = sm_count,
                .stream = stream});
}

}  // namespace pagedattn::model::cuda
