// The CPU implementations of the row-wise ops (ops.h): RMSNorm and its fused residual form,
// residual add, SiLU·mul, embedding gather, softmax / log-softmax. Rows are independent, so each
// op is one OpenMP loop over rows; a row's reduction runs in f32 (float64 would not match
// transformers' f32 arithmetic any better than f32 does, and costs twice the bandwidth).
#include <cmath>
#include <cstring>

#include "ops/rows.h"
#include "pagedattn/ops.h"

namespace pagedattn::ops {
namespace detail {

std::vector<float> weight_vector(std::string_view name, const TensorView& weight, int64_t dim) {
  PA_CHECK(weight.ndim == 1 && weight.shape[0] == dim, "{}: weight shape {} (expected [{}])", name,
           weight.shape_str(), dim);
  PA_CHECK(weight.device.type == DeviceType::kCPU, "{}: weight on {} (expected cpu)", name,
           weight.device.str());
  std::vector<float> out(static_cast<size_t>(dim));
  dispatch_float(weight.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    const auto* w = static_cast<const T*>(weight.data);
    for (int64_t i = 0; i < dim; ++i)
      out[static_cast<size_t>(i)] = to_float(w[i * weight.strides[0]]);
  });
  return out;
}

}  // namespace detail

using detail::Rows;
using detail::rows_of;

namespace {

// Below this many elements a row-wise op runs on one thread: the fork/join would cost more.
constexpr int64_t kParallelElements = int64_t{1} << 16;

void check_same_rows(std::string_view name, const Rows& a, const Rows& b) {
  PA_CHECK(a.count == b.count && a.dim == b.dim,
           "{}: {} rows of {} elements, expected {} rows of {}", name, b.count, b.dim, a.count,
           a.dim);
}

inline void normalize_row(const float* x, const float* w, int64_t dim, float eps, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  const Rows in = rows_of("rms_norm x", x, DType::kF32);
  const Rows o = rows_of("rms_norm out", out, DType::kF32);
  check_same_rows("rms_norm out", in, o);
  const std::vector<float> w = detail::weight_vector("rms_norm", weight, in.dim);
#pragma omp parallel for if (in.count * in.dim >= kParallelElements)
  for (int64_t r = 0; r < in.count; ++r) {
    normalize_row(in.row<float>(r), w.data(), in.dim, eps, o.row<float>(r));
  }
}

void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight,
                  float eps, const TensorView& out) {
  const Rows res = rows_of("add_rms_norm residual", residual, DType::kF32);
  const Rows o = rows_of("add_rms_norm out", out, DType::kF32);
  check_same_rows("add_rms_norm out", res, o);
  Rows in;
  const bool has_x = x.defined();
  if (has_x) {
    in = rows_of("add_rms_norm x", x, DType::kF32);
    check_same_rows("add_rms_norm x", res, in);
  }
  const std::vector<float> w = detail::weight_vector("add_rms_norm", weight, res.dim);
#pragma omp parallel for if (res.count * res.dim >= kParallelElements)
  for (int64_t r = 0; r < res.count; ++r) {
    float* acc = res.row<float>(r);
    if (has_x) {
      const float* add = in.row<float>(r);
      for (int64_t i = 0; i < res.dim; ++i) acc[i] += add[i];
    }
    normalize_row(acc, w.data(), res.dim, eps, o.row<float>(r));
  }
}

void add_inplace(const TensorView& residual, const TensorView& x) {
  const Rows res = rows_of("add residual", residual, DType::kF32);
  const Rows in = rows_of("add x", x, DType::kF32);
  check_same_rows("add x", res, in);
#pragma omp parallel for if (res.count * res.dim >= kParallelElements)
  for (int64_t r = 0; r < res.count; ++r) {
    float* acc = res.row<float>(r);
    const float* add = in.row<float>(r);
    for (int64_t i = 0; i < res.dim; ++i) acc[i] += add[i];
  }
}

void silu_mul(const TensorView& gate_up, const TensorView& out) {
  const Rows in = rows_of("silu_mul gate_up", gate_up, DType::kF32);
  const Rows o = rows_of("silu_mul out", out, DType::kF32);
  PA_CHECK(in.dim % 2 == 0 && o.dim * 2 == in.dim && o.count == in.count,
           "silu_mul: gate_up has {} rows of {}, out {} rows of {} (expected out = [rows, {}])",
           in.count, in.dim, o.count, o.dim, in.dim / 2);
  const int64_t half = o.dim;
#pragma omp parallel for if (in.count * in.dim >= kParallelElements)
  for (int64_t r = 0; r < in.count; ++r) {
    const float* g = in.row<float>(r);
    const float* u = g + half;
    float* y = o.row<float>(r);
    for (int64_t i = 0; i < half; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out) {
  PA_CHECK(table.ndim == 2 && table.strides[1] == 1,
           "embedding table: shape {} (expected a 2-D "
           "[vocab, dim] view with unit inner stride)",
           table.shape_str());
  PA_CHECK(table.device.type == DeviceType::kCPU, "embedding table on {} (expected cpu)",
           table.device.str());
  const Rows o = rows_of("embedding out", out, DType::kF32);
  PA_CHECK(o.count == static_cast<int64_t>(ids.size()) && o.dim == table.shape[1],
           "embedding out: {} rows of {} (expected {} rows of {})", o.count, o.dim, ids.size(),
           table.shape[1]);
  const int64_t vocab = table.shape[0];
  for (size_t i = 0; i < ids.size(); ++i) {
    PA_CHECK(ids[i] >= 0 && ids[i] < vocab,
             "token id {} at index {} is outside the vocabulary "
             "[0, {})",
             ids[i], i, vocab);
  }
  dispatch_float(table.dtype, "embedding table", [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < ids.size(); ++i) {
      const T* src = static_cast<const T*>(table.data) + ids[i] * table.strides[0];
      float* dst = o.row<float>(static_cast<int64_t>(i));
      for (int64_t d = 0; d < o.dim; ++d) dst[d] = to_float(src[d]);
    }
  });
}

namespace {

template <bool kLog>
void softmax_impl(const TensorView& x) {
  const Rows rows = rows_of(kLog ? "log_softmax" : "softmax", x, DType::kF32);
#pragma omp parallel for if (rows.count > 1 && rows.count * rows.dim >= kParallelElements)
  for (int64_t r = 0; r < rows.count; ++r) {
    float* v = rows.row<float>(r);
    float max = -INFINITY;
    for (int64_t i = 0; i < rows.dim; ++i) max = std::max(max, v[i]);
    double sum = 0.0;  // a vocabulary of 150k terms: accumulate in double
    for (int64_t i = 0; i < rows.dim; ++i) sum += std::exp(static_cast<double>(v[i] - max));
    if constexpr (kLog) {
      const float shift = max + static_cast<float>(std::log(sum));
      for (int64_t i = 0; i < rows.dim; ++i) v[i] -= shift;
    } else {
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t i = 0; i < rows.dim; ++i) v[i] = std::exp(v[i] - max) * inv;
    }
  }
}

}  // namespace

void softmax_rows(const TensorView& x) { softmax_impl<false>(x); }
void log_softmax_rows(const TensorView& x) { softmax_impl<true>(x); }

}  // namespace pagedattn::ops
