// WeightUploader (weights.h): host views of the mapped checkpoint to device matrices, one part at
// a time. Same dtype: one 2-D copy from the mapping into the destination rows. Another dtype: the
// part's raw bytes into the staging buffer (grown to the largest part), then convert_rows into
// place, waited for before the staging buffer is reused. Loading is not on the hot path: the
// copies are synchronous (the legacy default stream).
#include "model/cuda/weights.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "model/cuda/kernels.h"
#include "ops/rows.h"

namespace pagedattn::model::cuda {

DeviceBuffer WeightUploader::allocate(int64_t bytes) {
  bytes_ += bytes;
  return DeviceBuffer(static_cast<size_t>(bytes));
}

DeviceMatrix WeightUploader::matrix(std::string_view name, std::span<const TensorView* const> parts,
                                    DType dtype) {
  DeviceMatrix result;
  result.dtype = dtype;
  for (const TensorView* part : parts) {
    PA_CHECK(part->ndim == 2 && part->strides[1] == 1 && part->strides[0] >= part->shape[1],
             "{}: shape {} (expected a 2-D [rows, cols] view with unit inner stride)", name,
             part->shape_str());
    PA_CHECK(part->device.type == DeviceType::kCPU, "{}: on {} (expected the host mapping)", name,
             part->device.str());
    PA_CHECK(
        part->dtype == DType::kF32 || part->dtype == DType::kF16 || part->dtype == DType::kBF16,
        "{}: dtype {} (expected f32, f16 or bf16)", name, dtype_name(part->dtype));
    PA_CHECK(result.cols == 0 || part->shape[1] == result.cols,
             "{}: parts of {} and {} columns (expected equal)", name, result.cols, part->shape[1]);
    result.cols = part->shape[1];
    result.rows += part->shape[0];
  }
  PA_CHECK(result.rows > 0 && result.cols > 0, "{}: empty weight", name);
  const int64_t elem = dtype_size(dtype);
  result.buffer = allocate(result.rows * result.cols * elem);
  int64_t row = 0;
  for (const TensorView* part : parts) {
    const int64_t rows = part->shape[0], cols = part->shape[1];
    const int64_t part_elem = dtype_size(part->dtype);
    char* destination = result.buffer.as<char>() + row * cols * elem;
    if (part->dtype == dtype) {
      PA_CUDA_CHECK(cudaMemcpy2D(destination, static_cast<size_t>(cols * elem), part->data,
                                 static_cast<size_t>(part->strides[0] * part_elem),
                                 static_cast<size_t>(cols * elem), static_cast<size_t>(rows),
                                 cudaMemcpyHostToDevice));
    } else {
      const int64_t raw = rows * cols * part_elem;
      if (static_cast<int64_t>(staging_.bytes()) < raw) staging_ = DeviceBuffer(raw);
      PA_CUDA_CHECK(cudaMemcpy2D(staging_.data(), static_cast<size_t>(cols * part_elem), part->data,
                                 static_cast<size_t>(part->strides[0] * part_elem),
                                 static_cast<size_t>(cols * part_elem), static_cast<size_t>(rows),
                                 cudaMemcpyHostToDevice));
      convert_rows(staging_.data(), part->dtype, cols, destination, dtype, cols, rows, cols,
                   nullptr);
      PA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    row += rows;
  }
  return result;
}

DeviceLinear WeightUploader::linear(std::string_view name,
                                    std::initializer_list<const LinearWeights*> parts) {
  DeviceLinear result;
  std::vector<const TensorView*> weights;
  bool any_bias = false;
  for (const LinearWeights* part : parts) {
    PA_CHECK(part->weight.defined(), "{}: a part without a weight", name);
    weights.push_back(&part->weight);
    any_bias = any_bias || part->bias.defined();
  }
  result.weight = matrix(name, weights, compute_);
  if (any_bias) {
    std::vector<float> bias;
    for (const LinearWeights* part : parts) {
      const int64_t rows = part->weight.shape[0];
      if (part->bias.defined()) {
        const std::vector<float> b = ops::detail::weight_vector(name, part->bias, rows);
        bias.insert(bias.end(), b.begin(), b.end());
      } else {
        bias.insert(bias.end(), static_cast<size_t>(rows), 0.0f);
      }
    }
    result.bias = floats(bias.data(), static_cast<int64_t>(bias.size()));
  }
  return result;
}

void WeightUploader::interleave_pairs(std::string_view name, DeviceMatrix& gate_up, int64_t block) {
  const int64_t half = gate_up.rows / 2;
  PA_CHECK(block > 0 && gate_up.rows % 2 == 0 && half % block == 0,
           "{}: {} rows in pairs of blocks of {} (expected an even row count whose half the block "
           "divides)",
           name, gate_up.rows, block);
  const size_t block_bytes = static_cast<size_t>(block * gate_up.cols * dtype_size(gate_up.dtype));
  DeviceBuffer interleaved(gate_up.buffer.bytes());
  const char* source = gate_up.buffer.as<const char>();
  const size_t half_bytes = static_cast<size_t>(half / block) * block_bytes;
  for (int part = 0; part < 2; ++part) {  // gates into even blocks, ups into odd ones
    PA_CUDA_CHECK(cudaMemcpy2D(interleaved.as<char>() + part * block_bytes, 2 * block_bytes,
                               source + part * half_bytes, block_bytes, block_bytes,
                               static_cast<size_t>(half / block), cudaMemcpyDeviceToDevice));
  }
  gate_up.buffer = std::move(interleaved);
}

DeviceBuffer WeightUploader::vector(std::string_view name, const TensorView& weight, int64_t size) {
  const std::vector<float> values = ops::detail::weight_vector(name, weight, size);
  return floats(values.data(), size);
}

DeviceBuffer WeightUploader::floats(const float* values, int64_t count) {
  DeviceBuffer buffer = allocate(count * static_cast<int64_t>(sizeof(float)));
  PA_CUDA_CHECK(cudaMemcpy(buffer.data(), values, static_cast<size_t>(count) * sizeof(float),
                           cudaMemcpyHostToDevice));
  return buffer;
}

}  // namespace pagedattn::model::cuda
