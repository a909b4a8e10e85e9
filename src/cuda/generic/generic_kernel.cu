// The generic attention kernel (see generic.h): one thread block per (query row, query head).
//
// The block finds its row's request by binary search in qo_indptr, derives the row's position
// (queries are aligned to the end of the request's KV: position = kv_len - q_len + i) and the
// visible keys [start, end) (causal: end = position + 1; window: start = position - window_left),
// then walks them in tiles of kTile keys: each thread scores one key (q · k over dim1 + dim2 in
// f32, times sm_scale, soft-capped), the block takes the tile's max and the online-softmax
// rescale, and the threads then split the value dimension to accumulate p · v. The accumulator
// lives in shared memory ([dim_v] f32), so any width up to kMaxDim fits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>

#include "cuda/common/guard.cuh"
#include "cuda/cuda_check.h"
#include "cuda/generic/generic_params.h"

namespace pagedattn::cuda::generic {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = kThreads;  // keys per tile: one per thread
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const __nv_fp8_e4m3* p) { return static_cast<float>(*p); }

// q and out are one of f32 / f16 / bf16, chosen at run time (read once, written once per block).
__device__ float load_dynamic(const void* base, int64_t index, int dtype) {
  switch (dtype) {
    case 0:
      return static_cast<const float*>(base)[index];
    case 1:
      return __half2float(static_cast<const __half*>(base)[index]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
}

__device__ void store_dynamic(void* base, int64_t index, int dtype, float value) {
  switch (dtype) {
    case 0:
      static_cast<float*>(base)[index] = value;
      break;
    case 1:
      static_cast<__half*>(base)[index] = __float2half_rn(value);
      break;
    default:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  }
}

// Max or sum over the block; every thread gets the result. `scratch`: kWarps floats.
template <bool kMax>
__device__ float block_reduce(float value, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = kMax ? fmaxf(value, other) : value + other;
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = value;
  __syncthreads();
  float result = scratch[0];
  for (int w = 1; w < kWarps; ++w) result = kMax ? fmaxf(result, scratch[w]) : result + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

// Floats of shared memory before the int64 value offsets (rounded up to keep them 8-byte aligned).
__host__ __device__ inline int float_slots(const GenericParams& p) {
  const int floats = p.dim1 + p.dim2 + p.dim_v + kTile + kWarps;
  return floats + (floats & 1);
}

template <class Kv>
__global__ void __launch_bounds__(kThreads)
    generic_attention_kernel(const GenericParams p, int q_dtype) {
  extern __shared__ float shared[];
  float* q = shared;                 // [dim1 + dim2], pre-scaled by sm_scale
  float* acc = q + p.dim1 + p.dim2;  // [dim_v]
  float* probs = acc + p.dim_v;      // [kTile]
  float* scratch = probs + kTile;    // [kWarps]
  auto* value_offset = reinterpret_cast<int64_t*>(shared + float_slots(p));  // [kTile]

  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  // The request of this row: the last b with qo_indptr[b] <= row.
  if (p.batch <= 0 || row >= p.qo_indptr[p.batch]) return;  // not a row of this step
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.qo_indptr[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int b = lo;
  const int64_t q_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int64_t i = row - p.qo_indptr[b];
  const int64_t first_page = p.kv_indptr[b];
  const int64_t pages = p.kv_indptr[b + 1] - first_page;
  // Metadata on trust (common/guard.h): a row of a request whose query range or KV metadata is
  // bad, or whose q_len > kv_len, sees no key (0 / -inf); a page id outside the pool is not read
  // and the row gets 0 / -inf.
  int64_t kv_len = 0;
  if (query_rows_ok(p.guard, b, p.qo_indptr[b], p.qo_indptr[b + 1]) &&
      kv_metadata_ok(p.guard, p.kv_indices, b, static_cast<int>(first_page), p.kv_indptr[b + 1],
                     p.kv_last_page_len[b], p.page_size)) {
    kv_len = pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0;
    if (!q_len_within_kv(p.guard, b, static_cast<int>(q_len), static_cast<int>(kv_len))) {
      kv_len = 0;
    }
  }
  const int64_t position = kv_len - q_len + i;
  const int64_t end = p.causal ? min(kv_len, position + 1) : kv_len;
  const int64_t start = p.window_left >= 0 ? max(int64_t{0}, position - p.window_left) : 0;

  for (int d = threadIdx.x; d < p.dim1 + p.dim2; d += kThreads) {
    const float x =
        d < p.dim1
            ? load_dynamic(p.q1.data, row * p.q1.stride_row + head * p.q1.stride_head + d, q_dtype)
            : load_dynamic(p.q2.data, row * p.q2.stride_row + head * p.q2.stride_head + d - p.dim1,
                           q_dtype);
    q[d] = x * p.sm_scale * p.k_scale;
  }
  for (int d = threadIdx.x; d < p.dim_v; d += kThreads) acc[d] = 0.0f;
  __syncthreads();

  const Kv* k1 = static_cast<const Kv*>(p.k1.data);
  const Kv* k2 = static_cast<const Kv*>(p.k2.data);
  const Kv* v = static_cast<const Kv*>(p.v.data);
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_bad_page = false;
  for (int64_t tile = start; tile < end; tile += kTile) {
    const int64_t key = tile + threadIdx.x;
    float score = -INFINITY;
    value_offset[threadIdx.x] = 0;  // a key not read (past the end, a bad page) weighs 0
    const int32_t page = key < end ? p.kv_indices[first_page + key / p.page_size] : 0;
    if (key < end && !page_in_pool(p.guard, page)) {
      saw_bad_page = true;
      report_page(p.guard, b, first_page + key / p.page_size, page);
    } else if (key < end) {
      const int64_t alloc_page = page / p.pages_per_alloc;
      const int64_t offset = (page % p.pages_per_alloc) * p.page_size + key % p.page_size;
      const Kv* key1 = k1 + alloc_page * p.k1.stride_page + offset * p.k1.stride_token +
                       kv_head * p.k1.stride_head;
      float dot = 0.0f;
      for (int d = 0; d < p.dim1; ++d) dot += q[d] * load(key1 + d);
      if (p.dim2 > 0) {
        const Kv* key2 = k2 + alloc_page * p.k2.stride_page + offset * p.k2.stride_token +
                         kv_head * p.k2.stride_head;
        for (int d = 0; d < p.dim2; ++d) dot += q[p.dim1 + d] * load(key2 + d);
      }
      score = p.soft_cap > 0.0f ? p.soft_cap * tanhf(dot / p.soft_cap) : dot;
      value_offset[threadIdx.x] =
          alloc_page * p.v.stride_page + offset * p.v.stride_token + kv_head * p.v.stride_head;
    }
    const float tile_max = block_reduce<true>(score, scratch);
    const float new_max = fmaxf(running_max, tile_max);
    const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
    const float prob = score != -INFINITY ? expf(score - new_max) : 0.0f;
    probs[threadIdx.x] = prob;
    running_sum = running_sum * rescale + block_reduce<false>(prob, scratch);
    running_max = new_max;
    // block_reduce ended with a barrier: probs and value_offset are visible.
    const int count = static_cast<int>(end - tile < kTile ? end - tile : kTile);
    for (int d = threadIdx.x; d < p.dim_v; d += kThreads) {
      float a = acc[d] * rescale;
      for (int t = 0; t < count; ++t) a += probs[t] * load(v + value_offset[t] + d);
      acc[d] = a;
    }
    __syncthreads();  // probs / value_offset are rewritten by the next tile
  }

  if (__syncthreads_or(saw_bad_page)) running_sum = 0.0f;  // the row: 0 / -inf
  const float inverse = running_sum > 0.0f ? p.v_scale / running_sum : 0.0f;
  for (int d = threadIdx.x; d < p.dim_v; d += kThreads) {
    store_dynamic(p.out, row * p.out_stride_row + head * p.out_stride_head + d, q_dtype,
                  running_sum > 0.0f ? acc[d] * inverse : 0.0f);
  }
  if (p.lse != nullptr && threadIdx.x == 0) {
    p.lse[row * p.lse_stride_row + head * p.lse_stride_head] =
        running_sum > 0.0f ? running_max + logf(running_sum) : -INFINITY;
  }
}

int dtype_code(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    default:
      throw_error("cuda_generic: q dtype " + std::string(dtype_name(dtype)) +
                  " (expected f32, f16 or bf16)");
  }
}

template <class Kv>
void launch(const GenericParams& p, int q_code, cudaStream_t stream) {
  const size_t shared = sizeof(float) * float_slots(p) + sizeof(int64_t) * kTile;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_qo_heads));
  generic_attention_kernel<Kv><<<grid, kThreads, shared, stream>>>(p, q_code);
  check_launch("generic_attention_kernel");
}

}  // namespace

void launch_generic_attention(const GenericParams& params, DType q_dtype, DType kv_dtype,
                              void* stream_pointer) {
  if (params.rows == 0 || params.num_qo_heads == 0) return;
  const int q_code = dtype_code(q_dtype);
  auto stream = static_cast<cudaStream_t>(stream_pointer);
  switch (kv_dtype) {
    case DType::kF32:
      return launch<float>(params, q_code, stream);
    case DType::kF16:
      return launch<__half>(params, q_code, stream);
    case DType::kBF16:
      return launch<__nv_bfloat16>(params, q_code, stream);
    case DType::kFP8E4M3:
      return launch<__nv_fp8_e4m3>(params, q_code, stream);
    default:
      throw_error("cuda_generic: kv dtype " + std::string(dtype_name(kv_dtype)) +
                  " (expected f32, f16, bf16 or fp8_e4m3)");
  }
}

}  // namespace pagedattn::cuda::generic
