// fp8 e4m3 K/V tiles for the prefill kernels (kernel.cuh, kernel_sm90.cuh): widened in shared
// memory to the MMA dtype (bf16 / f16), so the tensor-core code is the same as for a bf16 / f16
// cache and its inputs are exact (every e4m3 value, NaN included, is a bf16 and an f16 value).
//
// The gather (load_kv_tile / load_tile) copies an fp8 row in 16-byte pieces of 16 elements, each
// into the first of the two 16-byte chunks of the tile that will hold its 16 bf16 / f16 values
// (tile chunk 2c for piece c, wherever the tile's swizzle puts it). After its cp.async group has
// landed, each thread widens exactly the pieces it copied itself: it reads chunk 2c, writes chunks
// 2c and 2c + 1. No other thread reads or writes those two chunks meanwhile, so the widening needs
// no barrier and no staging buffer: the kernels' existing barrier (after cp.async.wait) publishes
// the widened tile, as it published the copied one. The dequantisation scales stay out of the
// tiles: K's is folded into the logits' scale, V's into the output's (prefill.cpp, params.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace pagedattn::cuda::prefill {

// Two e4m3 values (the low 16 bits; element 0 in the low byte) -> two T values, packed as the
// MMA fragments hold them (element 0 in the low half).
template <class T>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t pair);

// cvt.rn.f16x2.e4m3x2 on sm_89+: exact.
__device__ __forceinline__ __half2_raw e4m3x2_to_half2(uint32_t pair) {
  return __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
}

template <>
__device__ __forceinline__ uint32_t widen_e4m3x2<__half>(uint32_t pair) {
  const __half2_raw h = e4m3x2_to_half2(pair);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

template <>
__device__ __forceinline__ uint32_t widen_e4m3x2<__nv_bfloat16>(uint32_t pair) {
  // e4m3 -> f16 -> f32 is exact, and the f32 value has at most 3 mantissa bits, so its upper half
  // is the bf16 value (no rounding; NaN stays NaN): a byte permute instead of a conversion.
  const float2 f = __half22float2(__half2(e4m3x2_to_half2(pair)));
  return __byte_perm(__float_as_uint(f.x), __float_as_uint(f.y), 0x7632);
}

__device__ __forceinline__ uint4 ld_shared_16(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_16(uint32_t address, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// Widens this thread's pieces of a kRows x (kChunks x 16 bytes) tile that the gather filled with
// fp8 (see above): piece i = it * kThreads + threadIdx.x is row i / (kChunks / 2), piece
// i % (kChunks / 2), the same numbering as the gathers' (their fast path included: there
// kThreads is a multiple of the pieces per row, so row and piece are the same functions of i).
// `offset(row, chunk)` is the tile's byte offset of a 16-byte chunk (its swizzle). Pieces are read
// a few at a time before any is written back, so their shared-memory latencies overlap. Call
// after cp.async.wait, before the barrier that publishes the tile.
template <class T, int kChunks, int kRows, int kThreads, class Offset>
__device__ __forceinline__ void widen_e4m3_tile(uint32_t tile, Offset offset) {
  constexpr int kPieces = kChunks / 2;  // 16-byte fp8 pieces per row
  static_assert(kChunks % 2 == 0 && kRows * kPieces % kThreads == 0);
  constexpr int kIters = kRows * kPieces / kThreads;  // pieces per thread
  constexpr int kBatch = kIters % 4 == 0 ? 4 : (kIters % 3 == 0 ? 3 : (kIters % 2 == 0 ? 2 : 1));
#pragma unroll
  for (int it0 = 0; it0 < kIters; it0 += kBatch) {
    uint32_t first[kBatch];
    uint4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = (it0 + j) * kThreads + static_cast<int>(threadIdx.x);
      const int row = i / kPieces, piece = i % kPieces;
      first[j] = tile + offset(row, 2 * piece);
      v[j] = ld_shared_16(first[j]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = (it0 + j) * kThreads + static_cast<int>(threadIdx.x);
      const int row = i / kPieces, piece = i % kPieces;
      st_shared_16(first[j], widen_e4m3x2<T>(v[j].x), widen_e4m3x2<T>(v[j].x >> 16),
                   widen_e4m3x2<T>(v[j].y), widen_e4m3x2<T>(v[j].y >> 16));
      st_shared_16(tile + offset(row, 2 * piece + 1), widen_e4m3x2<T>(v[j].z),
                   widen_e4m3x2<T>(v[j].z >> 16), widen_e4m3x2<T>(v[j].w),
                   widen_e4m3x2<T>(v[j].w >> 16));
    }
  }
}

}  // namespace pagedattn::cuda::prefill
