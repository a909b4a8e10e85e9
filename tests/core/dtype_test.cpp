// DType conversions against exact expectations: round-to-nearest-even on ties, NaN, Inf,
// subnormals, overflow; fp8 e4m3 exhaustively against a float64 decode of its bit pattern.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "pagedattn/dtype.h"

namespace pagedattn {
namespace {

// Independent float64 decoders of the bit patterns (the definition of each format).
double decode_half(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  const double s = sign ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (exponent == 0) return s * std::ldexp(mantissa, -24);
  return s * std::ldexp(1024 + mantissa, exponent - 25);
}

double decode_fp8(uint8_t bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 0xf, mantissa = bits & 7;
  const double s = sign ? -1.0 : 1.0;
  if (exponent == 0xf && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return s * std::ldexp(mantissa, -9);
  return s * std::ldexp(8 + mantissa, exponent - 10);
}

TEST(DType, HalfDecodesEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double expected = decode_half(static_cast<uint16_t>(bits));
    const float got = half_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(double{got}, expected) << bits;
    }
  }
}

TEST(DType, HalfRoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = half_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(value))));
    } else {
      EXPECT_EQ(float_to_half(value), bits) << bits;
    }
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1).
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // tie with 65536 rounds to even: Inf
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);            // tie between 0 and 2^-24: even (0)
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);        // tie between 1 and 2 units: 2
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);            // smallest subnormal
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1023 * 0x1p-24f + 0x1p-25f), 0x0400);  // rounds up into the normals
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);              // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);          // tie: even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);   // above the tie
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to Inf
  EXPECT_EQ(float_to_bf16(0x1p-140f), 0x0000 | (std::bit_cast<uint32_t>(0x1p-140f) >> 16));
  const uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  // A signalling NaN whose payload sits in the low bits must not round to Inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = bf16_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(value)) {
      EXPECT_EQ(float_to_bf16(value), bits);
    }
  }
}

TEST(DType, Fp8DecodesAndRoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 256; ++bits) {
    const double expected = decode_fp8(static_cast<uint8_t>(bits));
    const float got = fp8e4m3_to_float(static_cast<uint8_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got));
      EXPECT_TRUE(std::isnan(fp8e4m3_to_float(float_to_fp8e4m3(got))));
    } else {
      EXPECT_EQ(double{got}, expected) << bits;
      EXPECT_EQ(float_to_fp8e4m3(got), bits) << bits;
    }
  }
}

TEST(DType, Fp8RoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbouring finite values rounds to the one with the even mantissa.
  for (uint32_t bits = 0; bits < 0x7e; ++bits) {
    const double lo = decode_fp8(static_cast<uint8_t>(bits));
    const double hi = decode_fp8(static_cast<uint8_t>(bits + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    const uint8_t expected = (bits & 1) ? static_cast<uint8_t>(bits + 1) : static_cast<uint8_t>(bits);
    EXPECT_EQ(float_to_fp8e4m3(mid), expected) << "between " << lo << " and " << hi;
    EXPECT_EQ(float_to_fp8e4m3(-mid), expected | 0x80);
  }
  EXPECT_EQ(float_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_fp8e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_fp8e4m3(0x1p-10f), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(float_to_fp8e4m3(0x1p-9f), 0x01);   // smallest subnormal
}

TEST(DType, NamesParseBack) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kI32,
                  DType::kI64}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_FALSE(parse_dtype("f8").has_value());
}

}  // namespace
}  // namespace pagedattn
