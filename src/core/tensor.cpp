// TensorView helpers, validation with argument-naming errors, and the owning HostTensor.
#include "pagedattn/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/check.h"

namespace pagedattn {

std::string Device::str() const {
  return type == DeviceType::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda" || text == "gpu") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string number(text.substr(5));
    char* end = nullptr;
    const long index = std::strtol(number.c_str(), &end, 10);
    if (!number.empty() && end == number.c_str() + number.size() && index >= 0 && index < 1024) {
      return Device::cuda(static_cast<int32_t>(index));
    }
  }
  PA_FAIL("device: '{}' is not a device (expected cpu, cuda or cuda:N)", text);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  PA_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "TensorView: {} dimensions (max {})",
           shape.size(), kMaxDims);
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t extent : shape) view.shape[d++] = extent;
  int64_t stride = 1;
  for (d = view.ndim - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
  return view;
}

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.begin() + ndim, ", "));
}

namespace {

std::string expected_str(std::initializer_list<int64_t> shape) {
  std::string text = "[";
  bool first = true;
  for (int64_t extent : shape) {
    if (!first) text += ", ";
    text += extent == kAnySize ? std::string("*") : std::to_string(extent);
    first = false;
  }
  return text + "]";
}

void check_common(std::string_view name, const TensorView& view,
                  std::initializer_list<int64_t> expected_shape, Device device) {
  PA_CHECK(view.defined(), "{}: tensor is missing (expected shape {})", name,
           expected_str(expected_shape));
  bool match = view.ndim == static_cast<int32_t>(expected_shape.size());
  if (match) {
    int d = 0;
    for (int64_t extent : expected_shape) {
      if (extent != kAnySize && view.shape[d] != extent) match = false;
      ++d;
    }
  }
  PA_CHECK(match, "{}: shape {} does not match expected {}", name, view.shape_str(),
           expected_str(expected_shape));
  for (int d = 0; d < view.ndim; ++d) {
    PA_CHECK(view.shape[d] >= 0, "{}: negative extent {} in dimension {}", name, view.shape[d], d);
    PA_CHECK(view.strides[d] >= 0, "{}: negative stride {} in dimension {} (not supported)", name,
             view.strides[d], d);
  }
  PA_CHECK(view.device == device, "{}: on device {}, expected {}", name, view.device.str(),
           device.str());
  PA_CHECK(view.numel() == 0 || view.data != nullptr, "{}: data pointer is null for shape {}", name,
           view.shape_str());
}

}  // namespace

void check_tensor(std::string_view name, const TensorView& view,
                  std::initializer_list<int64_t> expected_shape, DType dtype, Device device) {
  check_common(name, view, expected_shape, device);
  PA_CHECK(view.dtype == dtype, "{}: dtype {}, expected {}", name, dtype_name(view.dtype),
           dtype_name(dtype));
}

void check_tensor(std::string_view name, const TensorView& view,
                  std::initializer_list<int64_t> expected_shape,
                  std::initializer_list<DType> dtypes, Device device) {
  check_common(name, view, expected_shape, device);
  bool found = false;
  std::string allowed;
  for (DType d : dtypes) {
    found = found || d == view.dtype;
    if (!allowed.empty()) allowed += ", ";
    allowed += dtype_name(d);
  }
  PA_CHECK(found, "{}: dtype {} is not supported (expected one of {})", name,
           dtype_name(view.dtype), allowed);
}

void check_inner_contiguous(std::string_view name, const TensorView& view) {
  PA_CHECK(view.ndim > 0 && (view.strides[view.ndim - 1] == 1 || view.shape[view.ndim - 1] <= 1),
           "{}: innermost stride is {}, expected 1", name,
           view.ndim > 0 ? view.strides[view.ndim - 1] : 0);
}

void HostTensor::Free::operator()(void* p) const { std::free(p); }

HostTensor::HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
  view_ = TensorView::contiguous(nullptr, dtype, shape);
  for (int d = 0; d < view_.ndim; ++d) {
    PA_CHECK(view_.shape[d] >= 0, "HostTensor: negative extent {} in dimension {}", view_.shape[d],
             d);
  }
  const int64_t bytes = view_.numel() * dtype_size(dtype);
  const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  storage_.reset(p);
  view_.data = p;
}

}  // namespace pagedattn
