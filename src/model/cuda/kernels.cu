// The CUDA model's small kernels (see kernels.h): embedding gather, RMSNorm fused with the residual
// add, the per-head transform (bias, q/k norm, RoPE, conversion), SiLU·mul, dtype conversion, bias
// add and the MoE row gather / weighted combine. Each is a plain loop over rows or elements in
// f32 (one block per row, one warp per head, grid-stride elsewhere) with vector loads where the
// rows allow: the head transform and SiLU · mul read a prefill's GEMM outputs (a profile of a
// 2048-token Qwen3-0.6B prefill put them at a quarter of the step, bench/RESULTS.md). The
// arithmetic follows the CPU ops (src/ops/elementwise.cpp, rope.cpp, moe.cpp) term for term so that
// an f32 model agrees with the CPU model to rounding. Every kernel is launched with programmatic
// dependent launch (cuda/launch.h): pdl_wait() is each one's first statement.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "model/cuda/activation.cuh"
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

// kPer > 0: a row of at most kPer * kBlock elements held in registers, every load of a thread
// issued before the first use (one round trip, where the loop waited on each element and read the
// row twice: 11-12 us per layer for a 2048 x 1024 prefill on the H100, 2.5x its bytes). kPer 0:
// any dim, the loop. Both sum each thread's elements d = tid, tid + kBlock, ... in that order
// (the GEMV's fused norm, gemv.cu, reproduces these bits), then block_sum.
template <class Out, int kPer>
__global__ void __launch_bounds__(kBlock) add_rms_norm_kernel(const AddNormArgs a) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int64_t row = a.row_index != nullptr ? a.row_index[r] : r;
  float* residual = a.residual + row * a.dim;
  const float* add = a.add != nullptr ? a.add + row * a.dim : nullptr;
  const bool gather = a.row_index != nullptr;
  Out* out = static_cast<Out*>(a.out) + r * a.dim;
  float* out_f32 = a.out_f32 != nullptr ? a.out_f32 + r * a.dim : nullptr;
  const int tid = static_cast<int>(threadIdx.x);
  if constexpr (kPer > 0) {
    float v[kPer], w[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t d = tid + int64_t{i} * kBlock;
      v[i] = d < a.dim ? residual[d] : 0.0f;
    }
    if (add != nullptr) {
      float b[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t d = tid + int64_t{i} * kBlock;
        b[i] = d < a.dim ? add[d] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] += b[i];
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t d = tid + int64_t{i} * kBlock;
      w[i] = d < a.dim ? a.weight[d] : 0.0f;
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) sum += v[i] * v[i];  // zeros past dim add nothing
    if (add != nullptr && !gather) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t d = tid + int64_t{i} * kBlock;
        if (d < a.dim) residual[d] = v[i];
      }
    }
    sum = block_sum(sum);
    const float inverse = 1.0f / sqrtf(sum / static_cast<float>(a.dim) + a.eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t d = tid + int64_t{i} * kBlock;
      if (d >= a.dim) continue;
      const float y = w[i] * (v[i] * inverse);
      out[d] = from_f32<Out>(y);
      if (out_f32 != nullptr) out_f32[d] = y;
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t d = tid; d < a.dim; d += kBlock) {
    float v = residual[d];
    if (add != nullptr) {
      v += add[d];
      if (!gather) residual[d] = v;
    }
    sum += v * v;
  }
  sum = block_sum(sum);
  const float inverse = 1.0f / sqrtf(sum / static_cast<float>(a.dim) + a.eps);
  for (int64_t d = tid; d < a.dim; d += kBlock) {
    float v = residual[d];
    if (gather && add != nullptr) v += add[d];
    const float y = a.weight[d] * (v * inverse);
    out[d] = from_f32<Out>(y);
    if (out_f32 != nullptr) out_f32[d] = y;
  }
}

// transform_heads' launch: the groups and where each one's warps start.
struct HeadTransformBatch {
  HeadTransformArgs group[kMaxHeadGroups];
  int64_t first_warp[kMaxHeadGroups + 1];  // group g: warps [first_warp[g], first_warp[g + 1])
};

// Four consecutive elements of T as f32 (p aligned to 4 elements), and back.
__device__ __forceinline__ void load4(const float* p, float v[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
template <class T>
__device__ __forceinline__ void load4(const T* p, float v[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  T e[4];
  memcpy(e, &q, sizeof(q));
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = to_f32(e[i]);
}
template <class T>
__device__ __forceinline__ void store4(T* p, const float v[4]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {  // f16 / bf16: 8 bytes
    T e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = from_f32<T>(v[i]);
    uint2 q;
    memcpy(&q, e, sizeof(q));
    *reinterpret_cast<uint2*>(p) = q;
  }
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) == 0;
}

// One warp's (row, head) of one group, index = row * heads + head < rows * heads.
template <class In, class Out>
__device__ __forceinline__ void transform_head(const HeadTransformArgs& a, int64_t index) {
  const int lane = threadIdx.x % 32;
  const int64_t row = index / a.heads;
  const int64_t head = index % a.heads;
  In* x = static_cast<In*>(a.x) + row * a.x_stride_row + head * a.x_stride_head;
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
  const int64_t position = a.cos != nullptr ? a.positions[row] : 0;
  // The vector path (kernels.h): whole-head RoPE or none, every pointer aligned to 4 elements.
  // Warp-uniform: every operand is per (row, head).
  const bool vector = a.width == 128 && (a.cos == nullptr || a.rotary_half == 64) &&
                      aligned(x, 4 * sizeof(In)) && (bias == nullptr || aligned(bias, 16)) &&
                      (a.norm_weight == nullptr || aligned(a.norm_weight, 16)) &&
                      (a.cos == nullptr || (aligned(a.cos + position * 64, 16) &&
                                            aligned(a.sin + position * 64, 16))) &&
                      (out == nullptr || aligned(out, 4 * sizeof(Out)));
  if (vector) {
    const int d0 = 4 * lane;
    float v[4];
    load4(x + d0, v);
    if (bias != nullptr) {
      float b[4];
      load4(bias + d0, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] += b[e];
    }
    if (a.norm_weight != nullptr) {
      const float sum = warp_sum(v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3]);
      const float inverse = 1.0f / sqrtf(sum / 128.0f + a.eps);
      float w[4];
      load4(a.norm_weight + d0, w);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = w[e] * (v[e] * inverse);
    }
    if (a.cos != nullptr) {
      const float* c = a.cos + position * 64;
      const float* s = a.sin + position * 64;
      if (a.interleaved) {
        // Pairs (2i, 2i + 1) inside the lane: i = 2 lane and 2 lane + 1.
        const float2 cs = *reinterpret_cast<const float2*>(c + 2 * lane);
        const float2 sn = *reinterpret_cast<const float2*>(s + 2 * lane);
        const float c0 = cs.x, c1 = cs.y, s0 = sn.x, s1 = sn.y;
        const float a0 = v[0], b0 = v[1], a1 = v[2], b1 = v[3];
        v[0] = a0 * c0 - b0 * s0;
        v[1] = b0 * c0 + a0 * s0;
        v[2] = a1 * c1 - b1 * s1;
        v[3] = b1 * c1 + a1 * s1;
      } else {
        // NeoX pairs (i, i + 64): lane l < 16 holds i = 4l .. 4l + 3, lane l + 16 their partners.
        float partner[4], cs[4], sn[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, v[e], 16);
        load4(c + (d0 & 63), cs);
        load4(s + (d0 & 63), sn);
        if (lane < 16) {
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = v[e] * cs[e] - partner[e] * sn[e];
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = v[e] * cs[e] + partner[e] * sn[e];
        }
      }
    }
    if constexpr (std::is_same_v<In, float>) {
      if (a.write_x) store4(x + d0, v);
    }
    if (out != nullptr) store4(out + d0, v);
    return;
  }
  float inverse = 1.0f;
  if (a.norm_weight != nullptr) {
    float sum = 0.0f;
    for (int d = lane; d < a.width; d += 32) {
      const float v = bias != nullptr ? to_f32(x[d]) + bias[d] : to_f32(x[d]);
      sum += v * v;
    }
    sum = warp_sum(sum);
    inverse = 1.0f / sqrtf(sum / static_cast<float>(a.width) + a.eps);
  }
  __syncwarp();
  // The element's value after bias and norm.
  const auto value = [&](int d) {
    float v = bias != nullptr ? to_f32(x[d]) + bias[d] : to_f32(x[d]);
    if (a.norm_weight != nullptr) v = a.norm_weight[d] * (v * inverse);
    return v;
  };
  const auto write = [&](int d, float v) {
    if constexpr (std::is_same_v<In, float>) {
      if (a.write_x) x[d] = v;
    }
    if (out != nullptr) out[d] = from_f32<Out>(v);
  };
  int first_plain = 0;  // elements from here on are not rotated
  if (a.cos != nullptr) {
    const int half = a.rotary_half;
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

template <class In, class Out>
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
      transform_head<In, Out>(b.group[g], index - b.first_warp[g]);
      return;
    }
  }
}

// The vector kernel (transform_heads picks it where every group qualifies: vector_group on the
// host): a block per (row, blockIdx.y), the row's heads numbered across the groups (group g takes
// [first_head[g], first_head[g + 1])), kPerWarp consecutive heads a warp, all of one group (each
// group's head count is a multiple of kPerWarp). A warp finds its group, row and heads with no
// division and checks no alignment (the host did), issues its heads' x loads, the position, the
// pool slot, the norm weight and the row's cos / sin (once for its heads) before the first use,
// then runs the vector path's arithmetic head by head. The kernel it replaces for these shapes (a
// warp per (row, head), its index divided into both, every alignment checked per head) issued 266
// instructions per head: ncu put a Qwen3-0.6B prefill's (2048 rows x 32 heads) at 57% of the
// issue slots busy and 0.68 TB/s, 30 us for 34 MB (H100).
struct VectorHeadBatch {
  HeadTransformArgs group[kMaxHeadGroups];
  int32_t first_head[kMaxHeadGroups + 1];
};

template <class In, class Out, int kPerWarp>
__device__ __forceinline__ void vector_heads(const HeadTransformArgs& a, int row, int head0) {
  const int lane = static_cast<int>(threadIdx.x % 32), d0 = 4 * lane;
  In* x = static_cast<In*>(a.x) + row * a.x_stride_row + head0 * a.x_stride_head + d0;
  float v[kPerWarp][4];
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) load4(x + i * a.x_stride_head, v[i]);
  const int position = a.cos != nullptr ? a.positions[row] : 0;
  Out* out = nullptr;
  if (a.out != nullptr && a.out_slots == nullptr) {
    out = static_cast<Out*>(a.out) + row * a.out_stride_row;
  } else if (a.out != nullptr) {
    const int64_t slot = a.out_slots[row];
    if (slot >= 0 && slot < a.out_num_slots) {
      // 32-bit division where the pool's slots allow it (the host checked out_num_slots).
      const auto page = static_cast<uint32_t>(slot) / static_cast<uint32_t>(a.out_alloc_page);
      const int64_t offset = slot - int64_t{page} * a.out_alloc_page;
      out = static_cast<Out*>(a.out) + page * a.out_stride_page + offset * a.out_stride_row;
    }
  }
  if (out != nullptr) out += head0 * a.out_stride_head + d0;
  float w[4];
  if (a.norm_weight != nullptr) load4(a.norm_weight + d0, w);
  float cs[4], sn[4];
  if (a.cos != nullptr) {
    // NeoX: lane l holds elements 4l .. 4l + 3, paired with (4l .. 4l + 3) +- 64, angles
    // (4l .. 4l + 3) mod 64. Interleaved: pairs (4l, 4l + 1) and (4l + 2, 4l + 3), angles 2l, 2l + 1.
    const int angle = a.interleaved ? 2 * lane : d0 & 63;
    const float* c = a.cos + position * 64 + angle;
    const float* s = a.sin + position * 64 + angle;
    if (a.interleaved) {
      const float2 c2 = *reinterpret_cast<const float2*>(c);
      const float2 s2 = *reinterpret_cast<const float2*>(s);
      cs[0] = c2.x, cs[1] = c2.y, sn[0] = s2.x, sn[1] = s2.y;
    } else {
      load4(c, cs);
      load4(s, sn);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    if (a.bias != nullptr) {
      float b[4];
      load4(a.bias + (head0 + i) * 128 + d0, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[i][e] += b[e];
    }
  }
  if (a.norm_weight != nullptr) {
    float sum[kPerWarp];
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i)
      sum[i] = v[i][0] * v[i][0] + v[i][1] * v[i][1] + v[i][2] * v[i][2] + v[i][3] * v[i][3];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
      for (int i = 0; i < kPerWarp; ++i) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], offset);
    }
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const float inverse = 1.0f / sqrtf(sum[i] / 128.0f + a.eps);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[i][e] = w[e] * (v[i][e] * inverse);
    }
  }
  if (a.cos != nullptr && a.interleaved) {
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const float a0 = v[i][0], b0 = v[i][1], a1 = v[i][2], b1 = v[i][3];
      v[i][0] = a0 * cs[0] - b0 * sn[0];
      v[i][1] = b0 * cs[0] + a0 * sn[0];
      v[i][2] = a1 * cs[1] - b1 * sn[1];
      v[i][3] = b1 * cs[1] + a1 * sn[1];
    }
  } else if (a.cos != nullptr) {
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      float partner[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, v[i][e], 16);
      if (lane < 16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[i][e] = v[i][e] * cs[e] - partner[e] * sn[e];
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[i][e] = v[i][e] * cs[e] + partner[e] * sn[e];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    if constexpr (std::is_same_v<In, float>) {
      if (a.write_x) store4(x + i * a.x_stride_head, v[i]);
    }
    if (out != nullptr) store4(out + i * a.out_stride_head, v[i]);
  }
}

template <class In, class Out, int kPerWarp>
__global__ void __launch_bounds__(kBlock)
    transform_heads_vector_kernel(const VectorHeadBatch b) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int row = static_cast<int>(blockIdx.x);
  const int first = (static_cast<int>(blockIdx.y) * kWarpsPerBlock +
                     static_cast<int>(threadIdx.x) / 32) * kPerWarp;
  // As in transform_heads_kernel: the unrolled branches become one body reading the group's
  // fields by an indexed ld.param; warps past the last head match no branch.
#pragma unroll
  for (int g = 0; g < kMaxHeadGroups; ++g) {
    if (first >= b.first_head[g] && first < b.first_head[g + 1]) {
      vector_heads<In, Out, kPerWarp>(b.group[g], row, first - b.first_head[g]);
      return;
    }
  }
}

// Whether a group takes the vector kernel: heads of 128 with whole-head RoPE or none, and x, out,
// the bias, the norm weight and the cos / sin rows at 16-byte multiples wherever a lane reads or
// writes (base and strides multiples of 4 elements; a head's bias and a position's cos / sin row
// start 512 / 256 bytes apart), pool slots within 32 bits.
bool vector_group(const HeadTransformArgs& a) {
  const auto aligned_to = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  const size_t x_bytes = dtype_size(a.x_dtype), out_bytes = dtype_size(a.out_dtype);
  if (a.width != 128 || (a.cos != nullptr && a.rotary_half != 64)) return false;
  if (!aligned_to(a.x, 4 * x_bytes) || a.x_stride_row % 4 != 0 || a.x_stride_head % 4 != 0)
    return false;
  if ((a.bias != nullptr && !aligned_to(a.bias, 16)) ||
      (a.norm_weight != nullptr && !aligned_to(a.norm_weight, 16)) ||
      (a.cos != nullptr && (!aligned_to(a.cos, 16) || !aligned_to(a.sin, 16))))
    return false;
  if (a.out == nullptr) return true;
  if (!aligned_to(a.out, 4 * out_bytes) || a.out_stride_row % 4 != 0 || a.out_stride_head % 4 != 0)
    return false;
  return a.out_slots == nullptr ||
         (a.out_stride_page % 4 == 0 && a.out_num_slots <= INT32_MAX && a.out_alloc_page <= INT32_MAX);
}

// One row per blockIdx.x, columns over blockIdx.y and the threads, kGroups groups of four a
// thread (columns first + 4 kBlock k, k < kGroups), all of a thread's loads issued before the first
// product: no 64-bit division per element (the grid-stride version spent 33 us on a 2048 x 3072
// prefill step on the H200, 1.9 TB/s), vector loads and stores where the rows allow them. Four
// groups where the rows are many (a prefill: blocks that live long enough to amortise their
// launch; 2048 x 3072 bf16 on the H100, 24.1 -> 18.4 us), one where they are few (a decode step
// of B rows, whose grid would otherwise shrink to B blocks).
constexpr int64_t kSiluManyRows = 256;

template <class In, class Out, int kGroups>
__global__ void __launch_bounds__(kBlock)
    silu_mul_kernel(const In* gate_up, int64_t width, Out* out, int64_t out_stride,
                    int64_t pair_block) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const In* row = gate_up + r * 2 * width;
  // Column c's gate and up: halves (pair_block 0), or blocks of pair_block gates then as many ups.
  const int64_t up_offset = pair_block == 0 ? width : pair_block;
  const auto gate_of = [&](int64_t c) {
    return pair_block == 0 ? c : c / pair_block * 2 * pair_block + c % pair_block;
  };
  Out* o = out + r * out_stride;
  const int64_t first = (int64_t{blockIdx.y} * kBlock * kGroups + threadIdx.x) * 4;
  if (first >= width) return;
  if (width % 4 == 0 && pair_block % 4 == 0 && aligned(gate_up, 4 * sizeof(In))) {
    const bool vector_out = aligned(out, 4 * sizeof(Out)) && out_stride % 4 == 0;
    float gv[kGroups][4], uv[kGroups][4];
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const int64_t c = first + int64_t{k} * 4 * kBlock;
      if (c < width) {  // four columns of one block (pair_block a multiple of 4)
        const In* g = row + gate_of(c);
        load4(g, gv[k]);
        load4(g + up_offset, uv[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const int64_t c = first + int64_t{k} * 4 * kBlock;
      if (c < width) {
        float y[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) y[e] = silu_times(gv[k][e], uv[k][e]);
        if (vector_out) {
          store4(o + c, y);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[c + e] = from_f32<Out>(y[e]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int64_t c0 = first + int64_t{k} * 4 * kBlock;
    for (int64_t c = c0; c < c0 + 4 && c < width; ++c) {
      const In* g = row + gate_of(c);
      o[c] = from_f32<Out>(silu_times(to_f32(g[0]), to_f32(g[up_offset])));
    }
  }
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
  // Elements per thread held in registers: 4 (hidden sizes up to 1024), 8 (2048), 16 (4096); the
  // loop beyond.
  const int64_t per = (args.dim + kBlock - 1) / kBlock;
  dispatch(args.out_dtype, "add_rms_norm out", [&](auto tag) {
    using T = decltype(tag);
    const auto kernel = per <= 4    ? add_rms_norm_kernel<T, 4>
                        : per <= 8  ? add_rms_norm_kernel<T, 8>
                        : per <= 16 ? add_rms_norm_kernel<T, 16>
                                    : add_rms_norm_kernel<T, 0>;
    launch_kernel(kernel, static_cast<unsigned>(args.rows), kBlock, 0,
                  static_cast<cudaStream_t>(stream), args);
  });
  check_launch("add_rms_norm_kernel");
}

void transform_heads(const HeadTransformArgs& args, void* stream) {
  transform_heads(std::span<const HeadTransformArgs>(&args, 1), stream);
}

namespace {

// The vector kernel's launch where every group qualifies (vector_group) and all have the same
// rows; false (nothing launched) otherwise. Heads a warp: 4 (or 2) where the launch has many rows
// and every group's head count is a multiple of it, else 1 (a decode step's few rows keep a warp
// per head, so its heads spread over more SMs).
bool launch_vector(std::span<const HeadTransformArgs> groups, DType x_dtype, DType out_dtype,
                   cudaStream_t stream) {
  const int64_t rows = groups[0].rows;
  VectorHeadBatch batch{};
  int32_t heads = 0;
  bool by4 = true, by2 = true;
  for (size_t g = 0; g < static_cast<size_t>(kMaxHeadGroups); ++g) {
    batch.first_head[g] = heads;
    if (g >= groups.size()) continue;
    const HeadTransformArgs& group = groups[g];
    if (group.rows != rows || !vector_group(group)) return false;
    batch.group[g] = group;
    heads += group.heads;
    by4 = by4 && group.heads % 4 == 0;
    by2 = by2 && group.heads % 2 == 0;
  }
  batch.first_head[kMaxHeadGroups] = heads;
  constexpr int64_t kManyRows = 64;
  const int per_warp = rows < kManyRows ? 1 : by4 ? 4 : by2 ? 2 : 1;
  const int64_t y = (heads + kWarpsPerBlock * per_warp - 1) / (kWarpsPerBlock * per_warp);
  if (rows > INT32_MAX || y > 65535) return false;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(y));
  dispatch(x_dtype, "transform_heads x", [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch(out_dtype, "transform_heads out", [&](auto out_tag) {
      using Out = decltype(out_tag);
      if (per_warp == 4) {
        launch_kernel(transform_heads_vector_kernel<In, Out, 4>, grid, kBlock, 0, stream, batch);
      } else if (per_warp == 2) {
        launch_kernel(transform_heads_vector_kernel<In, Out, 2>, grid, kBlock, 0, stream, batch);
      } else {
        launch_kernel(transform_heads_vector_kernel<In, Out, 1>, grid, kBlock, 0, stream, batch);
      }
    });
  });
  check_launch("transform_heads_vector_kernel");
  return true;
}

}  // namespace

void transform_heads(std::span<const HeadTransformArgs> groups, void* stream) {
  if (groups.size() > static_cast<size_t>(kMaxHeadGroups))
    throw_error("transform_heads: " + std::to_string(groups.size()) + " groups (expected at most " +
                std::to_string(kMaxHeadGroups) + ")");
  HeadTransformBatch batch{};
  int64_t warps = 0;
  bool any_out = false;
  DType out_dtype = DType::kF32;
  const DType x_dtype = groups.empty() ? DType::kF32 : groups[0].x_dtype;
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
    if (group.x_dtype != x_dtype)
      throw_error("transform_heads: groups read x dtypes " + std::string(dtype_name(x_dtype)) +
                  " and " + std::string(dtype_name(group.x_dtype)) + " (expected one)");
    if (group.write_x && group.x_dtype != DType::kF32)
      throw_error("transform_heads: group " + std::to_string(g) + " writes back an x of dtype " +
                  std::string(dtype_name(group.x_dtype)) + " (write_x needs f32)");
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
  if (launch_vector(groups, x_dtype, out_dtype, static_cast<cudaStream_t>(stream))) return;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch(x_dtype, "transform_heads x", [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch(out_dtype, "transform_heads out", [&](auto out_tag) {
      using Out = decltype(out_tag);
      launch_kernel(transform_heads_kernel<In, Out>, blocks, kBlock, 0,
                    static_cast<cudaStream_t>(stream), batch);
    });
  });
  check_launch("transform_heads_kernel");
}

void silu_mul(const void* gate_up, DType gate_up_dtype, int64_t rows, int64_t width, void* out,
              DType out_dtype, int64_t out_stride, void* stream, int64_t pair_block) {
  if (rows * width == 0) return;
  if (pair_block < 0 || (pair_block > 0 && width % pair_block != 0)) {
    throw_error("silu_mul: pair_block " + std::to_string(pair_block) + " for width " +
                std::to_string(width) + " (expected 0, or a divisor of the width)");
  }
  const int groups = rows >= kSiluManyRows ? 4 : 1;
  const int64_t block_columns = int64_t{4} * kBlock * groups;
  if (rows > INT32_MAX || (width + block_columns - 1) / block_columns > 65535)
    throw_error("silu_mul: " + std::to_string(rows) + " rows of " + std::to_string(width) +
                " (expected at most 2^31 - 1 rows and 65535 x " + std::to_string(block_columns) +
                " columns)");
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((width + block_columns - 1) / block_columns));
  dispatch(gate_up_dtype, "silu_mul gate_up", [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch(out_dtype, "silu_mul out", [&](auto out_tag) {
      using Out = decltype(out_tag);
      const auto* in = static_cast<const In*>(gate_up);
      if (groups == 4) {
        launch_kernel(silu_mul_kernel<In, Out, 4>, grid, kBlock, 0,
                      static_cast<cudaStream_t>(stream), in, width, static_cast<Out*>(out),
                      out_stride, pair_block);
      } else {
        launch_kernel(silu_mul_kernel<In, Out, 1>, grid, kBlock, 0,
                      static_cast<cudaStream_t>(stream), in, width, static_cast<Out*>(out),
                      out_stride, pair_block);
      }
    });
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

namespace {

// Trigger first, then wait: the next kernel may launch (and issue what it may before its own
// wait: prefetches, the decode kernel's early metadata reads) while this probe still waits for its
// predecessor, as it would without the probe. That keeps pdl.cuh's rule: the predecessor triggered
// only after its own wait, so everything before it is complete when the successor starts.
__global__ void timeline_stamp_kernel(uint64_t* stamps, int64_t index) {
  pdl_trigger();
  pdl_wait();
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  stamps[index] = now;
}

}  // namespace

void timeline_stamp(uint64_t* stamps, int64_t index, void* stream) {
  launch_kernel(timeline_stamp_kernel, 1, 1, 0, static_cast<cudaStream_t>(stream), stamps, index);
  check_launch("timeline_stamp_kernel");
}

}  // namespace pagedattn::model::cuda
