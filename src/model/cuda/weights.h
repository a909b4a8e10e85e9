// The CUDA model's weights: each checkpoint tensor uploaded once from the memory-mapped file into
// its own device allocation, converted to the dtype it is used in (the compute dtype for GEMM
// weights and the embedding table, f32 for norm weights, biases, the MoE router and the RoPE
// tables). Stacked projections (q/k/v, gate/up) are uploaded part by part into one [out, in]
// matrix so that one GEMM serves them. Nothing is copied whole on the host: a tensor whose dtype
// changes goes through a device staging buffer (the raw bytes, then a conversion kernel), one
// tensor at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "cuda/workspace.h"  // DeviceBuffer
#include "pagedattn/checkpoint.h"

namespace pagedattn::model::cuda {

using ::pagedattn::cuda::DeviceBuffer;

// A row-major [rows, cols] device matrix.
struct DeviceMatrix {
  DeviceBuffer buffer;
  DType dtype = DType::kBF16;
  int64_t rows = 0, cols = 0;
  const void* data() const { return buffer.data(); }
  bool defined() const { return rows > 0; }
};

// A linear layer y = x · Wᵀ (+ bias): W [out, in] in the compute dtype, bias [out] f32 or none.
struct DeviceLinear {
  DeviceMatrix weight;
  DeviceBuffer bias;
  int64_t in() const { return weight.cols; }
  int64_t out() const { return weight.rows; }
  const float* bias_data() const { return bias.as<const float>(); }
  bool defined() const { return weight.defined(); }
};

class WeightUploader {
 public:
  explicit WeightUploader(DType compute_dtype) : compute_(compute_dtype) {}

  DType compute_dtype() const { return compute_; }
  // Bytes of device memory allocated so far.
  int64_t bytes() const { return bytes_; }

  // 2-D host views [rows_i, cols] (row stride >= cols, inner stride 1; f32/f16/bf16) stacked by
  // rows into one device matrix of `dtype`. Throws Error naming `name` for a bad view.
  DeviceMatrix matrix(std::string_view name, std::span<const TensorView* const> parts, DType dtype);
  DeviceMatrix matrix(std::string_view name, const TensorView& weight, DType dtype) {
    const TensorView* parts[] = {&weight};
    return matrix(name, parts, dtype);
  }
  // The linear layer of stacked checkpoint parts, in the compute dtype; their biases (absent ones
  // read as 0) in f32.
  DeviceLinear linear(std::string_view name, std::initializer_list<const LinearWeights*> parts);
  // A stacked [gate; up] weight [2 I, in] reordered in place into blocks of `block` gate rows
  // then their `block` up rows (I a multiple of `block`): the layout of the MoE's fused SiLU
  // epilogue (moe.h, kMoePairBlock). Two strided device copies; the old buffer is freed.
  void interleave_pairs(std::string_view name, DeviceMatrix& gate_up, int64_t block);
  // A 1-D weight of `size` elements (any float dtype) as f32.
  DeviceBuffer vector(std::string_view name, const TensorView& weight, int64_t size);
  // Host floats to the device.
  DeviceBuffer floats(const float* values, int64_t count);

 private:
  DeviceBuffer allocate(int64_t bytes);
  DType compute_;
  int64_t bytes_ = 0;
  DeviceBuffer staging_;
};

}  // namespace pagedattn::model::cuda
