// The demo's device mirror (see demo_device.h): cudaMalloc'd buffers sized once, page uploads of
// what the host wrote, per-batch uploads of q and metadata, downloads of out and lse.
#include "tools/demo/demo_device.h"

#include "core/check.h"

#ifdef PAGEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#endif

namespace pagedattn::tools::demo {

#ifdef PAGEDATTN_WITH_CUDA

namespace {

// One device allocation, freed on destruction.
class DeviceAllocation {
 public:
  explicit DeviceAllocation(int64_t bytes) {
    PA_CUDA_CHECK(cudaMalloc(&data_, static_cast<size_t>(bytes > 0 ? bytes : 64)));
  }
  ~DeviceAllocation() { cudaFree(data_); }
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

TensorView on_device(TensorView view, void* data) {
  view.data = data;
  view.device = Device::cuda(0);
  return view;
}

}  // namespace

struct DeviceMirror::Buffers {
  Buffers(int64_t cache_bytes, int64_t max_rows, int64_t row_elements, int32_t max_batch,
          int64_t max_indices)
      : k(cache_bytes),
        v(cache_bytes),
        q(max_rows * row_elements * 2),
        out(max_rows * row_elements * 2),
        lse(max_rows * row_elements * 4),
        qo_indptr((max_batch + 1) * 4),
        kv_indptr((max_batch + 1) * 4),
        kv_indices(max_indices * 4),
        kv_last_page_len(max_batch * 4) {}
  DeviceAllocation k, v, q, out, lse, qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

DeviceMirror::DeviceMirror(const HostKvCache& cache, int64_t max_rows, int64_t row_elements,
                           int32_t max_batch, int64_t max_indices)
    : cache_(cache) {
  const PagedKv host = cache.paged(cache.config().alloc_page_size);
  const int64_t bytes = host.k.numel() * dtype_size(host.k.dtype);
  buffers_ = std::make_unique<Buffers>(bytes, max_rows, row_elements, max_batch, max_indices);
  // The whole pool once; afterwards only what the host writes.
  PA_CUDA_CHECK(cudaMemcpy(buffers_->k.get(), host.k.data, bytes, cudaMemcpyHostToDevice));
  PA_CUDA_CHECK(cudaMemcpy(buffers_->v.get(), host.v.data, bytes, cudaMemcpyHostToDevice));
}

DeviceMirror::~DeviceMirror() = default;

PagedKv DeviceMirror::sync(int32_t page_size) {
  const PagedKv host = cache_.paged(page_size);
  const int64_t page_bytes = host.k.strides[0] * dtype_size(host.k.dtype);
  for (const int32_t page : dirty_) {
    const int64_t offset = page * page_bytes;
    PA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(buffers_->k.get()) + offset,
                             static_cast<const char*>(host.k.data) + offset, page_bytes,
                             cudaMemcpyHostToDevice));
    PA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(buffers_->v.get()) + offset,
                             static_cast<const char*>(host.v.data) + offset, page_bytes,
                             cudaMemcpyHostToDevice));
  }
  dirty_.clear();
  PagedKv device = host;
  device.k = on_device(host.k, buffers_->k.get());
  device.v = on_device(host.v, buffers_->v.get());
  return device;
}

TensorView DeviceMirror::upload_q(const TensorView& host_q) {
  PA_CUDA_CHECK(cudaMemcpy(buffers_->q.get(), host_q.data,
                           host_q.numel() * dtype_size(host_q.dtype), cudaMemcpyHostToDevice));
  return on_device(host_q, buffers_->q.get());
}

StepMetadata DeviceMirror::upload_metadata(const StepMetadata& host) {
  StepMetadata device = host;
  const auto upload = [](const TensorView& view, const DeviceAllocation& to) {
    PA_CUDA_CHECK(cudaMemcpy(to.get(), view.data, view.numel() * 4, cudaMemcpyHostToDevice));
    return on_device(view, to.get());
  };
  device.qo_indptr = upload(host.qo_indptr, buffers_->qo_indptr);
  device.kv_indptr = upload(host.kv_indptr, buffers_->kv_indptr);
  device.kv_indices = upload(host.kv_indices, buffers_->kv_indices);
  device.kv_last_page_len = upload(host.kv_last_page_len, buffers_->kv_last_page_len);
  return device;
}

void DeviceMirror::poisoned_outputs(int64_t rows, int64_t heads, TensorView* out, TensorView* lse) {
  const int64_t dim = cache_.config().head_dim;
  *out = TensorView::contiguous(buffers_->out.get(), DType::kBF16, {rows, heads, dim},
                                Device::cuda(0));
  *lse = TensorView::contiguous(buffers_->lse.get(), DType::kF32, {rows, heads}, Device::cuda(0));
  PA_CUDA_CHECK(cudaMemset(out->data, 0xff, rows * heads * dim * 2));
  PA_CUDA_CHECK(cudaMemset(lse->data, 0xff, rows * heads * 4));
}

void DeviceMirror::download(const TensorView& out, const TensorView& lse,
                            const TensorView& host_out, const TensorView& host_lse) {
  synchronize();
  PA_CUDA_CHECK(cudaMemcpy(host_out.data, out.data, out.numel() * 2, cudaMemcpyDeviceToHost));
  PA_CUDA_CHECK(cudaMemcpy(host_lse.data, lse.data, lse.numel() * 4, cudaMemcpyDeviceToHost));
}

void DeviceMirror::synchronize() { PA_CUDA_CHECK(cudaDeviceSynchronize()); }

#else  // !PAGEDATTN_WITH_CUDA

struct DeviceMirror::Buffers {};

DeviceMirror::DeviceMirror(const HostKvCache& cache, int64_t, int64_t, int32_t, int64_t)
    : cache_(cache) {
  PA_FAIL("demo: a CUDA backend was selected but pagedattn was built without CUDA");
}
DeviceMirror::~DeviceMirror() = default;
PagedKv DeviceMirror::sync(int32_t) { PA_FAIL("demo: built without CUDA"); }
TensorView DeviceMirror::upload_q(const TensorView&) { PA_FAIL("demo: built without CUDA"); }
StepMetadata DeviceMirror::upload_metadata(const StepMetadata&) {
  PA_FAIL("demo: built without CUDA");
}
void DeviceMirror::poisoned_outputs(int64_t, int64_t, TensorView*, TensorView*) {
  PA_FAIL("demo: built without CUDA");
}
void DeviceMirror::download(const TensorView&, const TensorView&, const TensorView&,
                            const TensorView&) {
  PA_FAIL("demo: built without CUDA");
}
void DeviceMirror::synchronize() {}

#endif

}  // namespace pagedattn::tools::demo
