// Launch of the CUDA MLA kernels: the kernel for the cache dtype and row block over the split-KV
// partition, then the merge of split requests. No fmt here (nvcc host passes cannot compile it);
// launch failures become pagedattn::Error through check_launch.
//
// Kernel choice (bf16 cache): blocks of 64 rows run the wgmma kernel (kernel_sm90.cuh) on a
// compute capability 9.x device when the binary holds its sm_90a code, blocks of 16 rows the
// read-bound kernel (kernel_small.cuh); the general mma.sync kernel (kernel.cuh, templated on the
// row block) serves the rest: fp8 caches and sm_80. PAGEDATTN_MLA_KERNEL=mma forces the general
// kernel everywhere (tests and benchmarks compare them).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_check.h"
#include "cuda/mla/config.h"
#include "cuda/mla/kernel.cuh"
#include "cuda/mla/kernel_sm90.cuh"
#include "cuda/mla/kernel_sm90_ws.cuh"
#include "cuda/mla/kernel_small.cuh"

namespace pagedattn::cuda::mla {
namespace {

template <class KVT, int kRows>
void launch_mma(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  // Once per process and instantiation: the shared-memory opt-in beyond 48 KiB.
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      mla_kernel<KVT, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<kRows>::kBytes);
  PA_CUDA_CHECK(attribute_status);
  mla_kernel<KVT, kRows>
      <<<dim3(row_blocks, grid_items), kThreads, Smem<kRows>::kBytes, stream>>>(params);
  check_launch("mla_kernel");
}

bool mma_forced() {
  const char* env = std::getenv("PAGEDATTN_MLA_KERNEL");  // read per call, so tests can switch
  return env != nullptr && std::strcmp(env, "mma") == 0;
}

// Whether this process can run the wgmma kernel: a 9.x device and sm_90a code in the binary (both
// fixed for the process, checked once).
bool sm90_available() {
  static const bool available = [] {
    cudaFuncAttributes attributes{};
    int device = 0, major = 0;
    return cudaFuncGetAttributes(&attributes, sm90::mla_kernel_sm90) == cudaSuccess &&
           attributes.binaryVersion >= 90 && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major == 9;
  }();
  return available;
}

void launch_small(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      small::mla_kernel_small, cudaFuncAttributeMaxDynamicSharedMemorySize, small::Tile::kBytes);
  PA_CUDA_CHECK(attribute_status);
  small::mla_kernel_small<<<dim3(row_blocks, grid_items), kThreads, small::Tile::kBytes, stream>>>(
      params);
  check_launch("mla_kernel_small");
}

void launch_sm90_ws(const MlaParams& params, int grid_items, int row_blocks,
                    cudaStream_t stream) {
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(sm90ws::mla_kernel_sm90_ws, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           sm90ws::Ws::kSmemBytes);
  PA_CUDA_CHECK(attribute_status);
  sm90ws::mla_kernel_sm90_ws<<<dim3(row_blocks, grid_items), sm90ws::Ws::kThreads,
                               sm90ws::Ws::kSmemBytes, stream>>>(params);
  check_launch("mla_kernel_sm90_ws");
}

// PAGEDATTN_MLA_SM90=split: the two-warpgroup kernel (kernel_sm90.cuh) instead of the
// warp-specialized one (read per call, so tests and benchmarks can compare them).
bool sm90_split_forced() {
  const char* env = std::getenv("PAGEDATTN_MLA_SM90");
  return env != nullptr && std::strcmp(env, "split") == 0;
}

void launch_sm90(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      sm90::mla_kernel_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::Tile::kSmemBytes);
  PA_CUDA_CHECK(attribute_status);
  sm90::mla_kernel_sm90<<<dim3(row_blocks, grid_items), sm90::Tile::kThreads,
                          sm90::Tile::kSmemBytes, stream>>>(params);
  check_launch("mla_kernel_sm90");
}

}  // namespace

void launch_mla(const MlaParams& params, bool fp8_kv, int block_rows, int grid_items,
                int row_blocks, bool merge, int merge_rows, void* stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  // The looping kernels take up to 65535 row blocks in grid.x (a CTA loops over the rest).
  const int grid_rows = std::min(row_blocks, 65535);
  const bool general = fp8_kv || mma_forced();
  bool merged = false;  // the kernel merged split requests itself
  if (block_rows == 16) {
    if (fp8_kv) {
      launch_mma<__nv_fp8_e4m3, 16>(params, grid_items, grid_rows, cuda_stream);
    } else if (general) {
      launch_mma<__nv_bfloat16, 16>(params, grid_items, grid_rows, cuda_stream);
    } else {
      launch_small(params, grid_items, grid_rows, cuda_stream);
      merged = params.fused_merge;
    }
  } else if (fp8_kv) {
    launch_mma<__nv_fp8_e4m3, 64>(params, grid_items, grid_rows, cuda_stream);
  } else if (!general && sm90_available()) {
    // The warp-specialized kernel takes one row block per CTA (grid.x covers them all).
    if (row_blocks <= 65535 && !sm90_split_forced()) {
      launch_sm90_ws(params, grid_items, row_blocks, cuda_stream);
    } else {
      launch_sm90(params, grid_items, grid_rows, cuda_stream);
    }
  } else {
    launch_mma<__nv_bfloat16, 64>(params, grid_items, grid_rows, cuda_stream);
  }
  if (merge && !merged) {
    mla_merge_kernel<<<dim3(params.batch_size, merge_rows), kMergeThreads, 0, cuda_stream>>>(
        params);
    check_launch("mla_merge_kernel");
  }
}

}  // namespace pagedattn::cuda::mla
