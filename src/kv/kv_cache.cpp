// The paged KV cache: validation of the views the attention operations read, the owning host
// pools, and the writes of a batch's new tokens into their slots.
//
// A slot is `alloc_page * alloc_page_size + offset`. Token t of a store lands at
//   NHD: k[page, offset, head, :]      HND: k[page, head, offset, :]
//   MLA: ckv[page, offset, :], kpe[page, offset, :]
// through the views' explicit strides, so a cache that is a slice of a larger buffer works too.
// Every store validates the cache, the inputs and every slot before it writes a single element,
// so a bad call leaves the cache untouched. Conversions go through float: f32/f16/bf16 inputs are
// rounded to the cache dtype (nearest even); an fp8 cache stores value / scale, saturated.
#include "pagedattn/kv_cache.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/check.h"

namespace pagedattn {

std::string_view layout_name(KvLayout layout) { return layout == KvLayout::kNHD ? "NHD" : "HND"; }

namespace {

constexpr std::initializer_list<DType> kCacheDTypes = {DType::kF32, DType::kF16, DType::kBF16,
                                                       DType::kFP8E4M3};
constexpr std::initializer_list<DType> kInputDTypes = {DType::kF32, DType::kF16, DType::kBF16};
constexpr std::initializer_list<DType> kSlotDTypes = {DType::kI32, DType::kI64};

void check_page_size(int32_t page_size, int64_t alloc_page_size) {
  PA_CHECK(page_size >= 1, "page_size: {} is not a valid attention page size (expected >= 1)",
           page_size);
  PA_CHECK(alloc_page_size >= 1, "alloc_page_size: {} (expected >= 1)", alloc_page_size);
  PA_CHECK(alloc_page_size % page_size == 0,
           "page_size: {} does not divide alloc_page_size {} (the attention page size must "
           "divide the allocation page size)",
           page_size, alloc_page_size);
}

void check_scale(std::string_view name, float scale) {
  PA_CHECK(std::isfinite(scale) && scale > 0.0f,
           "{}: {} is not a valid scale (expected finite > 0)", name, scale);
}

void check_extents_positive(std::string_view name, const TensorView& view, int first_dim) {
  for (int d = first_dim; d < view.ndim; ++d) {
    PA_CHECK(view.shape[d] >= 1, "{}: extent {} in dimension {} of shape {} (expected >= 1)", name,
             view.shape[d], d, view.shape_str());
  }
}

// The slots, read as int64 whatever their storage type.
int64_t slot_at(const TensorView& slots, int64_t index) {
  const int64_t offset = index * slots.strides[0];
  return slots.dtype == DType::kI32 ? int64_t{slots.data_as<const int32_t>()[offset]}
                                    : slots.data_as<const int64_t>()[offset];
}

// Checks every slot against [0, num_slots) before anything is written; negatives are padding.
void check_slots(const TensorView& slots, int64_t num_tokens, int64_t num_alloc_pages,
                 int64_t alloc_page_size) {
  check_tensor("slots", slots, {num_tokens}, kSlotDTypes, Device::cpu());
  const int64_t num_slots = num_alloc_pages * alloc_page_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_at(slots, t);
    PA_CHECK(slot < num_slots,
             "slots[{}]: slot {} is out of range (expected < {} = {} pages x alloc_page_size {}, "
             "or negative to skip)",
             t, slot, num_slots, num_alloc_pages, alloc_page_size);
  }
}

// Copies one row of `count` elements from `src` (input dtype) to `dst` (cache dtype), dividing by
// `scale` when the cache is fp8.
// (A true division, not a product with 1 / scale, so that every writer rounds alike.) The same
// dtype in and out is a copy: the float round trip of f32/f16/bf16 is exact.
template <class Dst, class Src>
void convert_row(Dst* dst, const Src* src, int64_t src_stride, int64_t count, float scale) {
  if constexpr (std::is_same_v<Dst, Src>) {
    if (src_stride == 1) {
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(Dst));
      return;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    float value = to_float(src[i * src_stride]);
    if constexpr (std::is_same_v<Dst, Fp8E4M3>) value /= scale;
    dst[i] = from_float<Dst>(value);
  }
}

// Writes rows of a [num_tokens, rows, width] input into the cache at `row_offset(token_slot, row)`
// (in cache elements). Dispatches on both dtypes once, outside the loops.
template <class RowOffset>
void store_rows(const TensorView& cache, float scale, const TensorView& input,
                const TensorView& slots, int64_t rows, int64_t width, int64_t alloc_page_size,
                RowOffset&& row_offset) {
  dispatch_float(cache.dtype, "cache", [&]<class Dst>(Dst) {
    dispatch_float(input.dtype, "input", [&]<class Src>(Src) {
      if constexpr (std::is_same_v<Src, Fp8E4M3>) {
        PA_FAIL("input: fp8 inputs are not supported");  // excluded by validation
      } else {
        Dst* base = cache.data_as<Dst>();
        const Src* in = input.data_as<const Src>();
        const int64_t num_tokens = input.shape[0];
        const int64_t in_row_stride = input.ndim == 3 ? input.strides[1] : 0;
        const int64_t in_inner = input.strides[input.ndim - 1];
        for (int64_t t = 0; t < num_tokens; ++t) {
          const int64_t slot = slot_at(slots, t);
          if (slot < 0) continue;
          const int64_t page = slot / alloc_page_size;
          const int64_t offset = slot % alloc_page_size;
          for (int64_t r = 0; r < rows; ++r) {
            convert_row(base + row_offset(page, offset, r),
                        in + t * input.strides[0] + r * in_row_stride, in_inner, width, scale);
          }
        }
      }
    });
  });
}

}  // namespace

// ---- validation ----

void PagedKv::validate(Device device) const {
  const bool nhd = layout == KvLayout::kNHD;
  const char* shape_text = nhd ? "[num_pages, alloc_page_size, num_kv_heads, head_dim] (NHD)"
                               : "[num_pages, num_kv_heads, alloc_page_size, head_dim] (HND)";
  PA_CHECK(k.ndim == 4, "k: a {}-D view of shape {}, expected 4-D {}", k.ndim, k.shape_str(),
           shape_text);
  PA_CHECK(v.ndim == 4, "v: a {}-D view of shape {}, expected 4-D {}", v.ndim, v.shape_str(),
           shape_text);
  check_tensor("k", k, {kAnySize, kAnySize, kAnySize, kAnySize}, kCacheDTypes, device);
  // v may have its own head_dim (prefill with head_dim_qk != head_dim_vo).
  check_tensor("v", v, {k.shape[0], k.shape[1], k.shape[2], kAnySize}, k.dtype, device);
  check_extents_positive("k", k, 1);
  check_extents_positive("v", v, 1);
  check_inner_contiguous("k", k);
  check_inner_contiguous("v", v);
  check_page_size(page_size, alloc_page_size());
  check_scale("k_scale", k_scale);
  check_scale("v_scale", v_scale);
}

void PagedLatent::validate(Device device) const {
  const char* ckv_text = "[num_pages, alloc_page_size, kv_lora_rank]";
  const char* kpe_text = "[num_pages, alloc_page_size, rope_dim]";
  PA_CHECK(ckv.ndim == 3, "ckv: a {}-D view of shape {}, expected 3-D {}", ckv.ndim,
           ckv.shape_str(), ckv_text);
  PA_CHECK(kpe.ndim == 3, "kpe: a {}-D view of shape {}, expected 3-D {}", kpe.ndim,
           kpe.shape_str(), kpe_text);
  check_tensor("ckv", ckv, {kAnySize, kAnySize, kAnySize}, kCacheDTypes, device);
  check_tensor("kpe", kpe, {ckv.shape[0], ckv.shape[1], kAnySize}, ckv.dtype, device);
  check_extents_positive("ckv", ckv, 1);
  check_extents_positive("kpe", kpe, 1);
  check_inner_contiguous("ckv", ckv);
  check_inner_contiguous("kpe", kpe);
  check_page_size(page_size, alloc_page_size());
  check_scale("scale", scale);
}

// ---- host pools ----

HostKvCache::HostKvCache(const KvCacheConfig& config) : config_(config) {
  PA_CHECK(config.num_pages >= 0, "num_pages: {} (expected >= 0)", config.num_pages);
  PA_CHECK(config.alloc_page_size >= 1, "alloc_page_size: {} (expected >= 1)",
           config.alloc_page_size);
  PA_CHECK(config.num_kv_heads >= 1, "num_kv_heads: {} (expected >= 1)", config.num_kv_heads);
  PA_CHECK(config.head_dim >= 1, "head_dim: {} (expected >= 1)", config.head_dim);
  PA_CHECK(config.dtype == DType::kF32 || config.dtype == DType::kF16 ||
               config.dtype == DType::kBF16 || config.dtype == DType::kFP8E4M3,
           "dtype: {} is not a KV cache dtype (expected f32, f16, bf16 or fp8_e4m3)",
           dtype_name(config.dtype));
  const int64_t a = config.alloc_page_size, h = config.num_kv_heads;
  if (config.layout == KvLayout::kNHD) {
    k_ = HostTensor(config.dtype, {config.num_pages, a, h, config.head_dim});
    v_ = HostTensor(config.dtype, {config.num_pages, a, h, config.head_dim});
  } else {
    k_ = HostTensor(config.dtype, {config.num_pages, h, a, config.head_dim});
    v_ = HostTensor(config.dtype, {config.num_pages, h, a, config.head_dim});
  }
}

PagedKv HostKvCache::paged(int32_t page_size, float k_scale, float v_scale) const {
  PagedKv kv{k_.view(), v_.view(), config_.layout, page_size, k_scale, v_scale};
  kv.validate(Device::cpu());
  return kv;
}

HostMlaCache::HostMlaCache(const MlaCacheConfig& config) : config_(config) {
  PA_CHECK(config.num_pages >= 0, "num_pages: {} (expected >= 0)", config.num_pages);
  PA_CHECK(config.alloc_page_size >= 1, "alloc_page_size: {} (expected >= 1)",
           config.alloc_page_size);
  PA_CHECK(config.kv_lora_rank >= 1, "kv_lora_rank: {} (expected >= 1)", config.kv_lora_rank);
  PA_CHECK(config.rope_dim >= 1, "rope_dim: {} (expected >= 1)", config.rope_dim);
  PA_CHECK(config.dtype == DType::kF32 || config.dtype == DType::kF16 ||
               config.dtype == DType::kBF16 || config.dtype == DType::kFP8E4M3,
           "dtype: {} is not a latent cache dtype (expected f32, f16, bf16 or fp8_e4m3)",
           dtype_name(config.dtype));
  latent_ = HostTensor(config.dtype, {config.num_pages, config.alloc_page_size,
                                      int64_t{config.kv_lora_rank} + config.rope_dim});
}

PagedLatent HostMlaCache::paged(int32_t page_size, float scale) const {
  // ckv and kpe are the first kv_lora_rank and the last rope_dim elements of each token's row.
  const TensorView& whole = latent_.view();
  PagedLatent latent;
  latent.ckv = whole;
  latent.ckv.shape[2] = config_.kv_lora_rank;
  latent.kpe = whole;
  latent.kpe.shape[2] = config_.rope_dim;
  latent.kpe.data =
      static_cast<char*>(whole.data) + int64_t{config_.kv_lora_rank} * dtype_size(config_.dtype);
  latent.page_size = page_size;
  latent.scale = scale;
  latent.validate(Device::cpu());
  return latent;
}

// ---- stores ----

void store_kv(const PagedKv& cache, const TensorView& k_new, const TensorView& v_new,
              const TensorView& slots) {
  cache.validate(Device::cpu());
  const int64_t heads = cache.num_kv_heads();
  const int64_t k_dim = cache.k.shape[3], v_dim = cache.v.shape[3];
  check_tensor("k_new", k_new, {kAnySize, heads, k_dim}, kInputDTypes, Device::cpu());
  const int64_t num_tokens = k_new.shape[0];
  check_tensor("v_new", v_new, {num_tokens, heads, v_dim}, kInputDTypes, Device::cpu());
  const int64_t alloc = cache.alloc_page_size();
  check_slots(slots, num_tokens, cache.num_alloc_pages(), alloc);

  const bool nhd = cache.layout == KvLayout::kNHD;
  for (const auto* which : {&cache.k, &cache.v}) {
    const TensorView& pool = *which;
    const TensorView& input = which == &cache.k ? k_new : v_new;
    const float scale = which == &cache.k ? cache.k_scale : cache.v_scale;
    const int64_t s_page = pool.strides[0];
    const int64_t s_token = nhd ? pool.strides[1] : pool.strides[2];
    const int64_t s_head = nhd ? pool.strides[2] : pool.strides[1];
    store_rows(pool, scale, input, slots, heads, pool.shape[3], alloc,
               [=](int64_t page, int64_t offset, int64_t head) {
                 return page * s_page + offset * s_token + head * s_head;
               });
  }
}

void store_latent(const PagedLatent& cache, const TensorView& ckv_new, const TensorView& kpe_new,
                  const TensorView& slots) {
  cache.validate(Device::cpu());
  check_tensor("ckv_new", ckv_new, {kAnySize, cache.kv_lora_rank()}, kInputDTypes, Device::cpu());
  const int64_t num_tokens = ckv_new.shape[0];
  check_tensor("kpe_new", kpe_new, {num_tokens, cache.rope_dim()}, kInputDTypes, Device::cpu());
  const int64_t alloc = cache.alloc_page_size();
  check_slots(slots, num_tokens, cache.num_alloc_pages(), alloc);

  for (const auto* which : {&cache.ckv, &cache.kpe}) {
    const TensorView& pool = *which;
    const TensorView& input = which == &cache.ckv ? ckv_new : kpe_new;
    const int64_t s_page = pool.strides[0], s_token = pool.strides[1];
    store_rows(
        pool, cache.scale, input, slots, 1, pool.shape[2], alloc,
        [=](int64_t page, int64_t offset, int64_t) { return page * s_page + offset * s_token; });
  }
}

// ---- page copies (fork's partial last page) ----

namespace {

void check_copy(std::string_view what, int64_t src_page, int64_t dst_page, int32_t num_tokens,
                int64_t num_pages, int64_t alloc_page_size) {
  PA_CHECK(src_page >= 0 && src_page < num_pages, "{}: src_page {} is out of range [0, {})", what,
           src_page, num_pages);
  PA_CHECK(dst_page >= 0 && dst_page < num_pages, "{}: dst_page {} is out of range [0, {})", what,
           dst_page, num_pages);
  PA_CHECK(num_tokens >= 0 && num_tokens <= alloc_page_size,
           "{}: num_tokens {} is out of range [0, {}] (alloc_page_size)", what, num_tokens,
           alloc_page_size);
}

// Copies `count` contiguous elements of `bytes_per_element` bytes.
void copy_row(const TensorView& pool, int64_t dst_offset, int64_t src_offset, int64_t count) {
  const int64_t element = dtype_size(pool.dtype);
  char* base = static_cast<char*>(pool.data);
  if (dst_offset == src_offset) return;
  std::memmove(base + dst_offset * element, base + src_offset * element,
               static_cast<size_t>(count * element));
}

}  // namespace

void copy_tokens(const PagedKv& cache, int64_t src_page, int64_t dst_page, int32_t num_tokens) {
  cache.validate(Device::cpu());
  check_copy("copy_tokens", src_page, dst_page, num_tokens, cache.num_alloc_pages(),
             cache.alloc_page_size());
  const bool nhd = cache.layout == KvLayout::kNHD;
  for (const TensorView* pool : {&cache.k, &cache.v}) {
    const int64_t s_token = nhd ? pool->strides[1] : pool->strides[2];
    const int64_t s_head = nhd ? pool->strides[2] : pool->strides[1];
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < cache.num_kv_heads(); ++h) {
        const int64_t within = t * s_token + h * s_head;
        copy_row(*pool, dst_page * pool->strides[0] + within, src_page * pool->strides[0] + within,
                 pool->shape[3]);
      }
    }
  }
}

void copy_tokens(const PagedLatent& cache, int64_t src_page, int64_t dst_page, int32_t num_tokens) {
  cache.validate(Device::cpu());
  check_copy("copy_tokens", src_page, dst_page, num_tokens, cache.num_alloc_pages(),
             cache.alloc_page_size());
  for (const TensorView* pool : {&cache.ckv, &cache.kpe}) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int64_t within = t * pool->strides[1];
      copy_row(*pool, dst_page * pool->strides[0] + within, src_page * pool->strides[0] + within,
               pool->shape[2]);
    }
  }
}

}  // namespace pagedattn
