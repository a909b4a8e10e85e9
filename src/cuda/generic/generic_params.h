// The launch parameters of the generic attention kernel (generic_kernel.cu) and its launcher.
// Host-side declarations only.
#pragma once

#include <cstdint>

#include "cuda/common/guard.h"
#include "pagedattn/dtype.h"

namespace pagedattn::cuda::generic {

// Keys are [k1 | k2] (widths dim1 + dim2; dim2 = 0 without k2), queries [q1 | q2] likewise, values
// v (width dim_v). A cache element (allocation page a, token o, KV head h, element d) is at
// a * stride_page + o * stride_token + h * stride_head + d (elements of the cache dtype).
struct CacheSlice {
  const void* data = nullptr;
  int64_t stride_page = 0, stride_token = 0, stride_head = 0;
};

struct QuerySlice {
  const void* data = nullptr;
  int64_t stride_row = 0, stride_head = 0;
};

struct GenericParams {
  QuerySlice q1, q2;
  CacheSlice k1, k2, v;
  int32_t dim1 = 0, dim2 = 0, dim_v = 0;
  void* out = nullptr;
  int64_t out_stride_row = 0, out_stride_head = 0;
  float* lse = nullptr;  // optional
  int64_t lse_stride_row = 0, lse_stride_head = 0;
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_last_page_len = nullptr;
  int32_t batch = 0;
  int64_t rows = 0;  // query rows of the grid (the q tensor's first extent)
  int32_t num_qo_heads = 0;
  int32_t group = 1;  // query heads per KV head
  int32_t page_size = 1;
  int32_t pages_per_alloc = 1;
  float sm_scale = 1.0f;
  float k_scale = 1.0f, v_scale = 1.0f;  // fp8 dequantisation
  float soft_cap = 0.0f;
  int32_t window_left = -1;
  bool causal = true;
  MetadataGuard guard;  // the metadata taken on trust is checked against it (common/guard.h)
};

// Maximum widths: dim1 + dim2 and dim_v (shared memory holds the query and the accumulator).
inline constexpr int32_t kMaxDim = 2048;

// Enqueues the kernel on `stream` (a cudaStream_t). q and out share `q_dtype` (f32/f16/bf16);
// the cache is `kv_dtype` (f32/f16/bf16/fp8_e4m3).
void launch_generic_attention(const GenericParams& params, DType q_dtype, DType kv_dtype,
                              void* stream);

}  // namespace pagedattn::cuda::generic
