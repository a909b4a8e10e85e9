// The CPU backend's row conversion of fp8 e4m3 caches (cpu::simd::convert_fp8, a branch-free
// vectorised decode) against the format's definition computed here: every one of the 256 codes,
// each as the e4m3fn value (sign, 4-bit exponent of bias 7, 3-bit mantissa; exponent 0 subnormal
// m * 2^-9; 0x7f and 0xff NaN) times the scale, bit for bit, at several scales and at row lengths
// that leave vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_simd.h"

namespace pagedattn::cpu {
namespace {

float e4m3_definition(uint8_t code) {
  if ((code & 0x7f) == 0x7f) return std::nanf("");
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

TEST(SimdConvertFp8, EveryCodeAtEveryScale) {
  for (const float scale : {1.0f, 0.37f, 3.0f, 1.0f / 448.0f}) {
    for (const int n : {256, 255, 17, 1}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i)
        codes[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 37 + 11) & 255);
      if (n == 256) {
        for (int i = 0; i < n; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
      }
      std::vector<float> out(static_cast<size_t>(n) + 1, 12345.0f);
      simd::convert_fp8(codes.data(), out.data(), n, scale);
      for (int i = 0; i < n; ++i) {
        const float want = e4m3_definition(codes[static_cast<size_t>(i)]) * scale;
        const float got = out[static_cast<size_t>(i)];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "code " << int{codes[static_cast<size_t>(i)]};
        } else {
          EXPECT_EQ(std::memcmp(&got, &want, 4), 0)
              << "code 0x" << std::hex << int{codes[static_cast<size_t>(i)]} << std::dec
              << " scale " << scale << ": " << got << " vs " << want;
        }
      }
      EXPECT_EQ(out[static_cast<size_t>(n)], 12345.0f) << "wrote past n = " << n;
    }
  }
}

}  // namespace
}  // namespace pagedattn::cpu
