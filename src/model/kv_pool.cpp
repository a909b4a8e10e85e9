// The model's KV pool: one host cache per layer, sized by a page count or a byte budget (see
// model.h). GQA layers hold K and V [pages, alloc, Hkv, D]; MLA layers one latent buffer
// [pages, alloc, kv_lora_rank + qk_rope_head_dim] whose ckv / kpe views are slices of each row
// (kv_cache.h's HostMlaCache), the 576-wide layout of DeepSeek's real dimensions.
#include "core/check.h"
#include "pagedattn/model.h"

namespace pagedattn::model {

int64_t KvPool::bytes_per_page(const ModelConfig& config, int32_t alloc_page_size, DType dtype) {
  const int64_t per_token = config.is_mla()
                                ? config.mla->kv_lora_rank + config.mla->qk_rope_head_dim
                                : 2 * config.num_key_value_heads * config.head_dim;
  return per_token * alloc_page_size * dtype_size(dtype) * config.num_hidden_layers;
}

KvPool::KvPool(const ModelConfig& config, const KvPoolConfig& pool) : config_(pool) {
  PA_CHECK(config_.alloc_page_size >= 1, "kv pool: alloc_page_size {} (expected >= 1)",
           config_.alloc_page_size);
  if (config_.page_size == 0) config_.page_size = config_.alloc_page_size;
  PA_CHECK(config_.page_size >= 1 && config_.alloc_page_size % config_.page_size == 0,
           "kv pool: page_size {} does not divide alloc_page_size {}", config_.page_size,
           config_.alloc_page_size);
  PA_CHECK(
      config_.dtype == DType::kF32 || config_.dtype == DType::kBF16 || config_.dtype == DType::kF16,
      "kv pool: dtype {} (expected f32, f16 or bf16; fp8 needs scales the model does not "
      "compute yet)",
      dtype_name(config_.dtype));
  const int64_t page_bytes = bytes_per_page(config, config_.alloc_page_size, config_.dtype);
  if (config_.num_pages <= 0) {
    PA_CHECK(config_.byte_budget >= page_bytes,
             "kv pool: neither num_pages nor a byte_budget of at least one page ({} bytes) given "
             "(byte_budget {})",
             page_bytes, config_.byte_budget);
    config_.num_pages = config_.byte_budget / page_bytes;
  }
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

int64_t KvPool::num_layers() const {
  return static_cast<int64_t>(is_mla() ? latent_.size() : kv_.size());
}

int64_t KvPool::bytes() const {
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
  return kv_[static_cast<size_t>(layer)].paged(config_.page_size);
}

PagedLatent KvPool::layer_latent(int64_t layer) const {
  PA_CHECK(is_mla() && layer >= 0 && layer < num_layers(),
           "kv pool: no latent cache for layer {} ({} {} layers)", layer, num_layers(),
           is_mla() ? "latent" : "K/V");
  return latent_[static_cast<size_t>(layer)].paged(config_.page_size);
}

}  // namespace pagedattn::model
