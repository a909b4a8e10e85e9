// Every validation error path of the KV cache: PagedKv / PagedLatent::validate, the host pools'
// configurations, store_kv / store_latent / copy_tokens arguments. Each error must name the
// argument (and the value), and a rejected store must leave the cache untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn {
namespace {

// Runs `fn`, expects an Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message '" << message << "' lacks '" << part << "'";
    }
  }
}

class PagedKvValidation : public ::testing::Test {
 protected:
  HostKvCache cache_{{4, 8, 2, 16, KvLayout::kNHD, DType::kBF16}};
  PagedKv kv_ = cache_.paged(8);
};

TEST_F(PagedKvValidation, AcceptsEveryDivisorPageSize) {
  for (int32_t p : {1, 2, 4, 8}) EXPECT_NO_THROW(cache_.paged(p)) << p;
  EXPECT_EQ(cache_.paged(2).num_attention_pages(), 16);
}

TEST_F(PagedKvValidation, RejectsEachBadField) {
  PagedKv kv = kv_;
  kv.k.ndim = 3;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "3-D", "expected 4-D", "NHD"});
  kv = kv_;
  kv.v.ndim = 5;
  expect_error([&] { kv.validate(Device::cpu()); }, {"v:", "5-D"});
  kv = kv_;
  kv.layout = KvLayout::kHND;
  kv.k.ndim = 2;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "HND"});
  kv = kv_;
  kv.v.shape[2] = 3;
  expect_error([&] { kv.validate(Device::cpu()); }, {"v:", "shape [4, 8, 3, 16]", "[4, 8, 2, *]"});
  kv = kv_;
  kv.v.dtype = DType::kF16;
  expect_error([&] { kv.validate(Device::cpu()); }, {"v:", "dtype f16", "bf16"});
  kv = kv_;
  kv.k.dtype = kv.v.dtype = DType::kI32;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "dtype i32", "fp8_e4m3"});
  kv = kv_;
  expect_error([&] { kv.validate(Device::cuda(0)); }, {"k:", "device cpu", "expected cuda:0"});
  kv = kv_;
  kv.k.data = nullptr;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "null"});
  kv = kv_;
  kv.k.strides[3] = 2;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "innermost stride is 2"});
  kv = kv_;
  kv.v.strides[0] = -1;
  expect_error([&] { kv.validate(Device::cpu()); }, {"v:", "negative stride -1"});
  kv = kv_;
  kv.k.shape[2] = kv.v.shape[2] = 0;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k:", "extent 0 in dimension 2"});
  kv = kv_;
  kv.page_size = 0;
  expect_error([&] { kv.validate(Device::cpu()); }, {"page_size: 0", ">= 1"});
  kv = kv_;
  kv.page_size = 3;
  expect_error([&] { kv.validate(Device::cpu()); },
               {"page_size: 3", "does not divide alloc_page_size 8"});
  kv = kv_;
  kv.k_scale = 0.0f;
  expect_error([&] { kv.validate(Device::cpu()); }, {"k_scale: 0"});
  kv = kv_;
  kv.v_scale = NAN;
  expect_error([&] { kv.validate(Device::cpu()); }, {"v_scale: nan"});
  expect_error([&] { cache_.paged(16); }, {"page_size: 16", "alloc_page_size 8"});
}

TEST_F(PagedKvValidation, VHeadDimMayDiffer) {
  HostTensor v_wide(DType::kBF16, {4, 8, 2, 32});
  PagedKv kv = kv_;
  kv.v = v_wide.view();
  EXPECT_NO_THROW(kv.validate(Device::cpu()));
}

TEST(PagedLatentValidation, RejectsEachBadField) {
  HostMlaCache cache({2, 16, 64, 16, DType::kF16});
  const PagedLatent good = cache.paged(4);
  EXPECT_EQ(good.kv_lora_rank(), 64);
  EXPECT_EQ(good.rope_dim(), 16);
  EXPECT_EQ(good.ckv.strides[1], 80);
  EXPECT_EQ(good.kpe.strides[1], 80);
  PagedLatent bad = good;
  bad.ckv.ndim = 4;
  expect_error([&] { bad.validate(Device::cpu()); }, {"ckv:", "4-D", "expected 3-D"});
  bad = good;
  bad.kpe.ndim = 2;
  expect_error([&] { bad.validate(Device::cpu()); }, {"kpe:", "2-D"});
  bad = good;
  bad.kpe.shape[1] = 8;
  expect_error([&] { bad.validate(Device::cpu()); }, {"kpe:", "shape [2, 8, 16]", "[2, 16, *]"});
  bad = good;
  bad.kpe.dtype = DType::kBF16;
  expect_error([&] { bad.validate(Device::cpu()); }, {"kpe:", "dtype bf16", "expected f16"});
  bad = good;
  bad.ckv.strides[2] = 3;
  expect_error([&] { bad.validate(Device::cpu()); }, {"ckv:", "innermost stride is 3"});
  bad = good;
  bad.page_size = 5;
  expect_error([&] { bad.validate(Device::cpu()); }, {"page_size: 5", "alloc_page_size 16"});
  bad = good;
  bad.scale = -1.0f;
  expect_error([&] { bad.validate(Device::cpu()); }, {"scale: -1"});
}

TEST(HostCacheConfig, RejectsBadConfigurations) {
  expect_error(
      [] {
        HostKvCache({-1, 16, 8, 128, KvLayout::kNHD, DType::kBF16});
      },
      {"num_pages: -1"});
  expect_error(
      [] {
        HostKvCache({4, 0, 8, 128, KvLayout::kNHD, DType::kBF16});
      },
      {"alloc_page_size: 0"});
  expect_error(
      [] {
        HostKvCache({4, 16, 0, 128, KvLayout::kNHD, DType::kBF16});
      },
      {"num_kv_heads: 0"});
  expect_error([] { HostKvCache({4, 16, 8, 0, KvLayout::kNHD, DType::kBF16}); }, {"head_dim: 0"});
  expect_error(
      [] {
        HostKvCache({4, 16, 8, 128, KvLayout::kNHD, DType::kI64});
      },
      {"dtype: i64", "fp8_e4m3"});
  expect_error([] { HostMlaCache({4, 16, 0, 64, DType::kBF16}); }, {"kv_lora_rank: 0"});
  expect_error([] { HostMlaCache({4, 16, 512, 0, DType::kBF16}); }, {"rope_dim: 0"});
  expect_error([] { HostMlaCache({4, 16, 512, 64, DType::kI32}); }, {"dtype: i32"});
  EXPECT_EQ(layout_name(KvLayout::kNHD), "NHD");
  EXPECT_EQ(layout_name(KvLayout::kHND), "HND");
}

// Each bad store argument raises an Error naming it, and the cache is left untouched (the valid
// leading tokens of a batch are not written either).
TEST(StoreKvValidation, RejectsAndWritesNothing) {
  HostKvCache cache({3, 4, 2, 8, KvLayout::kHND, DType::kFP8E4M3});
  const PagedKv kv = cache.paged(4, 0.5f, 0.5f);
  testing::poison(kv.k);
  testing::poison(kv.v);
  HostTensor k_new(DType::kF32, {3, 2, 8}), v_new(DType::kF32, {3, 2, 8});
  HostTensor slots(DType::kI32, {3});
  auto set_slots = [&](int32_t a, int32_t b, int32_t c) {
    slots.data<int32_t>()[0] = a;
    slots.data<int32_t>()[1] = b;
    slots.data<int32_t>()[2] = c;
  };
  set_slots(0, 1, 12);
  expect_error([&] { store_kv(kv, k_new.view(), v_new.view(), slots.view()); },
               {"slots[2]", "slot 12 is out of range", "< 12", "3 pages", "alloc_page_size 4"});
  set_slots(0, 1, 2);
  HostTensor wrong_heads(DType::kF32, {3, 1, 8});
  expect_error([&] { store_kv(kv, wrong_heads.view(), v_new.view(), slots.view()); },
               {"k_new:", "shape [3, 1, 8]", "[*, 2, 8]"});
  HostTensor short_v(DType::kF32, {2, 2, 8});
  expect_error([&] { store_kv(kv, k_new.view(), short_v.view(), slots.view()); },
               {"v_new:", "shape [2, 2, 8]", "[3, 2, 8]"});
  HostTensor fp8_input(DType::kFP8E4M3, {3, 2, 8});
  expect_error([&] { store_kv(kv, fp8_input.view(), v_new.view(), slots.view()); },
               {"k_new:", "dtype fp8_e4m3 is not supported", "f32, f16, bf16"});
  HostTensor float_slots(DType::kF32, {3});
  expect_error([&] { store_kv(kv, k_new.view(), v_new.view(), float_slots.view()); },
               {"slots:", "dtype f32", "i32, i64"});
  HostTensor long_slots(DType::kI64, {4});
  expect_error([&] { store_kv(kv, k_new.view(), v_new.view(), long_slots.view()); },
               {"slots:", "shape [4]", "expected [3]"});
  PagedKv bad = kv;
  bad.page_size = 3;
  expect_error([&] { store_kv(bad, k_new.view(), v_new.view(), slots.view()); }, {"page_size: 3"});
  for (double value : testing::to_doubles(kv.k)) ASSERT_TRUE(std::isnan(value));
  for (double value : testing::to_doubles(kv.v)) ASSERT_TRUE(std::isnan(value));
}

TEST(StoreLatentValidation, RejectsAndWritesNothing) {
  HostMlaCache cache({2, 4, 16, 4, DType::kBF16});
  const PagedLatent latent = cache.paged(2);
  const TensorView whole = TensorView::contiguous(latent.ckv.data, DType::kBF16, {2, 4, 20});
  testing::poison(whole);
  HostTensor ckv_new(DType::kBF16, {2, 16}), kpe_new(DType::kBF16, {2, 4});
  HostTensor slots(DType::kI64, {2});
  slots.data<int64_t>()[0] = 3;
  slots.data<int64_t>()[1] = 8;
  expect_error([&] { store_latent(latent, ckv_new.view(), kpe_new.view(), slots.view()); },
               {"slots[1]", "slot 8 is out of range"});
  slots.data<int64_t>()[1] = 7;
  HostTensor wide_kpe(DType::kBF16, {2, 8});
  expect_error([&] { store_latent(latent, ckv_new.view(), wide_kpe.view(), slots.view()); },
               {"kpe_new:", "shape [2, 8]", "[2, 4]"});
  HostTensor narrow_ckv(DType::kBF16, {2, 15});
  expect_error([&] { store_latent(latent, narrow_ckv.view(), kpe_new.view(), slots.view()); },
               {"ckv_new:", "[*, 16]"});
  for (double value : testing::to_doubles(whole)) ASSERT_TRUE(std::isnan(value));
}

TEST(CopyTokensValidation, RejectsOutOfRangePagesAndCounts) {
  HostKvCache cache({2, 4, 1, 8, KvLayout::kNHD, DType::kF32});
  const PagedKv kv = cache.paged(4);
  expect_error([&] { copy_tokens(kv, 2, 0, 1); }, {"src_page 2", "[0, 2)"});
  expect_error([&] { copy_tokens(kv, 0, -1, 1); }, {"dst_page -1"});
  expect_error([&] { copy_tokens(kv, 0, 1, 5); }, {"num_tokens 5", "[0, 4]"});
  HostMlaCache mla({2, 4, 16, 4, DType::kBF16});
  expect_error([&] { copy_tokens(mla.paged(4), 0, 3, 1); }, {"dst_page 3"});
}

}  // namespace
}  // namespace pagedattn
