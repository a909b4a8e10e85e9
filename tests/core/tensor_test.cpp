// TensorView helpers (contiguous strides, numel, contiguity, shape text), device parsing,
// HostTensor allocation, and the check_tensor / check_inner_contiguous error messages: each must
// name the argument, the value seen and what was expected.
#include "pagedattn/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

TEST(TensorView, ContiguousStridesNumelAndText) {
  float data[24];
  const TensorView view = TensorView::contiguous(data, DType::kF32, {2, 3, 4});
  EXPECT_EQ(view.ndim, 3);
  EXPECT_EQ(view.strides[0], 12);
  EXPECT_EQ(view.strides[1], 4);
  EXPECT_EQ(view.strides[2], 1);
  EXPECT_EQ(view.numel(), 24);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_TRUE(view.defined());
  EXPECT_EQ(view.shape_str(), "[2, 3, 4]");
  TensorView sliced = view;
  sliced.shape[1] = 2;  // rows 0..1 of each 3: no longer contiguous
  EXPECT_FALSE(sliced.is_contiguous());
  TensorView unit = view;
  unit.shape[0] = 1;
  unit.strides[0] = 999;  // the stride of an extent-1 dimension does not matter
  EXPECT_TRUE(unit.is_contiguous());
  EXPECT_FALSE(TensorView{}.defined());
  EXPECT_EQ(TensorView{}.numel(), 0);
  EXPECT_NE(error_of([&] {
              TensorView::contiguous(data, DType::kF32, {1, 1, 1, 1, 1, 1, 1});
            }).find("7 dimensions (max 6)"),
            std::string::npos);
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "cuda:-1", ""}) {
    const std::string message = error_of([&] { parse_device(bad); });
    EXPECT_NE(message.find("device: '" + std::string(bad) + "' is not a device"), std::string::npos)
        << message;
  }
}

TEST(HostTensor, ZeroedAlignedContiguous) {
  HostTensor tensor(DType::kBF16, {3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor.view().data) % 64, 0u);
  EXPECT_EQ(tensor.bytes(), 30);
  EXPECT_TRUE(tensor.view().is_contiguous());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(tensor.data<uint16_t>()[i], 0);
  HostTensor empty(DType::kF32, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_NE(empty.view().data, nullptr);
  EXPECT_NE(error_of([] {
              HostTensor(DType::kF32, {2, -1});
            }).find("negative extent -1"),
            std::string::npos);
}

// Each failure mode of check_tensor, with the exact message a caller sees.
TEST(CheckTensor, ErrorMessagesNameArgumentValueAndExpectation) {
  float data[8];
  const TensorView q = TensorView::contiguous(data, DType::kF32, {2, 4});
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {2, 4}, DType::kF32, Device::cpu());
            }),
            "<no error>");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {kAnySize, 4}, DType::kF32, Device::cpu());
            }),
            "<no error>");
  EXPECT_EQ(error_of([&] {
              check_tensor("lse", TensorView{}, {2, 4}, DType::kF32, Device::cpu());
            }),
            "lse: tensor is missing (expected shape [2, 4])");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {2, 8}, DType::kF32, Device::cpu());
            }),
            "q: shape [2, 4] does not match expected [2, 8]");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {kAnySize, 4, 1}, DType::kF32, Device::cpu());
            }),
            "q: shape [2, 4] does not match expected [*, 4, 1]");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {2, 4}, DType::kBF16, Device::cpu());
            }),
            "q: dtype f32, expected bf16");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {2, 4}, DType::kF32, Device::cuda(1));
            }),
            "q: on device cpu, expected cuda:1");
  EXPECT_EQ(error_of([&] {
              check_tensor("q", q, {2, 4}, {DType::kF16, DType::kBF16}, Device::cpu());
            }),
            "q: dtype f32 is not supported (expected one of f16, bf16)");
  TensorView negative = q;
  negative.strides[0] = -4;
  EXPECT_EQ(error_of([&] {
              check_tensor("k", negative, {2, 4}, DType::kF32, Device::cpu());
            }),
            "k: negative stride -4 in dimension 0 (not supported)");
  TensorView null_data = q;
  null_data.data = nullptr;
  EXPECT_EQ(error_of([&] {
              check_tensor("out", null_data, {2, 4}, DType::kF32, Device::cpu());
            }),
            "out: data pointer is null for shape [2, 4]");
  TensorView empty = null_data;
  empty.shape[0] = 0;  // an empty view may have no data
  EXPECT_EQ(error_of([&] {
              check_tensor("out", empty, {0, 4}, DType::kF32, Device::cpu());
            }),
            "<no error>");
  TensorView negative_extent = q;
  negative_extent.shape[1] = -2;
  EXPECT_EQ(error_of([&] {
              check_tensor("v", negative_extent, {2, kAnySize}, DType::kF32, Device::cpu());
            }),
            "v: negative extent -2 in dimension 1");
}

TEST(CheckTensor, InnerContiguous) {
  float data[8];
  TensorView view = TensorView::contiguous(data, DType::kF32, {2, 4});
  EXPECT_EQ(error_of([&] { check_inner_contiguous("q", view); }), "<no error>");
  view.strides[1] = 2;
  EXPECT_EQ(error_of([&] { check_inner_contiguous("q", view); }),
            "q: innermost stride is 2, expected 1");
  view.shape[1] = 1;  // a single element per row has no inner stride to speak of
  EXPECT_EQ(error_of([&] { check_inner_contiguous("q", view); }), "<no error>");
}

}  // namespace
}  // namespace pagedattn
