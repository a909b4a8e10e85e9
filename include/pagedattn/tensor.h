// Non-owning tensor views, with the same fields as DLPack's DLTensor (data, device, dtype, ndim,
// shape, strides in elements) so that language bindings stay a thin layer, and HostTensor, an
// owning, 64-byte-aligned host buffer for tools and tests.
//
// Every entry point validates its views with check_tensor(), whose errors name the argument, the
// value seen and what was expected, e.g.
//   "q: shape [4, 32, 96] does not match expected [4, 32, 128]".
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "pagedattn/dtype.h"

namespace pagedattn {

enum class DeviceType : uint8_t { kCPU = 1, kCUDA = 2 };  // DLPack's kDLCPU and kDLCUDA codes

struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;

  static constexpr Device cpu() { return {DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int32_t index = 0) { return {DeviceType::kCUDA, index}; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu", "cuda", "cuda:1"; throws Error for anything else.
Device parse_device(std::string_view text);

inline constexpr int kMaxDims = 6;
inline constexpr int64_t kAnySize = -1;  // wildcard in expected shapes

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  int32_t ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements, like DLPack

  // A row-major (C-contiguous) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());

  // A default-constructed view is "absent" (an optional output such as lse).
  bool defined() const { return ndim > 0; }
  int64_t size(int dim) const { return shape[dim]; }
  int64_t stride(int dim) const { return strides[dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "[4, 32, 128]"

  template <class T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
};

// Checks `view` against an expected shape (kAnySize matches any extent), a dtype and a device;
// throws Error naming `name` on the first mismatch. Also rejects null data for non-empty views and
// negative strides.
void check_tensor(std::string_view name, const TensorView& view,
                  std::initializer_list<int64_t> expected_shape, DType dtype, Device device);
// As above, with a set of acceptable dtypes.
void check_tensor(std::string_view name, const TensorView& view,
                  std::initializer_list<int64_t> expected_shape,
                  std::initializer_list<DType> dtypes, Device device);
// The innermost dimension must have stride 1 (vector loads), other strides are free.
void check_inner_contiguous(std::string_view name, const TensorView& view);

// An owning, zero-initialised, 64-byte-aligned, contiguous host tensor.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape);

  const TensorView& view() const { return view_; }
  template <class T>
  T* data() const {
    return view_.data_as<T>();
  }
  int64_t numel() const { return view_.numel(); }
  int64_t bytes() const { return view_.numel() * dtype_size(view_.dtype); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> storage_;
  TensorView view_;
};

}  // namespace pagedattn
