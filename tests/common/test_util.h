// Test utilities shared by every layer's tests: seeded random fills, output poisoning, and
// element-wise comparison against a float64 reference with per-dtype tolerances.
//
// Seeds: every test draws fresh inputs from a seed that is printed on failure
// (PAGEDATTN_TEST_SEED fixes it for reproduction).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <string_view>
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

// Tolerance of an attention output, relative to the scale of each output row (one query head's
// head_dim_vo values), so that it keeps its power whatever the row's magnitude: a long request's
// output (~0.58/sqrt(L) with flat softmax) is judged against its own size, not an absolute 1e-2.
//   element: |got - expected| <= element_rel * |expected| + row_floor * rms(expected row);
//   row:     ||got - expected||_2 <= row_rel_l2 * ||expected||_2 (over the row);
//   a row whose expected values are all 0 (no visible key) must be exactly 0; NaN never passes.
// What it sees: any row whose error exceeds the output dtype's rounding (bf16 2^-9, fp16 2^-12
// relative, with a margin for the kernel's f32 accumulation): a key or page of weight >~ 0.5%
// (bf16) of the row dropped or added, a scale error of >~ 0.4% on the output, a V mean lost.
// What it cannot see: errors below the rounding of the output, e.g. one dropped key of weight
// 1e-4 in a long flat-softmax row, or a logit scale off by 2% when the softmax is flat; lse
// (checked in f32 to ~1e-5 relative, see kLseTolerance) catches those: a dropped key of weight w
// moves lse by ~w, a logit scale off by e moves it by ~e * mean logit.
struct RowTolerance {
  double element_rel = 0;
  double row_floor = 0;
  double row_rel_l2 = 0;
};
RowTolerance row_tolerance_for(DType out_dtype);

// lse is stored in f32 whatever the output dtype: the kernel's error is its f32 logits and sums
// (~1e-6 of the logits' magnitude); abs 5e-5 + rel 1e-5 leaves a margin on large logits.
inline constexpr Tolerance kLseTolerance{5e-5, 1e-5};

// Compares `got` with `expected` as rows of `row_length` values (see RowTolerance). Returns "" or
// a report naming the first few bad rows / elements and the counts.
std::string compare_rows(std::span<const double> got, std::span<const double> expected,
                         int64_t row_length, RowTolerance tolerance, const std::string& what);

// Runs `statement`; returns "" when it throws pagedattn::Error whose message contains every one of
// `needles` (the argument's name and the bad value, not only words every message of that function
// has), else what happened instead (no throw, another exception, the message lacking a needle).
//   EXPECT_EQ(error_containing([&] { plan(...); }, {"limits.max_batch = 2", "3"}), "");
std::string error_containing(const std::function<void()>& statement,
                             std::initializer_list<std::string_view> needles);

// Compares every element; NaN never passes. Returns an empty string when all match, else a
// message naming the first few mismatches (index, got, expected) and the count.
std::string compare(std::span<const double> got, std::span<const double> expected,
                    Tolerance tolerance, const std::string& what);

}  // namespace pagedattn::testing
