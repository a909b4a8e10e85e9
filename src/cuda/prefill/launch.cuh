// Host-side launch of prefill_kernel for one element type: head-dim dispatch, shared-memory opt-in,
// launch check. Included by the per-dtype instantiation files (one per dtype keeps each nvcc job
// small).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.h"
#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/params.h"

namespace pagedattn::cuda::prefill {

template <class T, int kHeadDimQk, int kHeadDimVo>
void launch_config(const PrefillParams& params, cudaStream_t stream) {
  using Config = TileConfig<kHeadDimQk, kHeadDimVo>;
  auto* kernel = &prefill_kernel<T, kHeadDimQk, kHeadDimVo>;
  PA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Config::kSmemBytes));
  const int64_t blocks = int64_t{params.num_tiles_bound} * params.num_kv_heads;
  if (blocks == 0) return;
  kernel<<<static_cast<unsigned>(blocks), Config::kThreads, Config::kSmemBytes, stream>>>(params);
  check_launch("prefill_kernel");
}

template <class T>
void launch_typed(const PrefillParams& params, int head_dim_qk, int head_dim_vo, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (head_dim_qk == 64 && head_dim_vo == 64) return launch_config<T, 64, 64>(params, s);
  if (head_dim_qk == 128 && head_dim_vo == 128) return launch_config<T, 128, 128>(params, s);
  if (head_dim_qk == 256 && head_dim_vo == 256) return launch_config<T, 256, 256>(params, s);
  if (head_dim_qk == 192 && head_dim_vo == 128) return launch_config<T, 192, 128>(params, s);
  throw_error("prefill: head_dim_qk/vo " + std::to_string(head_dim_qk) + "/" +
              std::to_string(head_dim_vo) +
              " is not supported (expected 64/64, 128/128, 256/256 or 192/128)");
}

}  // namespace pagedattn::cuda::prefill
