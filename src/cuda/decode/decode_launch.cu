// Device side of decode: the merge kernel and the dispatch from runtime (head dim, dtypes) to the
// explicitly instantiated decode kernels: tensor cores when KV has q's dtype (decode_tc_d*.cu),
// the CUDA-core kernel for fp8 KV (decode_d*.cu). No fmt here (nvcc host passes cannot
// compile it); errors go through throw_error.
//
// Merge: one CTA per (request, query head), exiting at once for requests served by one item:
//   lse = M + log(sum_i exp(lse_i - M)),  out = sum_i exp(lse_i - lse) * out_i.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/decode/decode_params.h"

namespace pagedattn::cuda {
namespace {

constexpr int kMergeThreads = 128;

template <class QT>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const PartitionView partition, const float* partial_out, const float* partial_lse,
                 int num_qo_heads, int head_dim, QT* out, int64_t out_stride_batch,
                 int64_t out_stride_head, float* lse, int64_t lse_stride_batch,
                 int64_t lse_stride_head) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the decode kernel: wait for its partials.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int request = blockIdx.x;
  const int h = blockIdx.y;
  const int first = partition.merge_indptr[request];
  const int last = partition.merge_indptr[request + 1];
  if (last - first <= 1) return;
  float max_lse = -INFINITY;
  for (int i = first; i < last; ++i) max_lse = fmaxf(max_lse, partial_lse[i * num_qo_heads + h]);
  float weight_sum = 0.0f;
  for (int i = first; i < last; ++i) {
    const float part = partial_lse[i * num_qo_heads + h];
    weight_sum += max_lse == -INFINITY ? 0.0f : __expf(part - max_lse);
  }
  const float total_lse = weight_sum > 0.0f ? max_lse + __logf(weight_sum) : -INFINITY;
  for (int d = threadIdx.x; d < head_dim; d += kMergeThreads) {
    float value = 0.0f;
    if (weight_sum > 0.0f) {
      for (int i = first; i < last; ++i) {
        const float weight = __expf(partial_lse[i * num_qo_heads + h] - total_lse);
        value += weight * partial_out[(int64_t{i} * num_qo_heads + h) * head_dim + d];
      }
    }
    if constexpr (std::is_same_v<QT, __half>) {
      out[request * out_stride_batch + h * out_stride_head + d] = __float2half_rn(value);
    } else {
      out[request * out_stride_batch + h * out_stride_head + d] = __float2bfloat16_rn(value);
    }
  }
  if (lse != nullptr && threadIdx.x == 0) {
    lse[request * lse_stride_batch + h * lse_stride_head] = total_lse;
  }
}

template <int kHeadDim, class QT>
void launch_for_kv(DType kv_dtype, const DecodeParams& params, int grid_items, void* stream) {
  // KV of q's type: tensor cores. fp8 KV: the CUDA-core kernel (converts while it reads).
  if (kv_dtype == DType::kFP8E4M3) {
    launch_decode_kernel<kHeadDim, QT, __nv_fp8_e4m3>(params, grid_items, stream);
  } else {
    launch_decode_tc_kernel<kHeadDim, QT>(params, grid_items, stream);
  }
}

template <class QT>
void launch_for_head_dim(int head_dim, DType kv_dtype, const DecodeParams& params, int grid_items,
                         void* stream) {
  switch (head_dim) {
    case 64:
      return launch_for_kv<64, QT>(kv_dtype, params, grid_items, stream);
    case 128:
      return launch_for_kv<128, QT>(kv_dtype, params, grid_items, stream);
    case 256:
      return launch_for_kv<256, QT>(kv_dtype, params, grid_items, stream);
    default:
      throw_error("decode: head_dim " + std::to_string(head_dim) + " (supported: 64, 128, 256)");
  }
}

}  // namespace

void launch_decode(const DecodeParams& params, int head_dim, DType q_dtype, DType kv_dtype,
                   int grid_items, void* stream) {
  if (q_dtype == DType::kBF16) {
    launch_for_head_dim<__nv_bfloat16>(head_dim, kv_dtype, params, grid_items, stream);
  } else {
    launch_for_head_dim<__half>(head_dim, kv_dtype, params, grid_items, stream);
  }
  // The merge is a programmatic dependent launch (sm_90): it is scheduled while the decode kernel
  // runs and waits for it on the device, so the launch gap between the two disappears.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(params.batch, params.num_qo_heads);
  config.blockDim = dim3(kMergeThreads);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const int head = params.num_qo_heads;
  if (q_dtype == DType::kBF16) {
    PA_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_kernel<__nv_bfloat16>, params.partition,
                                     params.partial_out, params.partial_lse, head, head_dim,
                                     static_cast<__nv_bfloat16*>(params.out),
                                     params.out_stride_batch, params.out_stride_head, params.lse,
                                     params.lse_stride_batch, params.lse_stride_head));
  } else {
    PA_CUDA_CHECK(cudaLaunchKernelEx(
        &config, merge_kernel<__half>, params.partition, params.partial_out, params.partial_lse,
        head, head_dim, static_cast<__half*>(params.out), params.out_stride_batch,
        params.out_stride_head, params.lse, params.lse_stride_batch, params.lse_stride_head));
  }
  check_launch("merge_kernel");
}

}  // namespace pagedattn::cuda
