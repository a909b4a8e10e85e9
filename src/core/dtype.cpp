// Names of dtypes and the conversions that are not inline in dtype.h: f32 -> f16 and fp8 e4m3.
#include "pagedattn/dtype.h"

#include <cmath>
#include <limits>

namespace pagedattn {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kI32,
                  DType::kI64}) {
    if (dtype_name(d) == name) return d;
  }
  if (name == "fp8" || name == "e4m3") return DType::kFP8E4M3;
  if (name == "float32") return DType::kF32;
  if (name == "float16" || name == "half") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kFP8E4M3: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kFP8E4M3;
}

uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);  // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (magnitude < 0x38800000u) {
    // Subnormal in f16 (|x| < 2^-14): scale to units of 2^-24 and round to nearest even.
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent, keep 10 mantissa bits, round to nearest even on the other 13.
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebased + rounding) >> 13);
}

float fp8e4m3_to_float(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

uint8_t float_to_fp8e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  if (magnitude >= 448.0f) return sign | 0x7e;  // saturate (Inf included)
  if (magnitude < 0x1p-6f) {
    // Subnormal: units of 2^-9; a result of 8 is the smallest normal, whose bits are also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 0x1p9f));
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  // fraction in [0.5, 1): mantissa bits = (2 * fraction - 1) * 8, rounded to nearest even.
  int mantissa = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  int biased = exponent - 1 + 7;
  if (mantissa == 8) {
    mantissa = 0;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mantissa > 6)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | mantissa);
}

}  // namespace pagedattn
