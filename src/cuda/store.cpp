// The device store of new K/V / latent rows into their slots (include/pagedattn/cuda_store.h):
// host checks (shapes, dtypes, devices) with errors naming the argument, then the kernels of
// store_kernels.cu: the slot check (with a status view) and one store launch for both pools.
#include <cuda_runtime_api.h>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/store_kernels.h"
#include "pagedattn/cuda_store.h"

namespace pagedattn::cuda {
namespace {

constexpr std::initializer_list<DType> kInputDTypes = {DType::kF32, DType::kF16, DType::kBF16};

// Checks the slots view and, with a status view, enqueues the slot check.
void prepare_slots(const TensorView& slots, int64_t num_tokens, int64_t num_slots,
                   const TensorView& status, Device device, cudaStream_t stream) {
  check_tensor("slots", slots, {num_tokens}, {DType::kI32, DType::kI64}, device);
  if (!status.defined()) return;
  check_tensor("status", status, {kAnySize}, DType::kI32, device);
  PA_CHECK(status.shape[0] >= 4 && status.strides[0] == 1,
           "status: shape {} stride {}, expected >= 4 contiguous int32", status.shape_str(),
           status.strides[0]);
  auto* word = status.data_as<int32_t>();
  PA_CUDA_CHECK(cudaMemsetAsync(word, 0, 4 * sizeof(int32_t), stream));
  launch_check_slots(slots.data, slots.dtype == DType::kI64, slots.strides[0], num_tokens,
                     num_slots, word, stream);
}

// One pool's part of the store.
StoreRows part_params(const TensorView& pool, int64_t stride_token, int64_t stride_row, float scale,
                      const TensorView& input, int64_t rows) {
  StoreRows p{};
  p.cache = pool.data;
  p.stride_page = pool.strides[0];
  p.stride_token = stride_token;
  p.stride_row = stride_row;
  p.scale = scale;
  p.input = input.data;
  p.input_dtype = input.dtype;
  p.in_stride_token = input.strides[0];
  p.in_stride_row = input.ndim == 3 ? input.strides[1] : 0;
  p.in_stride_elem = input.strides[input.ndim - 1];
  p.rows = rows;
  p.width = pool.shape[pool.ndim - 1];
  return p;
}

// What the parts share: the slots, the allocation pages, the status.
StoreBatch batch_params(int64_t num_alloc_pages, int64_t alloc_page_size, const TensorView& slots,
                        const TensorView& status) {
  StoreBatch b{};
  b.alloc_page_size = alloc_page_size;
  b.num_slots = num_alloc_pages * alloc_page_size;
  b.slots = slots.data;
  b.slots_i64 = slots.dtype == DType::kI64;
  b.slots_stride = slots.strides[0];
  b.status = status.defined() ? status.data_as<const int32_t>() : nullptr;
  return b;
}

}  // namespace

// K and V go in one launch (two parts: they share the slots and the cache dtype), as do ckv and
// kpe below: a decode step stores every layer, and at small batches a launch costs more than the
// copy.
void store_kv(const PagedKv& cache, const TensorView& k_new, const TensorView& v_new,
              const TensorView& slots, void* stream, const TensorView& status) {
  const Device device = cache.k.device;
  PA_CHECK(device.type == DeviceType::kCUDA, "cache.k: on {}, expected a CUDA device",
           device.str());
  cache.validate(device);
  const int64_t heads = cache.num_kv_heads();
  check_tensor("k_new", k_new, {kAnySize, heads, cache.k.shape[3]}, kInputDTypes, device);
  const int64_t num_tokens = k_new.shape[0];
  check_tensor("v_new", v_new, {num_tokens, heads, cache.v.shape[3]}, kInputDTypes, device);
  const int64_t alloc = cache.alloc_page_size();
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  prepare_slots(slots, num_tokens, cache.num_alloc_pages() * alloc, status, device, cuda_stream);
  const bool nhd = cache.layout == KvLayout::kNHD;
  StoreBatch batch = batch_params(cache.num_alloc_pages(), alloc, slots, status);
  batch.num_parts = 2;
  int part = 0;
  for (const auto* pool : {&cache.k, &cache.v}) {
    const bool is_k = pool == &cache.k;
    batch.part[part++] = part_params(
        *pool, nhd ? pool->strides[1] : pool->strides[2], nhd ? pool->strides[2] : pool->strides[1],
        is_k ? cache.k_scale : cache.v_scale, is_k ? k_new : v_new, heads);
  }
  launch_store(cache.k.dtype, batch, num_tokens, cuda_stream);
}

void store_latent(const PagedLatent& cache, const TensorView& ckv_new, const TensorView& kpe_new,
                  const TensorView& slots, void* stream, const TensorView& status) {
  const Device device = cache.ckv.device;
  PA_CHECK(device.type == DeviceType::kCUDA, "cache.ckv: on {}, expected a CUDA device",
           device.str());
  cache.validate(device);
  check_tensor("ckv_new", ckv_new, {kAnySize, cache.kv_lora_rank()}, kInputDTypes, device);
  const int64_t num_tokens = ckv_new.shape[0];
  check_tensor("kpe_new", kpe_new, {num_tokens, cache.rope_dim()}, kInputDTypes, device);
  const int64_t alloc = cache.alloc_page_size();
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  prepare_slots(slots, num_tokens, cache.num_alloc_pages() * alloc, status, device, cuda_stream);
  StoreBatch batch = batch_params(cache.num_alloc_pages(), alloc, slots, status);
  batch.num_parts = 2;
  batch.part[0] = part_params(cache.ckv, cache.ckv.strides[1], 0, cache.scale, ckv_new, 1);
  batch.part[1] = part_params(cache.kpe, cache.kpe.strides[1], 0, cache.scale, kpe_new, 1);
  launch_store(cache.ckv.dtype, batch, num_tokens, cuda_stream);
}

void read_store_status(const TensorView& status, void* stream) {
  check_tensor("status", status, {kAnySize}, DType::kI32, status.device);
  PA_CHECK(status.shape[0] >= 4, "status: {} entries, expected >= 4", status.shape[0]);
  int32_t host[4] = {};
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  PA_CUDA_CHECK(
      cudaMemcpyAsync(host, status.data, sizeof(host), cudaMemcpyDeviceToHost, cuda_stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  if (host[0] == 0) return;
  const int64_t slot = (int64_t{host[2]} << 32) | static_cast<uint32_t>(host[3]);
  PA_FAIL(
      "store: slots[{}] = {} is out of range (expected < pages x alloc_page_size, or "
      "negative to skip)",
      host[1], slot);
}

}  // namespace pagedattn::cuda
