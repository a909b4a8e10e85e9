// The CUDA model's small kernels (see kernels.h): embedding gather, RMSNorm fused with the residual
// add, the per-head transform (bias, q/k norm, RoPE, conversion), SiLU·mul, dtype conversion, bias
// add and the MoE row gather / weighted combine. Each is a plain loop over rows or elements in
// f32; none is tuned (one block per row, one warp per head, grid-stride elsewhere), because at the
// model's sizes the GEMMs and the attention dominate a step. The arithmetic follows the CPU ops
// (src/ops/elementwise.cpp, rope.cpp, moe.cpp) term for term so that an f32 model agrees with the
// CPU model to rounding. Every kernel is launched with programmatic dependent launch
// (cuda/launch.h): pdl_wait() is each one's first statement.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "model/cuda/kernels.h"

namespace pagedattn::model::cuda {
namespace {

using ::pagedattn::cuda::check_launch;
using ::pagedattn::cuda::launch_kernel;
using ::pagedattn::cuda::pdl_trigger;
using ::pagedattn::cuda::pdl_wait;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls f(T{}) with T the device type of `dtype` (f32 / f16 / bf16).
template <class F>
void dispatch(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kF16:
      return f(__half{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    default:
      throw_error(std::string(what) + ": dtype " + std::string(dtype_name(dtype)) +
                  " (expected f32, f16 or bf16)");
  }
}

// A grid of at most 65535 * 4 blocks of kBlock threads for grid-stride loops over n elements.
unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, 65535 * 4));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float block_sum(float v) {
  __shared__ float partial[kWarpsPerBlock];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarpsPerBlock; ++w) total += partial[w];
  __syncthreads();
  return total;
}

template <class T>
__global__ void embedding_kernel(const T* table, int64_t dim, const int32_t* ids,
                                 const ops::SampledToken* pending, float* out) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t row = blockIdx.x;
  int32_t id = ids[row];
  if (id < 0) id = pending[-id - 1].token;
  const T* src = table + int64_t{id} * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kBlock) out[row * dim + d] = to_f32(src[d]);
}

template <class Out>
__global__ void __launch_bounds__(kBlock) add_rms_norm_kernel(const AddNormArgs a) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t row = a.row_index != nullptr ? a.row_index[r] : r;
  float* residual = a.residual + row * a.dim;
  const float* add = a.add != nullptr ? a.add + row * a.dim : nullptr;
  const bool gather = a.row_index != nullptr;
  float sum = 0.0f;
  for (int64_t d = threadIdx.x; d < a.dim; d += kBlock) {
    float v = residual[d];
    if (add != nullptr) v += add[d];
    if (!gather) residual[d] = v;
    sum += v * v;
  }
  sum = block_sum(sum);
  const float inverse = 1.0f / sqrtf(sum / static_cast<float>(a.dim) + a.eps);
  Out* out = static_cast<Out*>(a.out) + r * a.dim;
  for (int64_t d = threadIdx.x; d < a.dim; d += kBlock) {
    float v = residual[d];
    if (gather && add != nullptr) v += add[d];
    const float y = a.weight[d] * (v * inverse);
    out[d] = from_f32<Out>(y);
    if (a.out_f32 != nullptr) a.out_f32[r * a.dim + d] = y;
  }
}

// transform_heads' launch: the groups and where each one's warps start.
struct HeadTransformBatch {
  HeadTransformArgs group[kMaxHeadGroups];
  int64_t first_warp[kMaxHeadGroups + 1];  // group g: warps [first_warp[g], first_warp[g + 1])
};

// One warp's (row, head) of one group, index = row * heads + head < rows * heads.
template <class Out>
__device__ __forceinline__ void transform_head(const HeadTransformArgs& a, int64_t index) {
  const int lane = threadIdx.x % 32;
  const int64_t row = index / a.heads;
  const int64_t head = index % a.heads;
  float* x = a.x + row * a.x_stride_row + head * a.x_stride_head;
  const float* bias = a.bias != nullptr ? a.bias + head * a.width : nullptr;
  Out* out = nullptr;
  if (a.out != nullptr && a.out_slots == nullptr) {
    out = static_cast<Out*>(a.out) + row * a.out_stride_row + head * a.out_stride_head;
  } else if (a.out != nullptr) {
    const int64_t slot = a.out_slots[row];
    if (slot >= 0 && slot < a.out_num_slots) {
      const int64_t page = slot / a.out_alloc_page, offset = slot - page * a.out_alloc_page;
      out = static_cast<Out*>(a.out) + page * a.out_stride_page + offset * a.out_stride_row +
            head * a.out_stride_head;
    }
  }
  float inverse = 1.0f;
  if (a.norm_weight != nullptr) {
    float sum = 0.0f;
    for (int d = lane; d < a.width; d += 32) {
      const float v = bias != nullptr ? x[d] + bias[d] : x[d];
      sum += v * v;
    }
    sum = warp_sum(sum);
    inverse = 1.0f / sqrtf(sum / static_cast<float>(a.width) + a.eps);
  }
  __syncwarp();
  // The element's value after bias and norm.
  const auto value = [&](int d) {
    float v = bias != nullptr ? x[d] + bias[d] : x[d];
    if (a.norm_weight != nullptr) v = a.norm_weight[d] * (v * inverse);
    return v;
  };
  const auto write = [&](int d, float v) {
    if (a.write_x) x[d] = v;
    if (out != nullptr) out[d] = from_f32<Out>(v);
  };
  int first_plain = 0;  // elements from here on are not rotated
  if (a.cos != nullptr) {
    const int half = a.rotary_half;
    const int64_t position = a.positions[row];
    const float* c = a.cos + position * half;
    const float* s = a.sin + position * half;
    for (int i = lane; i < half; i += 32) {
      const int ia = a.interleaved ? 2 * i : i;
      const int ib = a.interleaved ? 2 * i + 1 : i + half;
      const float va = value(ia), vb = value(ib);
      write(ia, va * c[i] - vb * s[i]);
      write(ib, vb * c[i] + va * s[i]);
    }
    first_plain = 2 * half;
  }
  for (int d = first_plain + lane; d < a.width; d += 32) write(d, value(d));
}

template <class Out>
__global__ void __launch_bounds__(kBlock) transform_heads_kernel(const HeadTransformBatch b) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t index = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  // The chosen group is read straight from the parameter bank (nvcc merges the unrolled branches
  // into one body with an indexed ld.param; no copy to local memory). The whole warp takes the
  // same branch (index is per warp): transform_head's shuffles see all 32 lanes. Past the last
  // group's warps (the last block's tail) no branch matches.
#pragma unroll
  for (int g = 0; g < kMaxHeadGroups; ++g) {
    if (index >= b.first_warp[g] && index < b.first_warp[g + 1]) {
      transform_head<Out>(b.group[g], index - b.first_warp[g]);
      return;
    }
  }
}

// One row per blockIdx.x, columns over blockIdx.y and the threads, four a thread: no 64-bit
// division per element (the grid-stride version spent 33 us on a 2048 x 3072 prefill step on
// the H200, 1.9 TB/s), and float4 loads where the row allows them.
template <class Out>
__global__ void __launch_bounds__(kBlock)
    silu_mul_kernel(const float* gate_up, int64_t width, Out* out, int64_t out_stride) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const float* g = gate_up + r * 2 * width;
  const float* u = g + width;
  Out* o = out + r * out_stride;
  const int64_t c0 = (int64_t{blockIdx.y} * kBlock + threadIdx.x) * 4;
  if (c0 >= width) return;
  const auto silu_times = [](float gate, float up) { return gate / (1.0f + expf(-gate)) * up; };
  if (width % 4 == 0 && (reinterpret_cast<uintptr_t>(gate_up) & 15u) == 0) {
    const float4 gv = *reinterpret_cast<const float4*>(g + c0);
    const float4 uv = *reinterpret_cast<const float4*>(u + c0);
    o[c0] = from_f32<Out>(silu_times(gv.x, uv.x));
    o[c0 + 1] = from_f32<Out>(silu_times(gv.y, uv.y));
    o[c0 + 2] = from_f32<Out>(silu_times(gv.z, uv.z));
    o[c0 + 3] = from_f32<Out>(silu_times(gv.w, uv.w));
    return;
  }
  for (int64_t c = c0; c < c0 + 4 && c < width; ++c) o[c] = from_f32<Out>(silu_times(g[c], u[c]));
}

template <class In, class Out>
__global__ void convert_rows_kernel(const In* src, int64_t src_stride, Out* dst, int64_t dst_stride,
                                    int64_t rows, int64_t cols) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t n = rows * cols;
  for (int64_t i = int64_t{blockIdx.x} * kBlock + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlock) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * dst_stride + c] = from_f32<Out>(to_f32(src[r * src_stride + c]));
  }
}

__global__ void add_bias_kernel(float* y, int64_t y_stride, const float* bias, int64_t rows,
                                int64_t cols) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t n = rows * cols;
  for (int64_t i = int64_t{blockIdx.x} * kBlock + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlock) {
    const int64_t r = i / cols, c = i - r * cols;
    y[r * y_stride + c] += bias[c];
  }
}

__global__ void gather_rows_kernel(const uint16_t* src, const int32_t* source_row, uint16_t* dst,
                                   int64_t row_elems) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const uint16_t* from = src + int64_t{source_row[row]} * row_elems;
  uint16_t* to = dst + row * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += kBlock) to[i] = from[i];
}

__global__ void moe_combine_kernel(const float* expert_out, const int32_t* position,
                                   const float* weight, const float* shared, int32_t top_k,
                                   int64_t hidden, float* out) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < hidden; d += kBlock) {
    float acc = 0.0f;
    for (int32_t j = 0; j < top_k; ++j) {
      const int64_t p = t * top_k + j;
      acc += weight[p] * expert_out[int64_t{position[p]} * hidden + d];
    }
    if (shared != nullptr) acc += shared[t * hidden + d];
    out[t * hidden + d] = acc;
  }
}

}  // namespace

void embedding(const void* table, DType table_dtype, int64_t dim, const int32_t* ids, int64_t rows,
               const ops::SampledToken* pending, float* out, void* stream) {
  if (rows == 0) return;
  dispatch(table_dtype, "embedding table", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(embedding_kernel<T>, static_cast<unsigned>(rows), kBlock, 0,
                  static_cast<cudaStream_t>(stream), static_cast<const T*>(table), dim, ids,
                  pending, out);
  });
  check_launch("embedding_kernel");
}

void add_rms_norm(const AddNormArgs& args, void* stream) {
  if (args.rows == 0) return;
  dispatch(args.out_dtype, "add_rms_norm out", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(add_rms_norm_kernel<T>, static_cast<unsigned>(args.rows), kBlock, 0,
                  static_cast<cudaStream_t>(stream), args);
  });
  check_launch("add_rms_norm_kernel");
}

void transform_heads(const HeadTransformArgs& args, void* stream) {
  transform_heads(std::span<const HeadTransformArgs>(&args, 1), stream);
}

void transform_heads(std::span<const HeadTransformArgs> groups, void* stream) {
  if (groups.size() > static_cast<size_t>(kMaxHeadGroups))
    throw_error("transform_heads: " + std::to_string(groups.size()) + " groups (expected at most " +
                std::to_string(kMaxHeadGroups) + ")");
  HeadTransformBatch batch{};
  int64_t warps = 0;
  bool any_out = false;
  DType out_dtype = DType::kF32;
  for (size_t g = 0; g < static_cast<size_t>(kMaxHeadGroups); ++g) {
    batch.first_warp[g] = warps;
    if (g >= groups.size()) continue;
    const HeadTransformArgs& group = groups[g];
    if (!group.write_x && group.out == nullptr)
      throw_error("transform_heads: group " + std::to_string(g) +
                  " writes neither x nor out (write_x false needs out)");
    if (group.out_slots != nullptr && (group.out == nullptr || group.out_alloc_page < 1))
      throw_error("transform_heads: group " + std::to_string(g) +
                  " has out_slots without a pool (out) or with out_alloc_page " +
                  std::to_string(group.out_alloc_page) + " (expected >= 1)");
    batch.group[g] = group;
    warps += group.rows * group.heads;
    if (group.out == nullptr) continue;
    if (any_out && group.out_dtype != out_dtype)
      throw_error("transform_heads: groups write out dtypes " + std::string(dtype_name(out_dtype)) +
                  " and " + std::string(dtype_name(group.out_dtype)) + " (expected one)");
    any_out = true;
    out_dtype = group.out_dtype;
  }
  batch.first_warp[kMaxHeadGroups] = warps;
  if (warps == 0) return;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch(out_dtype, "transform_heads out", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(transform_heads_kernel<T>, blocks, kBlock, 0, static_cast<cudaStream_t>(stream),
                  batch);
  });
  check_launch("transform_heads_kernel");
}

void silu_mul(const float* gate_up, int64_t rows, int64_t width, void* out, DType out_dtype,
              int64_t out_stride, void* stream) {
  if (rows * width == 0) return;
  if (rows > INT32_MAX || (width + 4 * kBlock - 1) / (4 * kBlock) > 65535)
    throw_error("silu_mul: " + std::to_string(rows) + " rows of " + std::to_string(width) +
                " (expected at most 2^31 - 1 rows and 2^26 columns)");
  dispatch(out_dtype, "silu_mul out", [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(rows),
                    static_cast<unsigned>((width + 4 * kBlock - 1) / (4 * kBlock)));
    launch_kernel(silu_mul_kernel<T>, grid, kBlock, 0, static_cast<cudaStream_t>(stream), gate_up,
                  width, static_cast<T*>(out), out_stride);
  });
  check_launch("silu_mul_kernel");
}

void convert_rows(const void* src, DType src_dtype, int64_t src_stride, void* dst, DType dst_dtype,
                  int64_t dst_stride, int64_t rows, int64_t cols, void* stream) {
  if (rows * cols == 0) return;
  dispatch(src_dtype, "convert_rows source", [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch(dst_dtype, "convert_rows destination", [&](auto out_tag) {
      using Out = decltype(out_tag);
      launch_kernel(convert_rows_kernel<In, Out>, grid_for(rows * cols), kBlock, 0,
                    static_cast<cudaStream_t>(stream), static_cast<const In*>(src), src_stride,
                    static_cast<Out*>(dst), dst_stride, rows, cols);
    });
  });
  check_launch("convert_rows_kernel");
}

void add_bias(float* y, int64_t y_stride, const float* bias, int64_t rows, int64_t cols,
              void* stream) {
  if (rows * cols == 0) return;
  launch_kernel(add_bias_kernel, grid_for(rows * cols), kBlock, 0,
                static_cast<cudaStream_t>(stream), y, y_stride, bias, rows, cols);
  check_launch("add_bias_kernel");
}

void gather_rows(const void* src, const int32_t* source_row, void* dst, int64_t rows,
                 int64_t row_bytes, void* stream) {
  if (rows == 0) return;
  if (row_bytes % 2 != 0)
    throw_error("gather_rows: row of " + std::to_string(row_bytes) +
                " bytes (expected a multiple of 2)");
  launch_kernel(gather_rows_kernel, static_cast<unsigned>(rows), kBlock, 0,
                static_cast<cudaStream_t>(stream), static_cast<const uint16_t*>(src), source_row,
                static_cast<uint16_t*>(dst), row_bytes / 2);
  check_launch("gather_rows_kernel");
}

void moe_combine(const float* expert_out, const int32_t* position, const float* weight,
                 const float* shared, int64_t tokens, int32_t top_k, int64_t hidden, float* out,
                 void* stream) {
  if (tokens == 0) return;
  launch_kernel(moe_combine_kernel, static_cast<unsigned>(tokens), kBlock, 0,
                static_cast<cudaStream_t>(stream), expert_out, position, weight, shared, top_k,
                hidden, out);
  check_launch("moe_combine_kernel");
}

}  // namespace pagedattn::model::cuda
