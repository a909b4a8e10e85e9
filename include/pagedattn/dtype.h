// Element types of tensors and the host conversions between them.
//
// f16 and bf16 conversions round to nearest, ties to even, keep NaN a (quiet) NaN and Inf an Inf;
// f16 handles subnormals exactly. fp8 is e4m3 "fn" (no Inf; NaN is S.1111.111; largest finite is
// 448) and is used for KV caches with a per-tensor scale: stored = to_fp8(value / scale), read =
// from_fp8(stored) * scale. Conversion to fp8 saturates to +-448 (the CUDA "satfinite" mode).
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pagedattn {

enum class DType : uint8_t { kF32, kF16, kBF16, kFP8E4M3, kI32, kI64 };

std::string_view dtype_name(DType dtype);                // "f32", "f16", "bf16", "fp8_e4m3", ...
std::optional<DType> parse_dtype(std::string_view name);  // accepts the names above
int64_t dtype_size(DType dtype);                          // bytes per element
bool is_floating(DType dtype);

// Storage types: plain bit containers, so that they are trivially copyable in any code.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Fp8E4M3 {
  uint8_t bits;
};

// ---- conversions (inline: they sit in the CPU kernels' inner loops) ----

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Branch-free so that loops over f16 vectorize: the exponent/mantissa bits shifted into a float
// and scaled by 2^112 are exact for normals and subnormals; Inf/NaN get the float exponent forced.
inline float half_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t magnitude = bits & 0x7fffu;
  const float scaled = std::bit_cast<float>(magnitude << 13) * 0x1p112f;
  const uint32_t finite = std::bit_cast<uint32_t>(scaled);
  const uint32_t special = (magnitude << 13) | 0x7f800000u;
  return std::bit_cast<float>(sign | (magnitude >= 0x7c00u ? special : finite));
}

uint16_t float_to_half(float value);
float fp8e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8e4m3(float value);

inline float to_float(float v) { return v; }
inline float to_float(Half v) { return half_to_float(v.bits); }
inline float to_float(BFloat16 v) { return bf16_to_float(v.bits); }
inline float to_float(Fp8E4M3 v) { return fp8e4m3_to_float(v.bits); }

template <class T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline Half from_float<Half>(float v) {
  return Half{float_to_half(v)};
}
template <>
inline BFloat16 from_float<BFloat16>(float v) {
  return BFloat16{float_to_bf16(v)};
}
template <>
inline Fp8E4M3 from_float<Fp8E4M3>(float v) {
  return Fp8E4M3{float_to_fp8e4m3(v)};
}

// The storage type of a floating DType, for dispatch with templated lambdas.
template <DType kDType>
struct StorageOf;
template <>
struct StorageOf<DType::kF32> {
  using type = float;
};
template <>
struct StorageOf<DType::kF16> {
  using type = Half;
};
template <>
struct StorageOf<DType::kBF16> {
  using type = BFloat16;
};
template <>
struct StorageOf<DType::kFP8E4M3> {
  using type = Fp8E4M3;
};

// Calls fn(T{}) with T the storage type of `dtype` (a floating type); throws for other dtypes,
// naming `what`.
template <class Fn>
decltype(auto) dispatch_float(DType dtype, std::string_view what, Fn&& fn);

}  // namespace pagedattn

#include "pagedattn/detail/dtype_dispatch.h"
