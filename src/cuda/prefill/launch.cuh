// Host-side launch of the prefill kernels for one element type: kernel choice, head-dim dispatch,
// grid bound, shared-memory opt-in, launch check, and the merge of split-KV partials. Included by
// the per-dtype instantiation files (one per (q dtype, cache dtype) keeps each nvcc job small).
//
// Kernel choice (the rule, in launch_config), on a compute capability 9.x device when the binary
// holds its sm_90a code: the warp-specialized kernel (kernel_sm90_ws.cuh) for head dims 64 and 128
// over a bf16 / f16 cache when a request may have more than 64 query rows (max_q_len * group size,
// or no hint) and the step's KV is more than 256 tokens a request (num_pages_hint x P / B, or no
// hint), else the one-warpgroup wgmma kernel (kernel_sm90.cuh: other head dims, an fp8 cache,
// decode-like steps whose rows fill half a warp-specialized CTA at most, short KV); elsewhere the
// mma.sync kernel (kernel.cuh), which serves sm_80. The warp-specialized kernel runs a CTA per SM
// that takes its units as it comes free (launch_tiles), or a CTA per unit where the KV is split.
// PAGEDATTN_PREFILL_KERNEL forces one where it applies: mma (the sm_80 path, tested on the Hopper
// test machine, tests/cuda/prefill_test.cpp), sm90, and the warp-specialized kernel's schedules:
// ws (each math warpgroup on its own, a CTA per unit), ws-pingpong (the two take turns at the
// tensor cores, a CTA per unit), ws-persistent (turns, a CTA per SM: the default; ws-persistent-N:
// N CTAs); ARCHITECTURE.md lists every switch. Every kernel goes through cuda/launch.h's
// launch_kernel (programmatic dependent launch on 9.x devices).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/kernel_sm90.cuh"
#include "cuda/prefill/kernel_sm90_ws.cuh"
#include "cuda/prefill/params.h"

namespace pagedattn::cuda::prefill {

// PAGEDATTN_PREFILL_KERNEL (ARCHITECTURE.md, "Switches"): read per launch; "" when unset.
inline const char* forced_kernel() {
  const char* env = std::getenv("PAGEDATTN_PREFILL_KERNEL");
  return env != nullptr ? env : "";
}

// Combines the split-KV partials of each (query row, head) (params.h): out = sum_c w_c O_c /
// sum_c w_c with w_c = 2^(lse_c - max_c lse_c), lse = ln(sum_c 2^lse_c). One warp per (row, head),
// each lane 4 columns at a time; rows past qo_indptr[B] belong to no request and stay untouched,
// as in the unsplit kernel. A row with a poisoned partial (common/guard.h) gets 0 / -inf.
template <class T>
__global__ void __launch_bounds__(128)
    prefill_merge_kernel(const __grid_constant__ PrefillParams p, int head_dim_vo) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  constexpr float kLog2e = 1.4426950408889634f;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t pair = int64_t{blockIdx.x} * 4 + warp;
  // qo_indptr[B] on trust (common/guard.h): never past q's rows.
  const int64_t rows = min(static_cast<int64_t>(__ldg(p.qo_indptr + p.batch_size)), p.num_qo_rows);
  if (pair >= rows * p.num_qo_heads) return;
  const int64_t row = pair / p.num_qo_heads;
  const int head = static_cast<int>(pair - row * p.num_qo_heads);
  const int64_t chunk_stride = p.num_qo_rows * p.num_qo_heads;
  float m = -INFINITY;
  bool poisoned = false;
  for (int c = 0; c < p.num_kv_chunks; ++c) {
    const float lse = p.partial_lse[c * chunk_stride + pair];
    poisoned |= is_poisoned(lse);
    m = fmaxf(m, lse);
  }
  if (poisoned) m = -INFINITY;  // a chunk met a page id outside the pool: 0 / -inf
  float sum = 0.0f;
  if (m != -INFINITY) {
    for (int c = 0; c < p.num_kv_chunks; ++c)
      sum += exp2f(p.partial_lse[c * chunk_stride + pair] - m);
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  T* out = static_cast<T*>(p.out) + row * p.out_stride_token + head * p.out_stride_head;
  for (int d = 4 * lane; d < head_dim_vo; d += 128) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = 0; c < p.num_kv_chunks && sum > 0.0f; ++c) {
      const int64_t index = c * chunk_stride + pair;
      const float lse = p.partial_lse[index];
      if (lse == -INFINITY) continue;
      const float w = exp2f(lse - m);
      const float4 v = *reinterpret_cast<const float4*>(p.partial_out + index * head_dim_vo + d);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    *reinterpret_cast<uint32_t*>(out + d) = Mma<T>::pack(acc.x * inv, acc.y * inv);
    *reinterpret_cast<uint32_t*>(out + d + 2) = Mma<T>::pack(acc.z * inv, acc.w * inv);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[row * p.lse_stride_token + head * p.lse_stride_head] =
        sum > 0.0f ? (m + __log2f(sum)) / kLog2e : -INFINITY;
  }
}

// max_ctas > 0: at most that many CTAs, the warp-specialized kernel's persistent grid
// (kernel_sm90_ws.cuh: its CTAs take the units (query tile, KV head) from a counter as they come
// free); 0: a CTA per unit.
template <class T, class Kernel>
void launch_tiles(Kernel* kernel, PrefillParams params, int block_rows, int threads, int smem,
                  int head_dim_vo, cudaStream_t stream, int64_t max_ctas = 0) {
  params.num_tiles_bound = static_cast<int32_t>(tile_bound(params, block_rows));
  const int64_t units = int64_t{params.num_tiles_bound} * params.num_kv_heads;
  if (units == 0) return;
  const int64_t blocks = max_ctas > 0 ? std::min(units, max_ctas) : units;
  if (blocks == units) params.unit_counters = nullptr;  // a CTA per unit: no counter
  PA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(params.num_kv_chunks));
  launch_kernel(kernel, grid, threads, static_cast<size_t>(smem), stream, params);
  check_launch("prefill_kernel");
  if (params.num_kv_chunks > 1) {
    const int64_t pairs = params.num_qo_rows * params.num_qo_heads;
    launch_kernel(prefill_merge_kernel<T>, static_cast<unsigned>((pairs + 3) / 4), 128, 0, stream,
                  params, head_dim_vo);
    check_launch("prefill_merge_kernel");
  }
}

// KV: the cache's element type, T or __nv_fp8_e4m3 (kernel.cuh).
template <class T, class KV, int kHeadDimQk, int kHeadDimVo>
void launch_config(const PrefillParams& params, cudaStream_t stream) {
  auto* sm90 = &sm90::prefill_kernel_sm90<T, kHeadDimQk, kHeadDimVo, 64, KV>;
  // Whether this binary carries sm_90a code for the kernel (checked once; the build's targets do
  // not change at run time).
  static const bool has_sm90 = [&] {
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, sm90) == cudaSuccess &&
           attributes.binaryVersion >= 90;
  }();
  int device = 0, major = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const char* forced = forced_kernel();
  // The rule (above): wgmma where its sm_90a code runs (a 9.x device), unless mma is forced.
  if (major == 9 && has_sm90 && std::strcmp(forced, "mma") != 0) {
    if constexpr (kHeadDimQk == kHeadDimVo && (kHeadDimQk == 128 || kHeadDimQk == 64) &&
                  std::is_same_v<KV, T>) {
      // By default at head dims 64 and 128 where requests have more than 64 query rows and more
      // than 256 keys on average (a CTA's loop over short KV is mostly its prologue and epilogue:
      // the one-warpgroup kernel's CTAs, half as many rows, win there). H100, the persistent grid
      // against the one-warpgroup kernel, TFLOP/s, two rounds: at 16 / 8 heads 16 x 256 95.5 /
      // 95.8 against 91.0 / 97.8, 16 x 512 184 / 185 against 161 / 174, 8 x 1024 280 / 278
      // against 223 / 235; at 32 / 8 16 x 256 102 / 112 against 118 / 118, 16 x 512 182 / 200
      // against 192 / 193 (bench/RESULTS.md).
      const bool many_rows =
          params.max_q_len <= 0 || int64_t{params.max_q_len} * params.group_size > 64;
      const bool long_kv = params.kv_tokens_hint <= 0 ||
                           params.kv_tokens_hint > int64_t{256} * std::max(1, params.batch_size);
      const bool plain = std::strcmp(forced, "ws") == 0;
      const bool pingpong = std::strcmp(forced, "ws-pingpong") == 0;
      const bool persistent = std::string_view(forced).starts_with("ws-persistent");
      const bool by_default = many_rows && long_kv && std::strcmp(forced, "sm90") != 0;
      if (plain || pingpong || persistent || by_default) {
        auto* kernel = plain ? &sm90ws::prefill_kernel_sm90_ws<T, kHeadDimQk, false>
                             : &sm90ws::prefill_kernel_sm90_ws<T, kHeadDimQk, true>;
        using W = sm90ws::WsConfig<kHeadDimQk>;
        // The persistent grid by default and with ws-persistent: a CTA per SM (H100, forced side
        // by side against a CTA per unit: 1 x 8192 +6%, 16 x 2048 +11%, 4 x 2048 +10%, at 16 / 8
        // heads 1 x 2048 +5% and 16 x 2048 +14%: bench/RESULTS.md), N with ws-persistent-N (the
        // tests' many units a CTA). A CTA per unit with ws / ws-pingpong forced, and with a KV
        // split (chosen for grids that leave SMs idle).
        int64_t max_ctas = 0;
        if (params.num_kv_chunks <= 1 && !plain && !pingpong) {
          constexpr std::string_view kCtas = "ws-persistent-";
          max_ctas = std::string_view(forced).starts_with(kCtas)
                         ? std::max(1, std::atoi(forced + kCtas.size()))
                         : std::max(1, params.num_sms);
        }
        return launch_tiles<T>(kernel, params, W::kBlockM, W::kThreads, W::kSmemBytes, kHeadDimVo,
                               stream, max_ctas);
      }
    }
    using C = sm90::Config<kHeadDimQk, kHeadDimVo>;
    return launch_tiles<T>(sm90, params, C::kBlockM, C::kThreads, C::kSmemBytes, kHeadDimVo,
                           stream);
  }
  using C = TileConfig<kHeadDimQk, kHeadDimVo>;
  launch_tiles<T>(&prefill_kernel<T, kHeadDimQk, kHeadDimVo, KV>, params, C::kBlockM, C::kThreads,
                  C::kSmemBytes, kHeadDimVo, stream);
}

template <class T, class KV = T>
void launch_typed(const PrefillParams& params, int head_dim_qk, int head_dim_vo, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (head_dim_qk == 64 && head_dim_vo == 64) return launch_config<T, KV, 64, 64>(params, s);
  if (head_dim_qk == 128 && head_dim_vo == 128) return launch_config<T, KV, 128, 128>(params, s);
  if (head_dim_qk == 256 && head_dim_vo == 256) return launch_config<T, KV, 256, 256>(params, s);
  if (head_dim_qk == 192 && head_dim_vo == 128) return launch_config<T, KV, 192, 128>(params, s);
  throw_error("prefill: head_dim_qk/vo " + std::to_string(head_dim_qk) + "/" +
              std::to_string(head_dim_vo) +
              " is not supported (expected 64/64, 128/128, 256/256 or 192/128)");
}

}  // namespace pagedattn::cuda::prefill
