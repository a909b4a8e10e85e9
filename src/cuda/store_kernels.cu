// The device store's kernels (API: store.cpp, include/pagedattn/cuda_store.h).
//
// check_slots_kernel: every slot against [0, num_slots); the first bad one is recorded
// (atomicCAS). store_rows_kernel: one launch for all parts of a store (K and V, or ckv and kpe),
// one CTA per (token, part) (grid num_tokens x num_parts), threads over (row, element) of that
// token's part; it reads the status first and writes nothing if a slot was bad. The cache dtype is
// a template parameter (the parts share it); each part's input dtype is a runtime value, switched
// on once per CTA outside the element loop, so K and V of different input dtypes still take one
// launch. Conversion through float; an fp8 cache stores value / scale (a true division, as on the
// host), saturated. Both kernels are launched with programmatic dependent launch (cuda/launch.h):
// pdl_wait() is their first statement, before the status and slot checks that return early.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
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
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const int64_t slot = slot_of(slots, i64, stride, t);
  if (slot >= num_slots && atomicCAS(status, 0, 1) == 0) {
    status[1] = static_cast<int32_t>(t);
    status[2] = static_cast<int32_t>(slot >> 32);
    status[3] = static_cast<int32_t>(slot & 0xffffffff);
  }
}

// One token's rows of part p, from src (its dtype Src) to dst (that token's slot in the cache).
template <class Dst, class Src>
__device__ void store_token_rows(const StoreRows& p, Dst* dst, int64_t t) {
  const Src* src = static_cast<const Src*>(p.input) + t * p.in_stride_token;
  for (int64_t i = threadIdx.x; i < p.rows * p.width; i += kStoreThreads) {
    const int64_t row = i / p.width;
    const int64_t e = i - row * p.width;
    const float value = load_float(src + row * p.in_stride_row + e * p.in_stride_elem);
    dst[row * p.stride_row + e] = convert_store<Dst>(value, p.scale);
  }
}

template <class Dst>
__device__ void store_part(const StoreRows& p, int64_t page, int64_t offset, int64_t t) {
  Dst* dst = static_cast<Dst*>(p.cache) + page * p.stride_page + offset * p.stride_token;
  switch (p.input_dtype) {
    case DType::kF32:
      return store_token_rows<Dst, float>(p, dst, t);
    case DType::kF16:
      return store_token_rows<Dst, __half>(p, dst, t);
    default:  // bf16 (launch_store refuses any other)
      return store_token_rows<Dst, __nv_bfloat16>(p, dst, t);
  }
}

template <class Dst>
__global__ void __launch_bounds__(kStoreThreads) store_rows_kernel(const StoreBatch b) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  if (b.status != nullptr && b.status[0] != 0) return;
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_of(b.slots, b.slots_i64, b.slots_stride, t);
  if (slot < 0 || slot >= b.num_slots) return;
  const int64_t page = slot / b.alloc_page_size;
  const int64_t offset = slot - page * b.alloc_page_size;
  // blockIdx.y < num_parts picks the part; constant indices keep the parts in the parameter bank.
  static_assert(kMaxStoreParts == 2);
  if (blockIdx.y == 0) {
    store_part<Dst>(b.part[0], page, offset, t);
  } else {
    store_part<Dst>(b.part[1], page, offset, t);
  }
}

}  // namespace

void launch_store(DType cache_dtype, const StoreBatch& batch, int64_t num_tokens,
                  void* stream_pointer) {
  auto stream = static_cast<cudaStream_t>(stream_pointer);
  if (batch.num_parts < 1 || batch.num_parts > kMaxStoreParts)
    throw_error("store: " + std::to_string(batch.num_parts) + " parts (expected 1 to " +
                std::to_string(kMaxStoreParts) + ")");
  for (int32_t i = 0; i < batch.num_parts; ++i) {
    const DType input_dtype = batch.part[i].input_dtype;
    if (input_dtype != DType::kF32 && input_dtype != DType::kF16 && input_dtype != DType::kBF16)
      throw_error("store: input dtype " + std::string(dtype_name(input_dtype)) +
                  " (expected f32, f16, bf16)");
  }
  if (num_tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(batch.num_parts));
  switch (cache_dtype) {
    case DType::kF32:
      launch_kernel(store_rows_kernel<float>, grid, kStoreThreads, 0, stream, batch);
      break;
    case DType::kF16:
      launch_kernel(store_rows_kernel<__half>, grid, kStoreThreads, 0, stream, batch);
      break;
    case DType::kBF16:
      launch_kernel(store_rows_kernel<__nv_bfloat16>, grid, kStoreThreads, 0, stream, batch);
      break;
    case DType::kFP8E4M3:
      launch_kernel(store_rows_kernel<__nv_fp8_e4m3>, grid, kStoreThreads, 0, stream, batch);
      break;
    default:
      throw_error("store: cache dtype " + std::string(dtype_name(cache_dtype)) +
                  " (expected f32, f16, bf16, fp8_e4m3)");
  }
  check_launch("store_rows_kernel");
}

void launch_check_slots(const void* slots, bool slots_i64, int64_t stride, int64_t num_tokens,
                        int64_t num_slots, int32_t* status, void* stream) {
  if (num_tokens == 0) return;
  const int blocks = static_cast<int>((num_tokens + kStoreThreads - 1) / kStoreThreads);
  launch_kernel(check_slots_kernel, blocks, kStoreThreads, 0, static_cast<cudaStream_t>(stream),
                slots, slots_i64, stride, num_tokens, num_slots, status);
  check_launch("check_slots_kernel");
}

}  // namespace pagedattn::cuda
