// The model's KV pool: one cache per layer, sized by a page count or a byte budget (see
// model.h). GQA layers hold K and V [pages, alloc, Hkv, D]; MLA layers one latent buffer
// [pages, alloc, kv_lora_rank + qk_rope_head_dim] whose ckv / kpe views are slices of each row
// (kv_cache.h's HostMlaCache), the 576-wide layout of DeepSeek's real dimensions. On the host
// each layer owns its HostKvCache / HostMlaCache; on a CUDA device one zeroed allocation holds
// every layer (layer after layer, K then V), with the same shapes and strides.
#include <atomic>
#include <cmath>
#include <utility>

#include "core/check.h"
#include "pagedattn/model.h"
#ifdef PAGEDATTN_WITH_CUDA
#include "model/cuda/cuda_model.h"
#endif

namespace pagedattn::model {
#ifdef PAGEDATTN_WITH_CUDA
namespace {

// A contiguous view of `shape` at byte `offset` of a device allocation.
TensorView device_view(void* base, int64_t& offset, DType dtype, Device device,
                       std::initializer_list<int64_t> shape) {
  TensorView view = TensorView::contiguous(static_cast<char*>(base) + offset, dtype, shape, device);
  // 256-byte alignment for every layer's buffer (the kernels' vector loads need 16).
  offset += (view.numel() * dtype_size(dtype) + 255) / 256 * 256;
  return view;
}

}  // namespace
#endif

int64_t KvPool::bytes_per_page(const ModelConfig& config, int32_t alloc_page_size, DType dtype) {
  const int64_t per_token = config.is_mla()
                                ? config.mla->kv_lora_rank + config.mla->qk_rope_head_dim
                                : 2 * config.num_key_value_heads * config.head_dim;
  return per_token * alloc_page_size * dtype_size(dtype) * config.num_hidden_layers;
}

KvPool::KvPool(const ModelConfig& config, const KvPoolConfig& pool) : config_(pool) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
  PA_CHECK(config_.alloc_page_size >= 1, "kv pool: alloc_page_size {} (expected >= 1)",
           config_.alloc_page_size);
  if (config_.page_size == 0) config_.page_size = config_.alloc_page_size;
  PA_CHECK(config_.page_size >= 1 && config_.alloc_page_size % config_.page_size == 0,
           "kv pool: page_size {} does not divide alloc_page_size {}", config_.page_size,
           config_.alloc_page_size);
  PA_CHECK(config_.dtype == DType::kF32 || config_.dtype == DType::kBF16 ||
               config_.dtype == DType::kF16 || config_.dtype == DType::kFP8E4M3,
           "kv pool: dtype {} (expected f32, f16, bf16 or fp8_e4m3)", dtype_name(config_.dtype));
  for (const auto& [name, scale] : {std::pair{"k_scale", config_.k_scale},
                                    std::pair{"v_scale", config_.v_scale}}) {
    PA_CHECK(std::isfinite(scale) && scale > 0.0f, "kv pool: {} {} (expected finite and > 0)",
             name, scale);
    PA_CHECK(config_.dtype == DType::kFP8E4M3 || scale == 1.0f,
             "kv pool: {} {} with a {} pool (scales apply to fp8_e4m3 pools; expected 1)", name,
             scale, dtype_name(config_.dtype));
  }
  const int64_t page_bytes = bytes_per_page(config, config_.alloc_page_size, config_.dtype);
  if (config_.num_pages <= 0) {
    PA_CHECK(config_.byte_budget >= page_bytes,
             "kv pool: neither num_pages nor a byte_budget of at least one page ({} bytes) given "
             "(byte_budget {})",
             page_bytes, config_.byte_budget);
    config_.num_pages = config_.byte_budget / page_bytes;
  }
  mla_ = config.is_mla();
  if (config_.device.type == DeviceType::kCUDA) {
    make_device_caches(config);
    return;
  }
  PA_CHECK(config_.device.type == DeviceType::kCPU, "kv pool: device {} (expected cpu or cuda)",
           config_.device.str());
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.is_mla()) {
      MlaCacheConfig c;
      c.num_pages = config_.num_pages;
      c.alloc_page_size = config_.alloc_page_size;
      c.kv_lora_rank = static_cast<int32_t>(config.mla->kv_lora_rank);
      c.rope_dim = static_cast<int32_t>(config.mla->qk_rope_head_dim);
      c.dtype = config_.dtype;
      latent_.emplace_back(c);
    } else {
      KvCacheConfig c;
      c.num_pages = config_.num_pages;
      c.alloc_page_size = config_.alloc_page_size;
      c.num_kv_heads = static_cast<int32_t>(config.num_key_value_heads);
      c.head_dim = static_cast<int32_t>(config.head_dim);
      c.layout = config_.layout;
      c.dtype = config_.dtype;
      kv_.emplace_back(c);
    }
  }
}

void KvPool::make_device_caches(const ModelConfig& config) {
#ifdef PAGEDATTN_WITH_CUDA
  const int64_t pages = config_.num_pages, alloc = config_.alloc_page_size;
  const DType dtype = config_.dtype;
  const int64_t layer_bytes =
      bytes_per_page(config, config_.alloc_page_size, dtype) / config.num_hidden_layers * pages +
      2 * 256;
  device_memory_ = cuda::allocate_device_memory(layer_bytes * config.num_hidden_layers,
                                                config_.device, "kv pool");
  device_bytes_ = bytes_per_page(config, config_.alloc_page_size, dtype) * pages;
  int64_t offset = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (mla_) {
      const int64_t rank = config.mla->kv_lora_rank, rope = config.mla->qk_rope_head_dim;
      const TensorView latent = device_view(device_memory_.get(), offset, dtype, config_.device,
                                            {pages, alloc, rank + rope});
      PagedLatent cache;
      cache.ckv = latent;
      cache.ckv.shape[2] = rank;
      cache.kpe = latent;
      cache.kpe.shape[2] = rope;
      cache.kpe.data = static_cast<char*>(latent.data) + rank * dtype_size(dtype);
      cache.page_size = config_.page_size;
      cache.scale = config_.k_scale;
      device_latent_.push_back(cache);
    } else {
      const int64_t heads = config.num_key_value_heads, dim = config.head_dim;
      PagedKv cache;
      cache.layout = config_.layout;
      const bool nhd = config_.layout == KvLayout::kNHD;
      for (TensorView* view : {&cache.k, &cache.v}) {
        *view = nhd ? device_view(device_memory_.get(), offset, dtype, config_.device,
                                  {pages, alloc, heads, dim})
                    : device_view(device_memory_.get(), offset, dtype, config_.device,
                                  {pages, heads, alloc, dim});
      }
      cache.page_size = config_.page_size;
      cache.k_scale = config_.k_scale;
      cache.v_scale = config_.v_scale;
      device_kv_.push_back(cache);
    }
  }
#else
  (void)config;
  PA_FAIL("kv pool: device {} needs pagedattn built with CUDA (configure with -DPAGEDATTN_CUDA=ON)",
          config_.device.str());
#endif
}

int64_t KvPool::num_layers() const {
  if (config_.device.type == DeviceType::kCUDA) {
    return static_cast<int64_t>(mla_ ? device_latent_.size() : device_kv_.size());
  }
  return static_cast<int64_t>(mla_ ? latent_.size() : kv_.size());
}

int64_t KvPool::bytes() const {
  if (config_.device.type == DeviceType::kCUDA) return device_bytes_;
  int64_t total = 0;
  for (const HostKvCache& c : kv_) {
    total += 2 * c.config().num_pages * c.config().alloc_page_size * c.config().num_kv_heads *
             c.config().head_dim * dtype_size(c.config().dtype);
  }
  for (const HostMlaCache& c : latent_) {
    total += c.config().num_pages * c.config().alloc_page_size *
             (c.config().kv_lora_rank + c.config().rope_dim) * dtype_size(c.config().dtype);
  }
  return total;
}

PagedKv KvPool::layer_kv(int64_t layer) const {
  PA_CHECK(!is_mla() && layer >= 0 && layer < num_layers(),
           "kv pool: no K/V cache for layer {} ({} {} layers)", layer, num_layers(),
           is_mla() ? "latent" : "K/V");
  if (config_.device.type == DeviceType::kCUDA) return device_kv_[static_cast<size_t>(layer)];
  return kv_[static_cast<size_t>(layer)].paged(config_.page_size, config_.k_scale,
                                               config_.v_scale);
}

PagedLatent KvPool::layer_latent(int64_t layer) const {
  PA_CHECK(is_mla() && layer >= 0 && layer < num_layers(),
           "kv pool: no latent cache for layer {} ({} {} layers)", layer, num_layers(),
           is_mla() ? "latent" : "K/V");
  if (config_.device.type == DeviceType::kCUDA) return device_latent_[static_cast<size_t>(layer)];
  return latent_[static_cast<size_t>(layer)].paged(config_.page_size, config_.k_scale);
}

}  // namespace pagedattn::model
