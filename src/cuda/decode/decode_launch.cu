// Device side of decode: the merge kernel and the dispatch from runtime (head dim, dtypes) to the
// explicitly instantiated decode kernels: tensor cores when KV has q's dtype (decode_tc_d*.cu),
// the CUDA-core kernel for fp8 KV (decode_d*.cu). No fmt here (nvcc host passes cannot
// compile it); errors go through throw_error.
//
// Merge (after the CUDA-core kernel, i.e. fp8 KV; the tensor-core kernel merges in its last CTA
// per request and head tile): one CTA per (request, query head), exiting at once for requests
// served by one item (head_dim <= 256):
//   lse = M + log(sum_i exp(lse_i - M)),  out = sum_i exp(lse_i - lse) * out_i;
// 0 / -inf for a row with a poisoned partial (an item that met a bad page id: common/guard.h).
// Launched, like the decode kernels, with programmatic dependent launch (cuda/launch.h): it is
// scheduled while the decode kernel drains and waits for its partials on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "cuda/common/guard.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_params.h"
#include "cuda/launch.h"

namespace pagedattn::cuda {
namespace {

constexpr int kMergeThreads = 128;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMergeTile = 512;  // item weights held in shared memory at a time

// Max or sum of `value` over the CTA (every thread gets the result). `scratch`: kMergeWarps floats.
template <bool kMax>
__device__ float block_reduce(float value, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = kMax ? fmaxf(value, other) : value + other;
  }
  __syncthreads();  // scratch is free (an earlier reduction's readers are done)
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  value = scratch[0];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w)
    value = kMax ? fmaxf(value, scratch[w]) : value + scratch[w];
  return value;
}

// The items' lse are read by all threads at once and reduced over the CTA; the weighted sum over
// items then runs with independent loads (unrolled), so a request split into many items costs a
// few memory latencies, not one per item.
template <class QT>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const PartitionView partition, const float* partial_out, const float* partial_lse,
                 int num_qo_heads, int head_dim, QT* out, int64_t out_stride_batch,
                 int64_t out_stride_head, float* lse, int64_t lse_stride_batch,
                 int64_t lse_stride_head) {
  pdl_wait();  // first (cuda/launch.h): the decode kernel's partials are complete
  pdl_trigger();
  __shared__ float scratch[kMergeWarps];
  __shared__ float weights[kMergeTile];
  const int request = blockIdx.x;
  const int h = blockIdx.y;
  const int first = partition.merge_indptr[request];
  const int last = partition.merge_indptr[request + 1];
  if (last - first <= 1) return;
  float max_lse = -INFINITY;
  bool poisoned = false;
  for (int i = first + threadIdx.x; i < last; i += kMergeThreads) {
    const float item_lse = partial_lse[int64_t{i} * num_qo_heads + h];
    poisoned |= is_poisoned(item_lse);
    max_lse = fmaxf(max_lse, item_lse);
  }
  // An item met a page id outside the pool (common/guard.h): the row is 0 / -inf.
  if (__syncthreads_or(poisoned)) max_lse = -INFINITY;
  max_lse = block_reduce<true>(max_lse, scratch);
  float weight_sum = 0.0f;
  if (max_lse != -INFINITY) {
    for (int i = first + threadIdx.x; i < last; i += kMergeThreads) {
      weight_sum += __expf(partial_lse[int64_t{i} * num_qo_heads + h] - max_lse);
    }
  }
  weight_sum = block_reduce<false>(weight_sum, scratch);
  const float total_lse = weight_sum > 0.0f ? max_lse + __logf(weight_sum) : -INFINITY;

  constexpr int kMaxDimsPerThread = 2;  // head_dim <= 256
  float value[kMaxDimsPerThread] = {0.0f, 0.0f};
  for (int base = first; base < last; base += kMergeTile) {
    const int count = min(kMergeTile, last - base);
    __syncthreads();  // the previous tile's weights are consumed
    for (int i = threadIdx.x; i < count; i += kMergeThreads) {
      weights[i] = weight_sum > 0.0f
                       ? __expf(partial_lse[int64_t{base + i} * num_qo_heads + h] - total_lse)
                       : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxDimsPerThread; ++j) {
      const int d = threadIdx.x + j * kMergeThreads;
      if (d >= head_dim) continue;
      const float* column = partial_out + (int64_t{base} * num_qo_heads + h) * head_dim + d;
      const int64_t item_stride = int64_t{num_qo_heads} * head_dim;
      float sum = 0.0f;
#pragma unroll 8
      for (int i = 0; i < count; ++i) sum += weights[i] * column[i * item_stride];
      value[j] += sum;
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxDimsPerThread; ++j) {
    const int d = threadIdx.x + j * kMergeThreads;
    if (d >= head_dim) continue;
    if constexpr (std::is_same_v<QT, __half>) {
      out[request * out_stride_batch + h * out_stride_head + d] = __float2half_rn(value[j]);
    } else {
      out[request * out_stride_batch + h * out_stride_head + d] = __float2bfloat16_rn(value[j]);
    }
  }
  if (lse != nullptr && threadIdx.x == 0) {
    lse[request * lse_stride_batch + h * lse_stride_head] = total_lse;
  }
}

// The rule: KV of q's dtype (bf16 / f16) -> the tensor-core kernel, which merges split requests
// in its last CTA per (request, head tile); fp8 KV -> the CUDA-core kernel (it converts while it
// reads), then the merge kernel. Returns true when the kernel merged split requests itself.
template <int kHeadDim, class QT>
bool launch_for_kv(DType kv_dtype, const DecodeParams& params, int grid_items, void* stream) {
  if (kv_dtype == DType::kFP8E4M3) {
    launch_decode_kernel<kHeadDim, QT, __nv_fp8_e4m3>(params, grid_items, stream);
    return false;
  }
  launch_decode_tc_kernel<kHeadDim, QT>(params, grid_items, stream);
  return true;
}

template <class QT>
bool launch_for_head_dim(int head_dim, DType kv_dtype, const DecodeParams& params, int grid_items,
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
  const bool merged =
      q_dtype == DType::kBF16
          ? launch_for_head_dim<__nv_bfloat16>(head_dim, kv_dtype, params, grid_items, stream)
          : launch_for_head_dim<__half>(head_dim, kv_dtype, params, grid_items, stream);
  if (merged) return;
  const dim3 grid(params.batch, params.num_qo_heads);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int head = params.num_qo_heads;
  if (q_dtype == DType::kBF16) {
    launch_kernel(merge_kernel<__nv_bfloat16>, grid, kMergeThreads, 0, cuda_stream,
                  params.partition, params.partial_out, params.partial_lse, head, head_dim,
                  static_cast<__nv_bfloat16*>(params.out), params.out_stride_batch,
                  params.out_stride_head, params.lse, params.lse_stride_batch,
                  params.lse_stride_head);
  } else {
    launch_kernel(merge_kernel<__half>, grid, kMergeThreads, 0, cuda_stream, params.partition,
                  params.partial_out, params.partial_lse, head, head_dim,
                  static_cast<__half*>(params.out), params.out_stride_batch, params.out_stride_head,
                  params.lse, params.lse_stride_batch, params.lse_stride_head);
  }
  check_launch("merge_kernel");
}

}  // namespace pagedattn::cuda
