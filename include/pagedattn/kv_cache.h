// One layer's paged KV cache as the attention operations see it, and the host-side pools.
//
// The engine cuts each layer's pool into allocation pages of `alloc_page_size` tokens. Layouts:
//   MHA/GQA, NHD: k, v [num_alloc_pages, alloc_page_size, num_kv_heads, head_dim]
//   MHA/GQA, HND: k, v [num_alloc_pages, num_kv_heads, alloc_page_size, head_dim]
//   MLA:          ckv [num_alloc_pages, alloc_page_size, kv_lora_rank]
//                 kpe [num_alloc_pages, alloc_page_size, rope_dim]
// (for MLA, ckv and kpe may be two slices of one [.., kv_lora_rank + rope_dim] buffer: strides are
// explicit). The kernels see attention pages of `page_size` P tokens, P dividing alloc_page_size:
// attention page p is tokens [(p % r) * P, (p % r + 1) * P) of allocation page p / r, with
// r = alloc_page_size / P. A slot is `alloc_page * alloc_page_size + offset`.
//
// fp8 caches hold value / scale; readers multiply by the scale.
#pragma once

#include <cstdint>

#include "pagedattn/tensor.h"

namespace pagedattn {

enum class KvLayout : uint8_t { kNHD, kHND };
std::string_view layout_name(KvLayout layout);  // "NHD" / "HND"

// The K/V cache of one layer for MHA/GQA/MQA.
struct PagedKv {
  TensorView k;  // see the layouts above
  TensorView v;
  KvLayout layout = KvLayout::kNHD;
  int32_t page_size = 0;  // attention page size P; divides alloc_page_size()
  float k_scale = 1.0f;   // dequantisation scales (fp8); 1 otherwise
  float v_scale = 1.0f;

  int64_t num_alloc_pages() const { return k.shape[0]; }
  int32_t alloc_page_size() const {
    return static_cast<int32_t>(layout == KvLayout::kNHD ? k.shape[1] : k.shape[2]);
  }
  int32_t num_kv_heads() const {
    return static_cast<int32_t>(layout == KvLayout::kNHD ? k.shape[2] : k.shape[1]);
  }
  int32_t head_dim() const { return static_cast<int32_t>(k.shape[3]); }
  int64_t num_attention_pages() const {
    return num_alloc_pages() * (alloc_page_size() / page_size);
  }
  // Throws Error unless k and v are consistent 4-D views on `device` and P divides the allocation
  // page size.
  void validate(Device device) const;
};

// The latent cache of one layer for MLA.
struct PagedLatent {
  TensorView ckv;  // [num_alloc_pages, alloc_page_size, kv_lora_rank]
  TensorView kpe;  // [num_alloc_pages, alloc_page_size, rope_dim]
  int32_t page_size = 0;
  float scale = 1.0f;  // fp8 dequantisation scale for both

  int64_t num_alloc_pages() const { return ckv.shape[0]; }
  int32_t alloc_page_size() const { return static_cast<int32_t>(ckv.shape[1]); }
  int32_t kv_lora_rank() const { return static_cast<int32_t>(ckv.shape[2]); }
  int32_t rope_dim() const { return static_cast<int32_t>(kpe.shape[2]); }
  int64_t num_attention_pages() const {
    return num_alloc_pages() * (alloc_page_size() / page_size);
  }
  void validate(Device device) const;
};

struct KvCacheConfig {
  int64_t num_pages = 0;  // allocation pages
  int32_t alloc_page_size = 16;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  KvLayout layout = KvLayout::kNHD;
  DType dtype = DType::kBF16;
};

// Owning host pool for one layer (MHA/GQA).
class HostKvCache {
 public:
  explicit HostKvCache(const KvCacheConfig& config);
  const KvCacheConfig& config() const { return config_; }
  // A view with attention page size `page_size` (must divide alloc_page_size).
  PagedKv paged(int32_t page_size, float k_scale = 1.0f, float v_scale = 1.0f) const;

 private:
  KvCacheConfig config_;
  HostTensor k_, v_;
};

struct MlaCacheConfig {
  int64_t num_pages = 0;
  int32_t alloc_page_size = 64;
  int32_t kv_lora_rank = 512;
  int32_t rope_dim = 64;
  DType dtype = DType::kBF16;
};

// Owning host latent pool for one layer: one [pages, alloc_page_size, rank + rope] buffer whose
// ckv and kpe views are slices of each token's row.
class HostMlaCache {
 public:
  explicit HostMlaCache(const MlaCacheConfig& config);
  const MlaCacheConfig& config() const { return config_; }
  PagedLatent paged(int32_t page_size, float scale = 1.0f) const;

 private:
  MlaCacheConfig config_;
  HostTensor latent_;
};

// Writes a batch's new tokens into their slots (host caches).
//   k_new, v_new: [num_tokens, num_kv_heads, head_dim], f32/f16/bf16 (converted to the cache dtype,
//   divided by the scale for fp8); slots: [num_tokens] i32 or i64, slot = page * alloc + offset;
//   a negative slot skips the token (padding). Validates everything before writing anything.
void store_kv(const PagedKv& cache, const TensorView& k_new, const TensorView& v_new,
              const TensorView& slots);
//   ckv_new [num_tokens, kv_lora_rank], kpe_new [num_tokens, rope_dim].
void store_latent(const PagedLatent& cache, const TensorView& ckv_new, const TensorView& kpe_new,
                  const TensorView& slots);

// Copies the first `num_tokens` tokens (all heads, K and V) of allocation page `src_page` into
// page `dst_page` of a host cache: the private copy of a forked request's partial last page
// (PageAllocator::fork's PageCopy). Validates the pages and the count before copying.
void copy_tokens(const PagedKv& cache, int64_t src_page, int64_t dst_page, int32_t num_tokens);
void copy_tokens(const PagedLatent& cache, int64_t src_page, int64_t dst_page, int32_t num_tokens);

}  // namespace pagedattn
