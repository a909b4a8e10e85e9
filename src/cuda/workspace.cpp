// CudaWorkspace: allocates the fixed device buffers described in workspace.h, once.
//
// Sizes: the split rule (planner.h) gives at most target_items + batch items, and the decode
// target is at most num_sms * kDecodeCtasPerSm / (CTAs per item) <= num_sms * kDecodeCtasPerSm, so
// max_items = num_sms * kDecodeCtasPerSm + max_batch bounds every plan. Partial outputs are
// [max_items, max_qo_heads, max_head_dim] f32 (at least a 64 MiB floor shared with prefill).
#include "cuda/workspace.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_params.h"
#include "cuda/fault_log.h"
#include "cuda/mla/config.h"

namespace pagedattn::cuda {

void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  PA_FAIL("CUDA error in {} ({}:{}): {} ({})", what, file, line, cudaGetErrorString(status),
          cudaGetErrorName(status));
}

void check_launch(const char* kernel_name) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    PA_FAIL("CUDA kernel {} failed to launch: {} ({})", kernel_name, cudaGetErrorString(status),
            cudaGetErrorName(status));
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) PA_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

CudaWorkspace::CudaWorkspace(const WorkspaceLimits& limits) : limits_(limits) {
  PA_CHECK(limits.max_batch > 0, "WorkspaceLimits.max_batch: {} (expected > 0)", limits.max_batch);
  PA_CHECK(limits.max_qo_heads > 0, "WorkspaceLimits.max_qo_heads: {} (expected > 0)",
           limits.max_qo_heads);
  PA_CHECK(limits.max_head_dim > 0, "WorkspaceLimits.max_head_dim: {} (expected > 0)",
           limits.max_head_dim);
  PA_CUDA_CHECK(cudaGetDevice(&device_));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  max_items_ = num_sms_ * kDecodeCtasPerSm + limits.max_batch;
  const auto i32 = sizeof(int32_t);
  work_request_ = DeviceBuffer(i32 * max_items_);
  work_chunk_ = DeviceBuffer(i32 * max_items_);
  merge_indptr_ = DeviceBuffer(i32 * (limits.max_batch + 1));
  info_ = DeviceBuffer(sizeof(PlanInfo));
  PA_CUDA_CHECK(cudaMemset(info_.data(), 0, sizeof(PlanInfo)));
  constexpr int64_t kFloorFloats = int64_t{16} << 20;  // 64 MiB
  partial_out_capacity_ = std::max<int64_t>(
      kFloorFloats, int64_t{max_items_} * limits.max_qo_heads * limits.max_head_dim);
  partial_lse_capacity_ =
      std::max<int64_t>(kFloorFloats / 64, int64_t{max_items_} * limits.max_qo_heads);
  partial_out_ = DeviceBuffer(sizeof(float) * partial_out_capacity_);
  partial_lse_ = DeviceBuffer(sizeof(float) * partial_lse_capacity_);
  scratch_ = DeviceBuffer(size_t{64} << 20);
  merge_counters_capacity_ = int64_t{limits.max_batch} * limits.max_qo_heads;
  merge_counters_ = DeviceBuffer(sizeof(int32_t) * merge_counters_capacity_);
  PA_CUDA_CHECK(cudaMemset(merge_counters_.data(), 0, merge_counters_.bytes()));
  prefill_unit_counters_ = DeviceBuffer(sizeof(int32_t) * 2);
  PA_CUDA_CHECK(cudaMemset(prefill_unit_counters_.data(), 0, prefill_unit_counters_.bytes()));
  faults_ = std::make_unique<FaultLog>();
}

CudaWorkspace::~CudaWorkspace() = default;

MetadataGuard CudaWorkspace::guard(OpKind op) const { return faults_->guard(op); }

void CudaWorkspace::check_device_errors() { faults_->check(); }

int32_t decode_split_target(int32_t num_sms, int32_t num_qo_heads, int32_t num_kv_heads,
                            int32_t batch) {
  const int32_t kv_heads = std::max(1, num_kv_heads);
  const int32_t group = std::max(1, num_qo_heads / kv_heads);
  const int32_t ctas_per_item =
      kv_heads * ((group + kDecodeMaxGroupPerCta - 1) / kDecodeMaxGroupPerCta);
  const int32_t slots = std::max(1, num_sms * kDecodeCtasPerSm / ctas_per_item);
  return batch > 0 && batch < slots ? slots / batch * batch : slots;
}

MlaShape mla_launch_shape(const MlaCapacity& capacity, int32_t heads, int32_t page_size,
                          int32_t batch, int64_t max_q_len) {
  MlaShape shape;
  shape.partial_rows = max_q_len * heads;
  shape.block_rows = shape.partial_rows <= mla::kSmallBlockM ? mla::kSmallBlockM : mla::kBlockM;
  shape.row_blocks = (shape.partial_rows + shape.block_rows - 1) / shape.block_rows;
  const int64_t ctas_per_request = std::max<int64_t>(
      1, capacity.num_sms / std::max<int64_t>(1, shape.row_blocks * batch));
  // A cluster replaces the split of a request only where it takes all of the request's CTAs.
  if (shape.block_rows == mla::kSmallBlockM && ctas_per_request <= capacity.max_cluster &&
      std::has_single_bit(static_cast<uint64_t>(ctas_per_request))) {
    shape.cluster = static_cast<int>(ctas_per_request);
  }
  shape.config.enable = true;
  shape.config.target_items = static_cast<int32_t>(
      std::min<int64_t>(INT32_MAX, ctas_per_request / shape.cluster * std::max(1, batch)));
  shape.config.min_chunk_pages = std::max(1, 128 * shape.cluster / std::max(1, page_size));
  shape.grid_items =
      std::min<int64_t>(capacity.max_items, int64_t{batch} + shape.config.target_items);
  if (shape.grid_items * shape.partial_rows * mla::kRank > capacity.partial_out ||
      shape.grid_items * shape.partial_rows > capacity.partial_lse) {
    shape.config.enable = false;
    shape.grid_items = batch;
  }
  return shape;
}

SplitKvConfig CudaWorkspace::split_config(const OpDesc& op, int32_t batch) const {
  SplitKvConfig config;
  config.enable = true;
  config.target_items = decode_split_target(num_sms_, op.num_qo_heads, op.num_kv_heads, batch);
  // The smallest chunk, 64 tokens: at B 1 x 1024 (8 KV heads) it gives 16 chunks a head where
  // 256 gave 4, and the CUDA-graph step of 32 layers went from 453 to 317 us (H100, 2026-12-06;
  // 128: 348 us); B 8 x 1024 and B 64 x 1024 moved by under 3%.
  constexpr int min_chunk_tokens = 64;
  config.min_chunk_pages = std::max(1, min_chunk_tokens / std::max(1, op.page_size));
  return config;
}

void CudaWorkspace::enable_decode_trace(int32_t launches) {
  PA_CHECK(launches >= 1, "enable_decode_trace: {} launches (expected >= 1)", launches);
  const size_t bytes = sizeof(uint64_t) * kDecodeTraceWords * decode_trace_ctas() * launches;
  decode_trace_ = DeviceBuffer(bytes);
  PA_CUDA_CHECK(cudaMemset(decode_trace_.data(), 0, bytes));
  decode_trace_launches_ = launches;
}

unsigned long long* CudaWorkspace::decode_trace(int64_t index) const {
  if (index < 0 || index >= decode_trace_launches_) return nullptr;
  return static_cast<unsigned long long*>(decode_trace_.data()) +
         index * decode_trace_ctas() * kDecodeTraceWords;
}

PartitionView CudaWorkspace::partition() const {
  return PartitionView{work_request(), work_chunk(), merge_indptr(), info(), max_items_};
}

}  // namespace pagedattn::cuda
