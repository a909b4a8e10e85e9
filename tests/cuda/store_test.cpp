// The device store (include/pagedattn/cuda_store.h) against the host store_kv / store_latent:
// the same random cache and new rows, stored on both sides, must give bit-identical caches, every
// element of K and V checked (cache dtypes f32/f16/bf16/fp8 x NHD/HND x input dtypes x allocation
// pages of 8, 1 and 6; K and V of different input dtypes and head_dims; the model's strided slices
// of one qkv row; i32 and i64 slots, padding slots; with and without the status view). The latent
// store likewise for each cache dtype. An out-of-range slot with a status view leaves the cache
// untouched and is reported.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "common/test_util.h"
#include "cuda/cuda_test_util.h"
#include "pagedattn/cuda_store.h"

namespace pagedattn::testing {
namespace {

struct StoreCase {
  DType cache_dtype;
  DType k_input_dtype;
  DType v_input_dtype;
  KvLayout layout;
  DType slot_dtype;
  int32_t alloc_page_size = 8;
  int32_t page_size = 4;
  int32_t k_head_dim = 64;
  int32_t v_head_dim = 64;
  bool packed = false;  // k_new and v_new are slices of one f32 qkv row, as in the model
  bool status = true;   // with a status view (the slot check first)
  std::string name() const {
    std::string text =
        fmt::format("cache_{}_in_{}", dtype_name(cache_dtype), dtype_name(k_input_dtype));
    if (v_input_dtype != k_input_dtype) text += fmt::format("_v_{}", dtype_name(v_input_dtype));
    text += fmt::format("_{}_{}_alloc{}_page{}", layout_name(layout), dtype_name(slot_dtype),
                        alloc_page_size, page_size);
    if (v_head_dim != k_head_dim) text += fmt::format("_dim{}_v{}", k_head_dim, v_head_dim);
    if (packed) text += "_packed";
    if (!status) text += "_nostatus";
    return text;
  }
};

// num_tokens slots drawn without replacement from the pool, every fourth one -1 (padding).
HostTensor random_slots(std::mt19937_64& rng, int64_t num_tokens, int64_t num_slots, DType dtype) {
  std::vector<int64_t> pool(static_cast<size_t>(num_slots));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  HostTensor slots(dtype, {num_tokens});
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = t % 4 == 3 ? -1 : pool[t];
    if (dtype == DType::kI64) {
      slots.data<int64_t>()[t] = slot;
    } else {
      slots.data<int32_t>()[t] = static_cast<int32_t>(slot);
    }
  }
  return slots;
}

bool same_bytes(const DeviceTensor& device, const TensorView& host) {
  std::vector<unsigned char> copy(static_cast<size_t>(extent_bytes(host)));
  TensorView view = host;
  view.data = copy.data();
  device.copy_to(view);
  return std::memcmp(copy.data(), host.data, copy.size()) == 0;
}

// Every element of a 4-D device cache against the host's, bit for bit (fp8 and NaN included);
// names the first element that differs and how many do.
::testing::AssertionResult same_elements(const DeviceTensor& device, const TensorView& host) {
  std::vector<unsigned char> copy(static_cast<size_t>(extent_bytes(host)));
  TensorView view = host;
  view.data = copy.data();
  device.copy_to(view);
  const int64_t size = dtype_size(host.dtype);
  const auto* expected = static_cast<const unsigned char*>(host.data);
  int64_t differing = 0;
  std::string first;
  for (int64_t a = 0; a < host.shape[0]; ++a) {
    for (int64_t b = 0; b < host.shape[1]; ++b) {
      for (int64_t c = 0; c < host.shape[2]; ++c) {
        for (int64_t d = 0; d < host.shape[3]; ++d) {
          const int64_t at = (a * host.strides[0] + b * host.strides[1] + c * host.strides[2] +
                              d * host.strides[3]) *
                             size;
          if (std::memcmp(copy.data() + at, expected + at, static_cast<size_t>(size)) == 0)
            continue;
          if (differing++ == 0) first = fmt::format("[{}, {}, {}, {}]", a, b, c, d);
        }
      }
    }
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differing << " of " << host.numel() << " elements differ, the first at " << first;
}

// A host pool of the case's layout: [pages, alloc, heads, dim] (NHD) or [pages, heads, alloc, dim].
HostTensor host_pool(const StoreCase& p, int64_t pages, int64_t heads, int64_t dim) {
  return p.layout == KvLayout::kNHD
             ? HostTensor(p.cache_dtype, {pages, p.alloc_page_size, heads, dim})
             : HostTensor(p.cache_dtype, {pages, heads, p.alloc_page_size, dim});
}

class CudaStoreTest : public ::testing::TestWithParam<StoreCase> {};

// K and V together (one launch) against the host store_kv, every element of both pools.
TEST_P(CudaStoreTest, MatchesHostStore) {
  PA_REQUIRE_GPU();
  const StoreCase& p = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  const int64_t num_tokens = 21, heads = 3;
  // At least twice as many slots as tokens, whatever the page size.
  const int64_t pages = (2 * num_tokens + p.alloc_page_size - 1) / p.alloc_page_size;
  const float k_scale = 0.5f, v_scale = 0.25f;
  const HostTensor k_pool = host_pool(p, pages, heads, p.k_head_dim);
  const HostTensor v_pool = host_pool(p, pages, heads, p.v_head_dim);
  const PagedKv host_kv{k_pool.view(), v_pool.view(), p.layout, p.page_size, k_scale, v_scale};
  fill_uniform(host_kv.k, rng, -1.0f, 1.0f, k_scale);
  fill_uniform(host_kv.v, rng, -1.0f, 1.0f, v_scale);
  DeviceTensor k(host_kv.k), v(host_kv.v);
  PagedKv device_kv = host_kv;
  device_kv.k = k.view();
  device_kv.v = v.view();

  // The new rows: separate tensors, or (packed) K and V slices of one [tokens, q + k + v] f32 row
  // with its query heads in front, whose strides the device store must follow.
  HostTensor k_separate, v_separate, qkv;
  TensorView k_new, v_new;
  if (p.packed) {
    const int64_t q_width = 2 * heads * p.k_head_dim;
    const int64_t width = q_width + heads * (p.k_head_dim + p.v_head_dim);
    qkv = HostTensor(DType::kF32, {num_tokens, width});
    fill_uniform(qkv.view(), rng, -3.0f, 3.0f);
    k_new = TensorView::contiguous(qkv.data<float>() + q_width, DType::kF32,
                                   {num_tokens, heads, p.k_head_dim});
    k_new.strides[0] = width;
    v_new = TensorView::contiguous(qkv.data<float>() + q_width + heads * p.k_head_dim, DType::kF32,
                                   {num_tokens, heads, p.v_head_dim});
    v_new.strides[0] = width;
  } else {
    k_separate = HostTensor(p.k_input_dtype, {num_tokens, heads, p.k_head_dim});
    v_separate = HostTensor(p.v_input_dtype, {num_tokens, heads, p.v_head_dim});
    k_new = k_separate.view();
    v_new = v_separate.view();
    fill_uniform(k_new, rng, -200.0f, 200.0f);  // beyond fp8's range / scale: saturation
    fill_uniform(v_new, rng);
  }
  const HostTensor slots = random_slots(rng, num_tokens, pages * p.alloc_page_size, p.slot_dtype);
  DeviceTensor d_k_new(k_new), d_v_new(v_new), d_slots(slots.view());
  DeviceTensor status = DeviceTensor::from_vector({-1, -1, -1, -1});

  store_kv(host_kv, k_new, v_new, slots.view());
  if (p.status) {
    cuda::store_kv(device_kv, d_k_new.view(), d_v_new.view(), d_slots.view(), nullptr,
                   status.view());
    cuda::read_store_status(status.view(), nullptr);
  } else {
    cuda::store_kv(device_kv, d_k_new.view(), d_v_new.view(), d_slots.view(), nullptr);
  }
  EXPECT_TRUE(same_elements(k, host_kv.k)) << "k";
  EXPECT_TRUE(same_elements(v, host_kv.v)) << "v";
}

std::vector<StoreCase> store_cases() {
  std::vector<StoreCase> cases;
  // Every cache dtype x layout x input dtype, at a power-of-two page, page size 1 and a page of 6
  // (attention pages of 3).
  const std::pair<int32_t, int32_t> pages[] = {{8, 4}, {1, 1}, {6, 3}};
  for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3}) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      for (const auto& [alloc, page] : pages) {
        for (DType input : {DType::kF32, DType::kBF16}) {
          StoreCase c{cache, input, input, layout,
                      layout == KvLayout::kNHD ? DType::kI64 : DType::kI32};
          c.alloc_page_size = alloc;
          c.page_size = page;
          cases.push_back(c);
        }
      }
    }
  }
  cases.push_back({DType::kBF16, DType::kF16, DType::kF16, KvLayout::kNHD, DType::kI32});
  // K and V of different input dtypes (one launch still).
  cases.push_back({DType::kBF16, DType::kF32, DType::kF16, KvLayout::kNHD, DType::kI64});
  cases.push_back({DType::kFP8E4M3, DType::kBF16, DType::kF32, KvLayout::kHND, DType::kI32});
  // V with its own head_dim (192 / 128, as DeepSeek's MHA prefill), both layouts and odd pages.
  for (DType cache : {DType::kBF16, DType::kFP8E4M3}) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      StoreCase c{cache, DType::kF32, DType::kBF16, layout, DType::kI64, 6, 3};
      c.k_head_dim = 192;
      c.v_head_dim = 128;
      cases.push_back(c);
    }
  }
  // The model's call: K and V slices of the f32 qkv buffer, no status, page size 1 and 16.
  for (DType cache : {DType::kBF16, DType::kF32, DType::kFP8E4M3}) {
    for (const auto& [alloc, page] : {std::pair{16, 16}, std::pair{1, 1}}) {
      StoreCase c{cache, DType::kF32, DType::kF32, KvLayout::kNHD, DType::kI64, alloc, page};
      c.k_head_dim = c.v_head_dim = 128;
      c.packed = true;
      c.status = false;
      cases.push_back(c);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaStoreTest, ::testing::ValuesIn(store_cases()),
                         [](const auto& info) { return info.param.name(); });

// ckv and kpe in one launch against the host store_latent, for each cache dtype, with ckv_new and
// kpe_new of different input dtypes.
TEST(CudaStore, LatentMatchesHostStore) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kFP8E4M3}) {
    SCOPED_TRACE(fmt::format("cache {}", dtype_name(dtype)));
    MlaCacheConfig config;
    config.num_pages = 4;
    config.alloc_page_size = 16;
    config.kv_lora_rank = 64;
    config.rope_dim = 16;
    config.dtype = dtype;
    HostMlaCache host_cache(config);
    const float scale = dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
    const PagedLatent host_latent = host_cache.paged(16, scale);
    fill_uniform(host_latent.ckv, rng, -1.0f, 1.0f, scale);
    fill_uniform(host_latent.kpe, rng, -1.0f, 1.0f, scale);
    // ckv and kpe are slices of one buffer: mirror the whole row buffer.
    TensorView whole = host_latent.ckv;
    whole.shape[2] = 80;
    DeviceTensor latent(whole);
    PagedLatent device_latent = host_latent;
    device_latent.ckv.data = latent.view().data;
    device_latent.ckv.device = Device::cuda(0);
    device_latent.kpe.data = static_cast<char*>(latent.view().data) + 64 * dtype_size(dtype);
    device_latent.kpe.device = Device::cuda(0);
    HostTensor ckv_new(DType::kF32, {9, 64}), kpe_new(DType::kBF16, {9, 16});
    fill_uniform(ckv_new.view(), rng, -3.0f, 3.0f);
    fill_uniform(kpe_new.view(), rng, -3.0f, 3.0f);
    const HostTensor slots = random_slots(rng, 9, 64, DType::kI32);
    DeviceTensor d_ckv(ckv_new.view()), d_kpe(kpe_new.view()), d_slots(slots.view());
    store_latent(host_latent, ckv_new.view(), kpe_new.view(), slots.view());
    cuda::store_latent(device_latent, d_ckv.view(), d_kpe.view(), d_slots.view(), nullptr);
    EXPECT_TRUE(same_bytes(latent, whole));
  }
}

TEST(CudaStore, OutOfRangeSlotWritesNothing) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  KvCacheConfig config;
  config.num_pages = 2;
  config.alloc_page_size = 4;
  config.num_kv_heads = 1;
  config.head_dim = 64;
  HostKvCache host_cache(config);
  const PagedKv host_kv = host_cache.paged(4);
  fill_uniform(host_kv.k, rng);
  fill_uniform(host_kv.v, rng);
  DeviceTensor k(host_kv.k), v(host_kv.v);
  PagedKv device_kv = host_kv;
  device_kv.k = k.view();
  device_kv.v = v.view();
  HostTensor k_new(DType::kF32, {4, 1, 64}), v_new(DType::kF32, {4, 1, 64});
  fill_uniform(k_new.view(), rng);
  fill_uniform(v_new.view(), rng);
  HostTensor slots(DType::kI32, {4});
  const int32_t values[] = {0, 5, 2, 8};  // 8 >= 2 pages x 4
  std::copy(values, values + 4, slots.data<int32_t>());
  DeviceTensor d_k_new(k_new.view()), d_v_new(v_new.view()), d_slots(slots.view());
  DeviceTensor status = DeviceTensor::from_vector({0, 0, 0, 0});
  cuda::store_kv(device_kv, d_k_new.view(), d_v_new.view(), d_slots.view(), nullptr, status.view());
  try {
    cuda::read_store_status(status.view(), nullptr);
    ADD_FAILURE() << "out-of-range slot accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("slots[3] = 8"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(same_bytes(k, host_kv.k));
  EXPECT_TRUE(same_bytes(v, host_kv.v));
  // A host view is refused before anything runs.
  EXPECT_THROW(cuda::store_kv(device_kv, k_new.view(), d_v_new.view(), d_slots.view(), nullptr),
               Error);
}

}  // namespace
}  // namespace pagedattn::testing
