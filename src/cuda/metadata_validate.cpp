// validate_on_host (metadata_validate.h): two copies, each waited for (indptrs and last-page
// lengths, then the page ids they cover), then the host's check.
#include "cuda/metadata_validate.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "cuda/cuda_check.h"

namespace pagedattn::cuda {
namespace {

void check_view(std::string_view name, const TensorView& view, int64_t min_size, Device device) {
  check_tensor(name, view, {kAnySize}, DType::kI32, device);
  PA_CHECK(view.shape[0] >= min_size, "{}: {} entries, expected at least {}", name, view.shape[0],
           min_size);
  PA_CHECK(view.shape[0] <= 1 || view.strides[0] == 1, "{}: stride {}, expected 1 (contiguous)",
           name, view.strides[0]);
}

std::vector<int32_t> copy_ints(const TensorView& view, int64_t count, cudaStream_t stream) {
  std::vector<int32_t> host(static_cast<size_t>(std::max<int64_t>(count, 0)));
  if (!host.empty()) {
    PA_CUDA_CHECK(cudaMemcpyAsync(host.data(), view.data, host.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream));
  }
  return host;
}

}  // namespace

void validate_on_host(const StepMetadata& meta, const MetadataBounds& bounds, bool with_qo,
                      Device device, void* stream_pointer) {
  const auto stream = static_cast<cudaStream_t>(stream_pointer);
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0, "meta.batch_size: {} must be >= 0", batch);
  check_view("meta.kv_indptr", meta.kv_indptr, int64_t{batch} + 1, device);
  check_view("meta.kv_last_page_len", meta.kv_last_page_len, batch, device);
  check_view("meta.kv_indices", meta.kv_indices, 0, device);
  with_qo = with_qo && (meta.qo_indptr.defined() || !bounds.one_row_per_request);
  if (with_qo) check_view("meta.qo_indptr", meta.qo_indptr, int64_t{batch} + 1, device);
  const std::vector<int32_t> kv_indptr = copy_ints(meta.kv_indptr, int64_t{batch} + 1, stream);
  const std::vector<int32_t> last = copy_ints(meta.kv_last_page_len, batch, stream);
  std::vector<int32_t> qo;
  if (with_qo) qo = copy_ints(meta.qo_indptr, int64_t{batch} + 1, stream);
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t num_indices = meta.kv_indices.shape[0];
  // The page ids the requests cover (check_metadata_values names kv_indices' length if short).
  const std::vector<int32_t> kv_indices =
      copy_ints(meta.kv_indices, std::min<int64_t>(num_indices, kv_indptr.back()), stream);
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  MetadataArrays arrays;
  arrays.batch = batch;
  arrays.qo_indptr = qo.empty() ? nullptr : qo.data();
  arrays.kv_indptr = kv_indptr.data();
  arrays.kv_indices = kv_indices.data();
  arrays.num_indices = num_indices;
  arrays.kv_last_page_len = last.data();
  arrays.max_q_len = meta.max_q_len;
  check_metadata_values(arrays, bounds);
}

}  // namespace pagedattn::cuda
