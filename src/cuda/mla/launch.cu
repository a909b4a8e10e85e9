// Launch of the CUDA MLA kernels (kernel.cuh): the kernel for the cache dtype (bf16 or fp8 e4m3)
// over the split-KV partition, then the merge of split requests. No fmt here (nvcc host passes
// cannot compile it); launch failures become pagedattn::Error through check_launch.
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/mla/config.h"
#include "cuda/mla/kernel.cuh"

namespace pagedattn::cuda::mla {
namespace {

template <class KVT>
void launch_kernel(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  // Once per process and instantiation: the shared-memory opt-in beyond 48 KiB.
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      mla_kernel<KVT>, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes);
  PA_CUDA_CHECK(attribute_status);
  mla_kernel<KVT><<<dim3(row_blocks, grid_items), kThreads, Smem::kBytes, stream>>>(params);
  check_launch("mla_kernel");
}

}  // namespace

void launch_mla(const MlaParams& params, bool fp8_kv, int grid_items, int row_blocks, bool merge,
                int merge_rows, void* stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (fp8_kv) {
    launch_kernel<__nv_fp8_e4m3>(params, grid_items, row_blocks, cuda_stream);
  } else {
    launch_kernel<__nv_bfloat16>(params, grid_items, row_blocks, cuda_stream);
  }
  if (merge) {
    mla_merge_kernel<<<dim3(params.batch_size, merge_rows), kMergeThreads, 0, cuda_stream>>>(
        params);
    check_launch("mla_merge_kernel");
  }
}

}  // namespace pagedattn::cuda::mla
