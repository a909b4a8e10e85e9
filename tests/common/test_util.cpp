#include "common/test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "pagedattn/error.h"

namespace pagedattn::testing {

uint64_t fresh_seed() {
  if (const char* env = std::getenv("PAGEDATTN_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 10);
  }
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

namespace {

// Calls fn(offset_in_elements) for each element of the view, row-major.
template <class Fn>
void for_each_offset(const TensorView& view, Fn&& fn) {
  const int64_t n = view.numel();
  std::array<int64_t, kMaxDims> index{};
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t offset = 0;
    for (int d = 0; d < view.ndim; ++d) offset += index[d] * view.strides[d];
    fn(flat, offset);
    for (int d = view.ndim - 1; d >= 0; --d) {
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
}

void store(const TensorView& view, int64_t offset, float value, float fp8_scale) {
  char* base = static_cast<char*>(view.data);
  switch (view.dtype) {
    case DType::kF32: reinterpret_cast<float*>(base)[offset] = value; break;
    case DType::kF16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_half(value); break;
    case DType::kBF16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_bf16(value); break;
    case DType::kFP8E4M3:
      reinterpret_cast<uint8_t*>(base)[offset] = float_to_fp8e4m3(value / fp8_scale);
      break;
    case DType::kI32: reinterpret_cast<int32_t*>(base)[offset] = static_cast<int32_t>(value); break;
    case DType::kI64: reinterpret_cast<int64_t*>(base)[offset] = static_cast<int64_t>(value); break;
  }
}

double load(const TensorView& view, int64_t offset, float fp8_scale) {
  const char* base = static_cast<const char*>(view.data);
  switch (view.dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(base)[offset];
    case DType::kF16: return half_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kBF16: return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kFP8E4M3:
      return double{fp8e4m3_to_float(reinterpret_cast<const uint8_t*>(base)[offset])} * fp8_scale;
    case DType::kI32: return reinterpret_cast<const int32_t*>(base)[offset];
    case DType::kI64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[offset]);
  }
  return 0;
}

}  // namespace

void fill_uniform(const TensorView& view, std::mt19937_64& rng, float lo, float hi,
                  float fp8_scale) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for_each_offset(view, [&](int64_t, int64_t offset) { store(view, offset, dist(rng), fp8_scale); });
}

void poison(const TensorView& view) {
  const int64_t element_bytes = dtype_size(view.dtype);
  for_each_offset(view, [&](int64_t, int64_t offset) {
    std::memset(static_cast<char*>(view.data) + offset * element_bytes, 0xff, element_bytes);
  });
}

double element(const TensorView& view, int64_t flat_index, float fp8_scale) {
  int64_t offset = 0;
  for (int d = view.ndim - 1; d >= 0; --d) {
    offset += (flat_index % view.shape[d]) * view.strides[d];
    flat_index /= view.shape[d];
  }
  return load(view, offset, fp8_scale);
}

std::vector<double> to_doubles(const TensorView& view, float fp8_scale) {
  std::vector<double> values(static_cast<size_t>(view.numel()));
  for_each_offset(view, [&](int64_t flat, int64_t offset) {
    values[static_cast<size_t>(flat)] = load(view, offset, fp8_scale);
  });
  return values;
}

Tolerance tolerance_for(DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32: return {2e-5, 2e-4};
    case DType::kF16: return {2e-3, 4e-3};
    case DType::kBF16: return {1e-2, 2e-2};
    default: return {5e-2, 1e-1};
  }
}

RowTolerance row_tolerance_for(DType out_dtype) {
  // element_rel: twice the output rounding (2^-24 f32, 2^-11 fp16, 2^-8 bf16 ulp halves), plus the
  // f32 accumulation for f32; row_floor: where an element is near 0 in a row of larger values,
  // rounding of the row's other terms; row_rel_l2: the rounding's rms plus a margin.
  switch (out_dtype) {
    case DType::kF32: return {2e-5, 1e-5, 1e-5};
    case DType::kF16: return {1e-3, 3e-4, 8e-4};
    case DType::kBF16: return {8e-3, 2e-3, 5e-3};
    default: return {5e-2, 2e-2, 3e-2};
  }
}

std::string compare_rows(std::span<const double> got, std::span<const double> expected,
                         int64_t row_length, RowTolerance tolerance, const std::string& what) {
  if (got.size() != expected.size() || row_length <= 0 ||
      expected.size() % static_cast<size_t>(row_length) != 0) {
    return fmt::format("{}: {} elements, expected {} in rows of {}", what, got.size(),
                       expected.size(), row_length);
  }
  std::string report;
  int64_t bad_rows = 0, bad_elements = 0;
  const int64_t rows = static_cast<int64_t>(expected.size()) / row_length;
  for (int64_t row = 0; row < rows; ++row) {
    const double* g = got.data() + row * row_length;
    const double* e = expected.data() + row * row_length;
    double norm2 = 0, error2 = 0;
    for (int64_t i = 0; i < row_length; ++i) norm2 += e[i] * e[i];
    const double rms = std::sqrt(norm2 / double(row_length));
    int64_t bad_here = 0;
    for (int64_t i = 0; i < row_length; ++i) {
      const double diff = std::fabs(g[i] - e[i]);
      error2 += std::isfinite(diff) ? diff * diff : HUGE_VAL;
      const bool ok = std::isfinite(g[i]) &&
                      diff <= tolerance.element_rel * std::fabs(e[i]) + tolerance.row_floor * rms;
      if (!ok) {
        if (bad_elements < 6) {
          report += fmt::format("\n  row {} [{}] got {:.8g}, expected {:.8g} (row rms {:.3g})", row,
                                i, g[i], e[i], rms);
        }
        ++bad_elements;
        ++bad_here;
      }
    }
    const bool row_ok = std::sqrt(error2) <= tolerance.row_rel_l2 * std::sqrt(norm2);
    if (!row_ok && bad_here == 0 && bad_rows < 6) {
      report += fmt::format("\n  row {}: relative L2 error {:.3g} > {}", row,
                            std::sqrt(error2 / norm2), tolerance.row_rel_l2);
    }
    if (!row_ok || bad_here > 0) ++bad_rows;
  }
  if (bad_rows == 0) return {};
  return fmt::format(
      "{}: {} of {} rows out of tolerance ({} elements; element rel {}, row floor {} x rms, row "
      "relative L2 {}):{}",
      what, bad_rows, rows, bad_elements, tolerance.element_rel, tolerance.row_floor,
      tolerance.row_rel_l2, report);
}

std::string error_containing(const std::function<void()>& statement,
                             std::initializer_list<std::string_view> needles) {
  try {
    statement();
  } catch (const Error& error) {
    const std::string message = error.what();
    std::string missing;
    for (std::string_view needle : needles) {
      if (message.find(needle) == std::string::npos) missing += fmt::format(" '{}'", needle);
    }
    if (missing.empty()) return {};
    return fmt::format("the error \"{}\" lacks{}", message, missing);
  } catch (const std::exception& other) {
    return fmt::format("threw another exception, not pagedattn::Error: {}", other.what());
  }
  return "no error thrown";
}

std::string compare(std::span<const double> got, std::span<const double> expected,
                    Tolerance tolerance, const std::string& what) {
  if (got.size() != expected.size()) {
    return fmt::format("{}: {} elements, expected {}", what, got.size(), expected.size());
  }
  std::string report;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double e = expected[i];
    bool ok;
    if (std::isinf(e)) {
      ok = g == e;
    } else {
      ok = std::isfinite(g) && std::fabs(g - e) <= tolerance.abs + tolerance.rel * std::fabs(e);
    }
    if (!ok) {
      if (bad < 8) report += fmt::format("\n  [{}] got {:.8g}, expected {:.8g}", i, g, e);
      ++bad;
    }
  }
  if (bad == 0) return {};
  return fmt::format("{}: {} of {} elements out of tolerance (abs {}, rel {}):{}", what, bad,
                     got.size(), tolerance.abs, tolerance.rel, report);
}

}  // namespace pagedattn::testing
