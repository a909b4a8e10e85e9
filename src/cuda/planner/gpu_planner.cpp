// The GPU planner's host API (include/pagedattn/cuda_planner.h): argument checks with errors that
// name the argument, then the kernels of planner_kernels.cu; read_plan_status() turns the device
// status word into an Error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/planner/planner_kernels.h"
#include "cuda/workspace.h"
#include "pagedattn/cuda_planner.h"

namespace pagedattn::cuda {
namespace {

void check_i32(std::string_view name, const TensorView& view, int64_t min_elements) {
  check_tensor(name, view, {kAnySize}, DType::kI32, view.device);
  PA_CHECK(view.device.type == DeviceType::kCUDA, "{}: on {}, expected a CUDA device", name,
           view.device.str());
  PA_CHECK(view.strides[0] == 1 || view.shape[0] <= 1, "{}: stride {}, expected contiguous", name,
           view.strides[0]);
  PA_CHECK(view.shape[0] >= min_elements, "{}: {} entries, expected at least {}", name,
           view.shape[0], min_elements);
}

}  // namespace

void split_kv_on_device(const TensorView& kv_indptr, int32_t batch, const SplitKvConfig& config,
                        const DeviceSplitKvBuffers& buffers, void* stream) {
  PA_CHECK(batch >= 0, "split_kv_on_device: batch = {}, expected >= 0", batch);
  check_i32("kv_indptr", kv_indptr, int64_t{batch} + 1);
  check_i32("merge_indptr", buffers.merge_indptr, int64_t{batch} + 1);
  check_i32("info", buffers.info, 4);
  const int64_t capacity = std::min(buffers.work_request.shape[0], buffers.work_chunk.shape[0]);
  check_i32("work_request", buffers.work_request, 0);
  check_i32("work_chunk", buffers.work_chunk, 0);
  PA_CHECK(config.min_chunk_pages >= 1, "split_kv_on_device: min_chunk_pages = {}, expected >= 1",
           config.min_chunk_pages);
  launch_split_kv(kv_indptr.data_as<const int32_t>(), batch, config,
                  buffers.work_request.data_as<int32_t>(), buffers.work_chunk.data_as<int32_t>(),
                  capacity, buffers.merge_indptr.data_as<int32_t>(),
                  reinterpret_cast<PlanInfo*>(buffers.info.data), stream);
}

void plan_on_device(const DevicePlanInput& input, const DevicePlanBuffers& buffers, void* stream) {
  const int32_t num_reqs = input.num_reqs;
  PA_CHECK(num_reqs >= 0, "plan_on_device: num_reqs = {}, expected >= 0", num_reqs);
  PA_CHECK(input.alloc_page_size >= 1, "plan_on_device: alloc_page_size = {}, expected >= 1",
           input.alloc_page_size);
  PA_CHECK(input.page_size >= 1 && input.alloc_page_size % input.page_size == 0,
           "plan_on_device: page_size (P) = {} does not divide alloc_page_size = {}",
           input.page_size, input.alloc_page_size);
  PA_CHECK(input.padded_batch == 0 || input.padded_batch >= num_reqs,
           "plan_on_device: padded_batch = {} is smaller than num_reqs = {}", input.padded_batch,
           num_reqs);
  const int32_t ratio = input.alloc_page_size / input.page_size;
  PA_CHECK(input.num_alloc_pages >= 0 && input.num_alloc_pages * ratio <= INT32_MAX,
           "plan_on_device: num_alloc_pages = {} x {} attention pages each exceeds the int32 "
           "page ids",
           input.num_alloc_pages, ratio);
  const int32_t batch = input.padded_batch > 0 ? input.padded_batch : num_reqs;
  const char* table_name = input.slot_table ? "slots" : "block_table";
  check_tensor(table_name, input.table, {num_reqs, kAnySize}, DType::kI32, input.table.device);
  PA_CHECK(input.table.device.type == DeviceType::kCUDA, "{}: on {}, expected a CUDA device",
           table_name, input.table.device.str());
  PA_CHECK(input.table.strides[1] == 1 || input.table.shape[1] <= 1,
           "{}: inner stride {}, expected 1", table_name, input.table.strides[1]);
  check_i32("seq_lens", input.seq_lens, num_reqs);
  const bool prefill = input.q_lens.defined();
  if (prefill) check_i32("q_lens", input.q_lens, num_reqs);
  check_i32("qo_indptr", buffers.qo_indptr, int64_t{batch} + 1);
  check_i32("kv_indptr", buffers.kv_indptr, int64_t{batch} + 1);
  check_i32("kv_last_page_len", buffers.kv_last_page_len, batch);
  check_i32("kv_lens", buffers.kv_lens, batch);
  check_i32("kv_indices", buffers.kv_indices, 0);
  check_i32("status", buffers.status, 4);
  const int64_t row_stride = input.table.strides[0];
  const int64_t row_len = input.table.shape[1];
  const int64_t tokens_per_row = input.slot_table ? row_len : row_len * input.alloc_page_size;

  auto cuda_stream = static_cast<cudaStream_t>(stream);
  int32_t* status = buffers.status.data_as<int32_t>();
  PA_CUDA_CHECK(cudaMemsetAsync(status, 0, 4 * sizeof(int32_t), cuda_stream));
  LengthsParams lengths{input.seq_lens.data_as<const int32_t>(),
                        prefill ? input.q_lens.data_as<const int32_t>() : nullptr,
                        num_reqs,
                        batch,
                        input.page_size,
                        tokens_per_row,
                        buffers.kv_indices.shape[0],
                        buffers.qo_indptr.data_as<int32_t>(),
                        buffers.kv_indptr.data_as<int32_t>(),
                        buffers.kv_last_page_len.data_as<int32_t>(),
                        buffers.kv_lens.data_as<int32_t>(),
                        status};
  launch_plan_lengths(lengths, stream);
  IndicesParams indices{input.table.data_as<const int32_t>(),
                        row_stride,
                        input.slot_table,
                        input.validate,
                        input.alloc_page_size,
                        ratio,
                        input.num_alloc_pages,
                        buffers.kv_indptr.data_as<const int32_t>(),
                        buffers.kv_lens.data_as<const int32_t>(),
                        buffers.kv_indices.data_as<int32_t>(),
                        status};
  launch_plan_indices(indices, num_reqs, stream);
}

void read_plan_status(const TensorView& status, void* stream) {
  check_i32("status", status, 4);
  int32_t host[4] = {};
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  PA_CUDA_CHECK(
      cudaMemcpyAsync(host, status.data, sizeof(host), cudaMemcpyDeviceToHost, cuda_stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  const int32_t request = host[1], position = host[2], value = host[3];
  switch (host[0]) {
    case kPlanOk:
      return;
    case kSeqLenOutOfRange:
      PA_FAIL("plan_on_device: seq_lens[{}] = {} does not fit the table row", request, value);
    case kQLenOutOfRange:
      PA_FAIL("plan_on_device: q_lens[{}] = {}, expected 0 <= q_len <= seq_len", request, value);
    case kBlockPageOutOfRange:
      PA_FAIL("plan_on_device: block_table[{}][{}] = {}: page id out of range", request, position,
              value);
    case kSlotUnaligned:
      PA_FAIL(
          "plan_on_device: slots[{}][{}] = {}: starts an allocation page, expected a "
          "non-negative multiple of alloc_page_size",
          request, position, value);
    case kSlotPageOutOfRange:
      PA_FAIL("plan_on_device: slots[{}][{}] = {}: page out of range", request, position, value);
    case kSlotRunBroken:
      PA_FAIL(
          "plan_on_device: slots[{}][{}] = {}: the slots of one allocation page must be "
          "contiguous",
          request, position, value);
    case kIndicesTooSmall:
      PA_FAIL("plan_on_device: kv_indices too small: the batch has {} attention pages", value);
    default:
      PA_FAIL("plan_on_device: unknown status code {}", host[0]);
  }
}

}  // namespace pagedattn::cuda
