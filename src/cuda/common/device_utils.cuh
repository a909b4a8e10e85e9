// Device helpers shared by the CUDA kernels: element-type traits (bf16, f16, fp8 e4m3 <-> float),
// 16-byte vector conversion, cp.async with zero fill, fast exp2, warp reductions.
// Device code only (include from .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace pagedattn::cuda {

// ---- element types ----
template <class T>
struct ElementTraits;
template <>
struct ElementTraits<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct ElementTraits<__half> {
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};
template <>
struct ElementTraits<__nv_fp8_e4m3> {
  __device__ static float to_float(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
  // Saturating, like the host float_to_fp8e4m3 (satfinite).
  __device__ static __nv_fp8_e4m3 from_float(float v) {
    __nv_fp8_e4m3 out;
    out.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return out;
  }
};

template <class T>
__device__ __forceinline__ float to_float(T v) {
  return ElementTraits<T>::to_float(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v) {
  return ElementTraits<T>::from_float(v);
}

// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

// Converts the 16 bytes `v` (kVecElems<T> elements of T) to floats.
template <class T>
__device__ __forceinline__ void vec_to_float(const uint4& v, float* out);

template <>
__device__ __forceinline__ void vec_to_float<__nv_bfloat16>(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <>
__device__ __forceinline__ void vec_to_float<__half>(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    memcpy(&h, &words[i], 4);
    const float2 f = __half22float2(h);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <>
__device__ __forceinline__ void vec_to_float<__nv_fp8_e4m3>(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const __nv_fp8x2_storage_t pair =
          static_cast<__nv_fp8x2_storage_t>((words[i] >> (16 * j)) & 0xffffu);
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      __half2 h;
      memcpy(&h, &raw, 4);
      const float2 f = __half22float2(h);
      out[4 * i + 2 * j] = f.x;
      out[4 * i + 2 * j + 1] = f.y;
    }
  }
}

// The device's global timer, in ns (the same clock on every SM: stamps of different CTAs compare).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// ---- asynchronous copies (sm_80+) ----
// 16 bytes global -> shared; when `valid` is false the destination is zero-filled and the source
// is not read (it must still be a mapped address: pass any valid pointer).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- math ----
inline constexpr float kLn2 = 0.6931471805599453f;  // ln 2: base-2 lse to natural

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace pagedattn::cuda
