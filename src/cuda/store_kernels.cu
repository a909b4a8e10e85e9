// The device store's kernels (API: store.cpp, include/pagedattn/cuda_store.h).
//
// check_slots_kernel: every slot against [0, num_slots); the first bad one is recorded
// (atomicCAS). store_rows_kernel: one CTA per token, threads over (row, element) of that token;
// it reads the status first and writes nothing if a slot was bad. Conversion through float; an fp8
// cache stores value / scale (a true division, as on the host), saturated.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "cuda/common/device_utils.cuh"
#include "cuda/cuda_check.h"
#include "cuda/store_kernels.h"

namespace pagedattn::cuda {
namespace {

constexpr int kStoreThreads = 256;

__device__ int64_t slot_of(const void* slots, bool i64, int64_t stride, int64_t t) {
  return i64 ? static_cast<const int64_t*>(slots)[t * stride]
             : int64_t{static_cast<const int32_t*>(slots)[t * stride]};
}

__device__ float load_float(const float* p) { return *p; }
__device__ float load_float(const __half* p) { return __half2float(*p); }
__device__ float load_float(const __nv_bfloat16* p) { return __bfloat162float(*p); }

template <class Dst>
__device__ Dst convert_store(float value, float scale) {
  if constexpr (std::is_same_v<Dst, float>) {
    return value;
  } else if constexpr (std::is_same_v<Dst, __nv_fp8_e4m3>) {
    return from_float<Dst>(value / scale);
  } else {
    return from_float<Dst>(value);
  }
}

__global__ void check_slots_kernel(const void* slots, bool i64, int64_t stride, int64_t num_tokens,
                                   int64_t num_slots, int32_t* status) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const int64_t slot = slot_of(slots, i64, stride, t);
  if (slot >= num_slots && atomicCAS(status, 0, 1) == 0) {
    status[1] = static_cast<int32_t>(t);
    status[2] = static_cast<int32_t>(slot >> 32);
    status[3] = static_cast<int32_t>(slot & 0xffffffff);
  }
}

template <class Dst, class Src>
__global__ void __launch_bounds__(kStoreThreads) store_rows_kernel(const StoreRows p) {
  if (p.status != nullptr && p.status[0] != 0) return;
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_of(p.slots, p.slots_i64, p.slots_stride, t);
  if (slot < 0 || slot >= p.num_slots) return;
  const int64_t page = slot / p.alloc_page_size;
  const int64_t offset = slot - page * p.alloc_page_size;
  Dst* dst = static_cast<Dst*>(p.cache) + page * p.stride_page + offset * p.stride_token;
  const Src* src = static_cast<const Src*>(p.input) + t * p.in_stride_token;
  for (int64_t i = threadIdx.x; i < p.rows * p.width; i += kStoreThreads) {
    const int64_t row = i / p.width;
    const int64_t e = i - row * p.width;
    const float value = load_float(src + row * p.in_stride_row + e * p.in_stride_elem);
    dst[row * p.stride_row + e] = convert_store<Dst>(value, p.scale);
  }
}

template <class Src>
void launch_store_for_dst(DType cache_dtype, const StoreRows& params, int64_t num_tokens,
                          cudaStream_t stream) {
  switch (cache_dtype) {
    case DType::kF32:
      store_rows_kernel<float, Src><<<num_tokens, kStoreThreads, 0, stream>>>(params);
      break;
    case DType::kF16:
      store_rows_kernel<__half, Src><<<num_tokens, kStoreThreads, 0, stream>>>(params);
      break;
    case DType::kBF16:
      store_rows_kernel<__nv_bfloat16, Src><<<num_tokens, kStoreThreads, 0, stream>>>(params);
      break;
    case DType::kFP8E4M3:
      store_rows_kernel<__nv_fp8_e4m3, Src><<<num_tokens, kStoreThreads, 0, stream>>>(params);
      break;
    default:
      throw_error("store: cache dtype " + std::string(dtype_name(cache_dtype)) +
                  " (expected f32, f16, bf16, fp8_e4m3)");
  }
  check_launch("store_rows_kernel");
}

}  // namespace

void launch_store(DType cache_dtype, DType input_dtype, const StoreRows& params, int64_t num_tokens,
                  void* stream_pointer) {
  auto stream = static_cast<cudaStream_t>(stream_pointer);
  if (num_tokens == 0) return;
  switch (input_dtype) {
    case DType::kF32:
      return launch_store_for_dst<float>(cache_dtype, params, num_tokens, stream);
    case DType::kF16:
      return launch_store_for_dst<__half>(cache_dtype, params, num_tokens, stream);
    case DType::kBF16:
      return launch_store_for_dst<__nv_bfloat16>(cache_dtype, params, num_tokens, stream);
    default:
      throw_error("store: input dtype " + std::string(dtype_name(input_dtype)) +
                  " (expected f32, f16, bf16)");
  }
}

void launch_check_slots(const void* slots, bool slots_i64, int64_t stride, int64_t num_tokens,
                        int64_t num_slots, int32_t* status, void* stream) {
  if (num_tokens == 0) return;
  const int blocks = static_cast<int>((num_tokens + kStoreThreads - 1) / kStoreThreads);
  check_slots_kernel<<<blocks, kStoreThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      slots, slots_i64, stride, num_tokens, num_slots, status);
  check_launch("check_slots_kernel");
}

}  // namespace pagedattn::cuda
