// Row access shared by the ops: a [rows, dim] or [rows, heads, dim] view walked as a list of
// contiguous rows of `dim` elements (outer strides free, inner stride 1), and the device check
// that routes a call to its implementation.
#pragma once

#include <string_view>
#include <vector>

#include "core/check.h"
#include "pagedattn/tensor.h"

namespace pagedattn::ops::detail {

struct Rows {
  char* base = nullptr;
  int64_t count = 0;  // rows x heads
  int64_t heads = 1;
  int64_t dim = 0;
  int64_t stride0 = 0, stride1 = 0;  // bytes
  template <class T>
  T* row(int64_t index) const {
    const int64_t r = index / heads, h = index % heads;
    return reinterpret_cast<T*>(base + r * stride0 + h * stride1);
  }
};

// Checks that `view` is a 2-D or 3-D CPU view of `dtype` with unit inner stride.
inline Rows rows_of(std::string_view name, const TensorView& view, DType dtype) {
  PA_CHECK(view.ndim == 2 || view.ndim == 3,
           "{}: shape {} (expected [rows, dim] or [rows, heads, dim])", name, view.shape_str());
  PA_CHECK(view.dtype == dtype, "{}: dtype {} (expected {})", name, dtype_name(view.dtype),
           dtype_name(dtype));
  PA_CHECK(view.device.type == DeviceType::kCPU,
           "{}: on {}: the CUDA ops are not built yet (the ops run on cpu)", name,
           view.device.str());
  PA_CHECK(view.strides[view.ndim - 1] == 1, "{}: inner stride {} (expected 1)", name,
           view.strides[view.ndim - 1]);
  const int64_t elem = dtype_size(dtype);
  Rows r;
  r.base = static_cast<char*>(view.data);
  r.dim = view.shape[view.ndim - 1];
  r.heads = view.ndim == 3 ? view.shape[1] : 1;
  r.count = view.shape[0] * r.heads;
  r.stride0 = view.strides[0] * elem;
  r.stride1 = view.ndim == 3 ? view.strides[1] * elem : 0;
  PA_CHECK(r.count == 0 || r.base != nullptr, "{}: null data for shape {}", name, view.shape_str());
  return r;
}

// Reads a small 1-D weight vector (norm weight) of any float dtype into f32.
std::vector<float> weight_vector(std::string_view name, const TensorView& weight, int64_t dim);

}  // namespace pagedattn::ops::detail
