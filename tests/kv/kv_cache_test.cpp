// store_kv / store_latent / copy_tokens against an independent index computation.
//
// The cache is poisoned, a batch of tokens with shuffled slots (padding slots included) is
// stored, and then every element of the pool is visited by its flat row-major index: the
// (page, offset, head, dim) it stands for is decoded here from the layout's definition, the slot
// page * alloc_page_size + offset is looked up in a slot -> token map, and the element must equal
// the token's input rounded to the cache dtype (fp8: value / scale, read back times scale), or
// still be poison when no token was stored there.
#include "pagedattn/kv_cache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "pagedattn/error.h"

namespace pagedattn {
namespace {

// What an input value reads back as from a cache of `dtype` with `scale`.
double stored_value(double input, DType dtype, float scale) {
  const float value = static_cast<float>(input);
  switch (dtype) {
    case DType::kF32:
      return value;
    case DType::kF16:
      return half_to_float(float_to_half(value));
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(value));
    case DType::kFP8E4M3:
      return double{fp8e4m3_to_float(float_to_fp8e4m3(value / scale))} * scale;
    default:
      return NAN;
  }
}

// `num_tokens` distinct random slots in [0, num_slots), with every third token padding (-1).
std::vector<int64_t> random_slots(int64_t num_tokens, int64_t num_slots, std::mt19937_64& rng) {
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(num_tokens));
  for (int64_t t = 0; t < num_tokens; ++t) slots[t] = t % 3 == 2 ? -1 : all[t];
  return slots;
}

HostTensor slot_tensor(const std::vector<int64_t>& slots, DType dtype) {
  HostTensor tensor(dtype, {static_cast<int64_t>(slots.size())});
  for (size_t i = 0; i < slots.size(); ++i) {
    if (dtype == DType::kI32) {
      tensor.data<int32_t>()[i] = static_cast<int32_t>(slots[i]);
    } else {
      tensor.data<int64_t>()[i] = slots[i];
    }
  }
  return tensor;
}

std::map<int64_t, int64_t> token_of_slot(const std::vector<int64_t>& slots) {
  std::map<int64_t, int64_t> map;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] >= 0) map[slots[t]] = static_cast<int64_t>(t);
  }
  return map;
}

struct StoreCase {
  KvLayout layout;
  DType cache_dtype;
  DType input_dtype;
  DType slot_dtype;
};

std::string case_name(const ::testing::TestParamInfo<StoreCase>& info) {
  const StoreCase& c = info.param;
  return fmt::format("{}_{}_from_{}_{}", layout_name(c.layout), dtype_name(c.cache_dtype),
                     dtype_name(c.input_dtype), dtype_name(c.slot_dtype));
}

std::vector<StoreCase> all_cases() {
  std::vector<StoreCase> cases;
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
    for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3}) {
      for (DType input : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (DType slot : {DType::kI32, DType::kI64}) cases.push_back({layout, cache, input, slot});
      }
    }
  }
  return cases;
}

class StoreKvTest : public ::testing::TestWithParam<StoreCase> {};

TEST_P(StoreKvTest, EveryElementMatchesIndependentIndexing) {
  const StoreCase c = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const int64_t pages = 5, alloc = 4, heads = 3, dim = 16, tokens = 14;
  HostKvCache cache({pages, alloc, heads, dim, c.layout, c.cache_dtype});
  const float k_scale = c.cache_dtype == DType::kFP8E4M3 ? 0.37f : 1.0f;
  const float v_scale = c.cache_dtype == DType::kFP8E4M3 ? 3.1f : 1.0f;
  const PagedKv kv = cache.paged(2, k_scale, v_scale);
  testing::poison(kv.k);
  testing::poison(kv.v);

  HostTensor k_new(c.input_dtype, {tokens, heads, dim}), v_new(c.input_dtype, {tokens, heads, dim});
  testing::fill_uniform(k_new.view(), rng, -4.0f, 4.0f);
  testing::fill_uniform(v_new.view(), rng, -40.0f, 40.0f);
  const std::vector<int64_t> slots = random_slots(tokens, pages * alloc, rng);
  const HostTensor slot_view = slot_tensor(slots, c.slot_dtype);
  store_kv(kv, k_new.view(), v_new.view(), slot_view.view());

  const std::map<int64_t, int64_t> writer = token_of_slot(slots);
  for (const auto& [pool, input, scale, what] : {std::tuple{kv.k, k_new.view(), k_scale, "k"},
                                                 std::tuple{kv.v, v_new.view(), v_scale, "v"}}) {
    int64_t bad = 0;
    for (int64_t flat = 0; flat < pool.numel(); ++flat) {
      // Decode the flat row-major index by the layout's definition.
      const int64_t d = flat % dim;
      const int64_t mid1 = (flat / dim) % (c.layout == KvLayout::kNHD ? heads : alloc);
      const int64_t mid0 = (flat / dim / (c.layout == KvLayout::kNHD ? heads : alloc)) %
                           (c.layout == KvLayout::kNHD ? alloc : heads);
      const int64_t page = flat / (dim * heads * alloc);
      const int64_t offset = c.layout == KvLayout::kNHD ? mid0 : mid1;
      const int64_t head = c.layout == KvLayout::kNHD ? mid1 : mid0;
      const double got = testing::element(pool, flat, scale);
      const auto it = writer.find(page * alloc + offset);
      if (it == writer.end()) {
        if (!std::isnan(got) && bad++ < 5) {
          ADD_FAILURE() << what << " page " << page << " offset " << offset << " head " << head
                        << " dim " << d << ": written (" << got << ") but no token has the slot";
        }
        continue;
      }
      const double input_value = testing::element(input, (it->second * heads + head) * dim + d);
      const double expected = stored_value(input_value, c.cache_dtype, scale);
      if (!(got == expected) && bad++ < 5) {
        ADD_FAILURE() << what << " page " << page << " offset " << offset << " head " << head
                      << " dim " << d << ": got " << got << ", expected " << expected << " (token "
                      << it->second << ")";
      }
    }
    EXPECT_EQ(bad, 0) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, StoreKvTest, ::testing::ValuesIn(all_cases()), case_name);

struct LatentCase {
  DType cache_dtype;
  DType input_dtype;
  DType slot_dtype;
};

class StoreLatentTest : public ::testing::TestWithParam<LatentCase> {};

TEST_P(StoreLatentTest, OneRowPerTokenInTheSharedBuffer) {
  const LatentCase c = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const int64_t pages = 4, alloc = 8, rank = 32, rope = 8, tokens = 20;
  HostMlaCache cache({pages, alloc, rank, rope, c.cache_dtype});
  const float scale = c.cache_dtype == DType::kFP8E4M3 ? 0.7f : 1.0f;
  const PagedLatent latent = cache.paged(4, scale);
  // The whole buffer, addressed independently: [pages, alloc, rank + rope], contiguous.
  const TensorView whole =
      TensorView::contiguous(latent.ckv.data, c.cache_dtype, {pages, alloc, rank + rope});
  ASSERT_EQ(static_cast<char*>(latent.kpe.data) - static_cast<char*>(latent.ckv.data),
            rank * dtype_size(c.cache_dtype));
  testing::poison(whole);

  HostTensor ckv_new(c.input_dtype, {tokens, rank}), kpe_new(c.input_dtype, {tokens, rope});
  testing::fill_uniform(ckv_new.view(), rng, -3.0f, 3.0f);
  testing::fill_uniform(kpe_new.view(), rng, -3.0f, 3.0f);
  const std::vector<int64_t> slots = random_slots(tokens, pages * alloc, rng);
  const HostTensor slot_view = slot_tensor(slots, c.slot_dtype);
  store_latent(latent, ckv_new.view(), kpe_new.view(), slot_view.view());

  const std::map<int64_t, int64_t> writer = token_of_slot(slots);
  int64_t bad = 0;
  for (int64_t flat = 0; flat < whole.numel(); ++flat) {
    const int64_t i = flat % (rank + rope), slot = flat / (rank + rope);
    const double got = testing::element(whole, flat, scale);
    const auto it = writer.find(slot);
    double expected = NAN;
    if (it != writer.end()) {
      const double input = i < rank
                               ? testing::element(ckv_new.view(), it->second * rank + i)
                               : testing::element(kpe_new.view(), it->second * rope + i - rank);
      expected = stored_value(input, c.cache_dtype, scale);
    }
    const bool ok = std::isnan(expected) ? std::isnan(got) : got == expected;
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << "slot " << slot << " element " << i << ": got " << got << ", expected "
                    << expected;
    }
  }
  EXPECT_EQ(bad, 0);
}

std::vector<LatentCase> latent_cases() {
  std::vector<LatentCase> cases;
  for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3}) {
    for (DType input : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (DType slot : {DType::kI32, DType::kI64}) cases.push_back({cache, input, slot});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, StoreLatentTest, ::testing::ValuesIn(latent_cases()),
                         [](const ::testing::TestParamInfo<LatentCase>& info) {
                           return fmt::format("{}_from_{}_{}", dtype_name(info.param.cache_dtype),
                                              dtype_name(info.param.input_dtype),
                                              dtype_name(info.param.slot_dtype));
                         });

// A cache that is a slice of a larger buffer (page stride larger than the page) and a strided
// input: strides are honoured, nothing outside the slice is touched.
TEST(StoreKv, StridedCacheAndInput) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const int64_t pages = 3, alloc = 4, heads = 2, dim = 8;
  // Backing: [pages, alloc + 1, heads, dim]; the cache sees the first `alloc` tokens of each page.
  HostTensor k_backing(DType::kBF16, {pages, alloc + 1, heads, dim});
  HostTensor v_backing(DType::kBF16, {pages, alloc + 1, heads, dim});
  PagedKv kv{k_backing.view(), v_backing.view(), KvLayout::kNHD, 4};
  kv.k.shape[1] = kv.v.shape[1] = alloc;
  testing::poison(k_backing.view());
  testing::poison(v_backing.view());
  // Input: every second token of a [2 * tokens, heads, dim] buffer.
  const int64_t tokens = 5;
  HostTensor input(DType::kF32, {2 * tokens, heads, dim});
  testing::fill_uniform(input.view(), rng);
  TensorView k_new = input.view();
  k_new.shape[0] = tokens;
  k_new.strides[0] *= 2;
  const std::vector<int64_t> slots = {0, 5, -1, 11, 6};
  const HostTensor slot_view = slot_tensor(slots, DType::kI64);
  store_kv(kv, k_new, k_new, slot_view.view());
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t page = slots[t] / alloc, offset = slots[t] % alloc;
    for (int64_t i = 0; i < heads * dim; ++i) {
      const int64_t flat = ((page * (alloc + 1) + offset) * heads) * dim + i;
      const double expected =
          stored_value(testing::element(input.view(), 2 * t * heads * dim + i), DType::kBF16, 1.0f);
      EXPECT_EQ(testing::element(k_backing.view(), flat), expected) << t << " " << i;
      EXPECT_EQ(testing::element(v_backing.view(), flat), expected) << t << " " << i;
    }
  }
  // The extra token of each page is outside the view: still poison.
  for (int64_t page = 0; page < pages; ++page) {
    for (int64_t i = 0; i < heads * dim; ++i) {
      EXPECT_TRUE(std::isnan(
          testing::element(k_backing.view(), (page * (alloc + 1) + alloc) * heads * dim + i)));
    }
  }
}

TEST(StoreKv, EmptyBatchAndAllPaddingWriteNothing) {
  HostKvCache cache({2, 4, 1, 8, KvLayout::kHND, DType::kF16});
  const PagedKv kv = cache.paged(4);
  testing::poison(kv.k);
  HostTensor none(DType::kF32, {0, 1, 8});
  const HostTensor no_slots = slot_tensor({}, DType::kI32);
  store_kv(kv, none.view(), none.view(), no_slots.view());
  HostTensor two(DType::kF32, {2, 1, 8});
  const HostTensor padding = slot_tensor({-1, -7}, DType::kI32);
  store_kv(kv, two.view(), two.view(), padding.view());
  for (double value : testing::to_doubles(kv.k)) EXPECT_TRUE(std::isnan(value));
}

// copy_tokens: the first n tokens of the source page land in the destination page; the rest of
// the destination and every other page are untouched.
TEST(CopyTokens, PartialPageBothLayoutsAndLatent) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
    const int64_t pages = 3, alloc = 8, heads = 2, dim = 4, copied = 5;
    HostKvCache cache({pages, alloc, heads, dim, layout, DType::kF32});
    const PagedKv kv = cache.paged(8);
    testing::fill_uniform(kv.k, rng);
    testing::fill_uniform(kv.v, rng);
    const std::vector<double> k_before = testing::to_doubles(kv.k);
    copy_tokens(kv, 2, 0, copied);
    const std::vector<double> k_after = testing::to_doubles(kv.k);
    for (int64_t flat = 0; flat < kv.k.numel(); ++flat) {
      const int64_t page = flat / (alloc * heads * dim);
      const int64_t within = flat % (alloc * heads * dim);
      const int64_t offset =
          layout == KvLayout::kNHD ? within / (heads * dim) : (within / dim) % alloc;
      const bool copied_here = page == 0 && offset < copied;
      const double expected =
          copied_here ? k_before[2 * alloc * heads * dim + within] : k_before[flat];
      EXPECT_EQ(k_after[flat], expected) << layout_name(layout) << " " << flat;
    }
  }
  HostMlaCache mla({2, 4, 16, 4, DType::kBF16});
  const PagedLatent latent = mla.paged(2);
  const TensorView whole = TensorView::contiguous(latent.ckv.data, DType::kBF16, {2, 4, 20});
  testing::fill_uniform(whole, rng);
  const std::vector<double> before = testing::to_doubles(whole);
  copy_tokens(latent, 0, 1, 3);
  const std::vector<double> after = testing::to_doubles(whole);
  for (int64_t flat = 0; flat < whole.numel(); ++flat) {
    const bool copied_here = flat >= 80 && flat < 80 + 3 * 20;
    EXPECT_EQ(after[flat], copied_here ? before[flat - 80] : before[flat]) << flat;
  }
}

}  // namespace
}  // namespace pagedattn
