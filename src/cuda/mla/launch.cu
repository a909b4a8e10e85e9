// Launch of the CUDA MLA kernels (kernel.cuh): the bf16 kernel over the split-KV partition, then
// the merge of split requests. No fmt here (nvcc host passes cannot compile it); launch failures
// become pagedattn::Error through check_launch.
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/mla/config.h"
#include "cuda/mla/kernel.cuh"

namespace pagedattn::cuda::mla {

void launch_mla_bf16(const MlaParams& params, int grid_items, int row_blocks, bool merge,
                     int merge_rows, void* stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  // Once per process (and device-independent): the shared-memory opt-in beyond 48 KiB.
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes);
  PA_CUDA_CHECK(attribute_status);
  mla_kernel<<<dim3(row_blocks, grid_items), kThreads, Smem::kBytes, cuda_stream>>>(params);
  check_launch("mla_kernel");
  if (merge) {
    mla_merge_kernel<<<dim3(params.batch_size, merge_rows), kMergeThreads, 0, cuda_stream>>>(
        params);
    check_launch("mla_merge_kernel");
  }
}

}  // namespace pagedattn::cuda::mla
