// Host-side launch of the prefill kernels for one element type: kernel choice, head-dim dispatch,
// grid bound, shared-memory opt-in, launch check. Included by the per-dtype instantiation files
// (one per dtype keeps each nvcc job small).
//
// Kernel choice: the wgmma kernel (kernel_sm90.cuh) on a compute capability 9.x device when the
// binary holds its sm_90a code, else the mma.sync kernel (kernel.cuh), which also serves sm_80.
// PAGEDATTN_PREFILL_KERNEL=mma forces the mma.sync kernel (tests and benchmarks compare the two).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/kernel_sm90.cuh"
#include "cuda/prefill/params.h"

namespace pagedattn::cuda::prefill {

inline bool mma_forced() {
  const char* env = std::getenv("PAGEDATTN_PREFILL_KERNEL");
  return env != nullptr && std::strcmp(env, "mma") == 0;
}

template <class Kernel>
void launch_kernel(Kernel* kernel, PrefillParams params, int block_rows, int threads, int smem,
                   cudaStream_t stream) {
  params.num_tiles_bound = static_cast<int32_t>(tile_bound(params, block_rows));
  const int64_t blocks = int64_t{params.num_tiles_bound} * params.num_kv_heads;
  if (blocks == 0) return;
  PA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(params);
  check_launch("prefill_kernel");
}

template <class T, int kHeadDimQk, int kHeadDimVo>
void launch_config(const PrefillParams& params, cudaStream_t stream) {
  auto* sm90 = &sm90::prefill_kernel_sm90<T, kHeadDimQk, kHeadDimVo>;
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
  if (major == 9 && has_sm90 && !mma_forced()) {
    using C = sm90::Config<kHeadDimQk, kHeadDimVo>;
    return launch_kernel(sm90, params, C::kBlockM, C::kThreads, C::kSmemBytes, stream);
  }
  using C = TileConfig<kHeadDimQk, kHeadDimVo>;
  launch_kernel(&prefill_kernel<T, kHeadDimQk, kHeadDimVo>, params, C::kBlockM, C::kThreads,
                C::kSmemBytes, stream);
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
