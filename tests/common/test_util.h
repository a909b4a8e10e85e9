// Test utilities shared by every layer's tests: seeded random fills, output poisoning, and
// element-wise comparison against a float64 reference with per-dtype tolerances.
//
// Seeds: every test draws fresh inputs from a seed that is printed on failure
// (PAGEDATTN_TEST_SEED fixes it for reproduction).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn::testing {

// A fresh seed per call (from std::random_device), or PAGEDATTN_TEST_SEED when set.
uint64_t fresh_seed();

// Fills a host view (any strides) with values uniform in [lo, hi), converted to its dtype
// (for fp8 the stored value is value / scale).
void fill_uniform(const TensorView& view, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f,
                  float fp8_scale = 1.0f);
// Fills every byte of a host view's extent with a NaN pattern (0xFF bytes: NaN in every float
// dtype, fp8 included), so that an element the code under test forgets to write fails the check.
void poison(const TensorView& view);
// Element (flat row-major index over the view's shape) as a double, dequantised with `scale`.
double element(const TensorView& view, int64_t flat_index, float fp8_scale = 1.0f);
// All elements as doubles, row-major.
std::vector<double> to_doubles(const TensorView& view, float fp8_scale = 1.0f);

struct Tolerance {
  double abs = 0;
  double rel = 0;
};
// Tolerance for outputs stored in `dtype` (rounding of the output dominates).
Tolerance tolerance_for(DType out_dtype);

// Compares every element; NaN never passes. Returns an empty string when all match, else a
// message naming the first few mismatches (index, got, expected) and the count.
std::string compare(std::span<const double> got, std::span<const double> expected,
                    Tolerance tolerance, const std::string& what);

}  // namespace pagedattn::testing
