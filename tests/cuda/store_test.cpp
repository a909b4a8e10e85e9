// The device store (include/pagedattn/cuda_store.h) against the host store_kv / store_latent:
// the same random cache and new rows, stored on both sides, must give byte-identical caches
// (cache dtypes f32/f16/bf16/fp8 x NHD/HND x input dtypes, i32 and i64 slots, padding slots).
// An out-of-range slot with a status view leaves the cache untouched and is reported.
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
  DType input_dtype;
  KvLayout layout;
  DType slot_dtype;
  std::string name() const {
    return fmt::format("cache_{}_in_{}_{}_{}", dtype_name(cache_dtype), dtype_name(input_dtype),
                       layout_name(layout), dtype_name(slot_dtype));
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

class CudaStoreTest : public ::testing::TestWithParam<StoreCase> {};

TEST_P(CudaStoreTest, MatchesHostStore) {
  PA_REQUIRE_GPU();
  const StoreCase& p = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  KvCacheConfig config;
  config.num_pages = 6;
  config.alloc_page_size = 8;
  config.num_kv_heads = 3;
  config.head_dim = 64;
  config.layout = p.layout;
  config.dtype = p.cache_dtype;
  HostKvCache host_cache(config);
  const PagedKv host_kv = host_cache.paged(4, 0.5f, 0.25f);
  fill_uniform(host_kv.k, rng, -1.0f, 1.0f, 0.5f);
  fill_uniform(host_kv.v, rng, -1.0f, 1.0f, 0.25f);
  DeviceTensor k(host_kv.k), v(host_kv.v);
  PagedKv device_kv = host_kv;
  device_kv.k = k.view();
  device_kv.v = v.view();

  const int64_t num_tokens = 21;
  HostTensor k_new(p.input_dtype, {num_tokens, 3, 64}), v_new(p.input_dtype, {num_tokens, 3, 64});
  fill_uniform(k_new.view(), rng, -200.0f, 200.0f);  // beyond fp8's range / scale: saturation
  fill_uniform(v_new.view(), rng);
  const HostTensor slots = random_slots(rng, num_tokens, 6 * 8, p.slot_dtype);
  DeviceTensor d_k_new(k_new.view()), d_v_new(v_new.view()), d_slots(slots.view());
  DeviceTensor status = DeviceTensor::from_vector({-1, -1, -1, -1});

  store_kv(host_kv, k_new.view(), v_new.view(), slots.view());
  cuda::store_kv(device_kv, d_k_new.view(), d_v_new.view(), d_slots.view(), nullptr, status.view());
  cuda::read_store_status(status.view(), nullptr);
  EXPECT_TRUE(same_bytes(k, host_kv.k)) << "k differs";
  EXPECT_TRUE(same_bytes(v, host_kv.v)) << "v differs";
}

std::vector<StoreCase> store_cases() {
  std::vector<StoreCase> cases;
  for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3}) {
    for (DType input : {DType::kF32, DType::kBF16}) {
      for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
        cases.push_back(
            {cache, input, layout, layout == KvLayout::kNHD ? DType::kI64 : DType::kI32});
      }
    }
  }
  cases.push_back({DType::kBF16, DType::kF16, KvLayout::kNHD, DType::kI32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaStoreTest, ::testing::ValuesIn(store_cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(CudaStore, LatentMatchesHostStore) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  MlaCacheConfig config;
  config.num_pages = 4;
  config.alloc_page_size = 16;
  config.kv_lora_rank = 64;
  config.rope_dim = 16;
  HostMlaCache host_cache(config);
  const PagedLatent host_latent = host_cache.paged(16);
  fill_uniform(host_latent.ckv, rng);
  fill_uniform(host_latent.kpe, rng);
  // ckv and kpe are slices of one buffer: mirror the whole row buffer.
  TensorView whole = host_latent.ckv;
  whole.shape[2] = 80;
  DeviceTensor latent(whole);
  PagedLatent device_latent = host_latent;
  device_latent.ckv.data = latent.view().data;
  device_latent.ckv.device = Device::cuda(0);
  device_latent.kpe.data = static_cast<char*>(latent.view().data) + 64 * 2;
  device_latent.kpe.device = Device::cuda(0);
  HostTensor ckv_new(DType::kF32, {9, 64}), kpe_new(DType::kF32, {9, 16});
  fill_uniform(ckv_new.view(), rng);
  fill_uniform(kpe_new.view(), rng);
  const HostTensor slots = random_slots(rng, 9, 64, DType::kI32);
  DeviceTensor d_ckv(ckv_new.view()), d_kpe(kpe_new.view()), d_slots(slots.view());
  store_latent(host_latent, ckv_new.view(), kpe_new.view(), slots.view());
  cuda::store_latent(device_latent, d_ckv.view(), d_kpe.view(), d_slots.view(), nullptr);
  EXPECT_TRUE(same_bytes(latent, whole));
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
