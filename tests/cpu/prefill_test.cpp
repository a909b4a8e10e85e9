// CPU prefill / extend against the float64 reference: ragged query rows over a cached prefix
// (mixed decode rows q_len 1 and prefill rows in one batch), causal aligned to the end of the KV
// or not, head_dim_qk != head_dim_vo (192 / 128), windows, soft-cap, page sizes, layouts, dtypes,
// padding (requests with no query rows), query tiles and split KV.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cpu/cpu_test_util.h"

namespace pagedattn::testing {
namespace {

CaseSpec base_prefill() {
  CaseSpec spec;
  spec.op = OpKind::kPrefill;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 64;
  spec.page_size = 16;
  spec.kv_lens = {1, 15, 16, 17, 130};
  spec.q_lens = {1, 15, 5, 1, 70};  // decode rows (q_len 1) beside prefill and extend rows
  return with_power(spec);
}

std::vector<CaseSpec> prefill_cases() {
  std::vector<CaseSpec> cases;
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kF16, DType::kF16},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kBF16, DType::kFP8E4M3},
                                            {DType::kF16, DType::kF32}};
  for (auto [q, kv] : dtypes) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      CaseSpec spec = base_prefill();
      spec.q_dtype = q;
      spec.kv_dtype = kv;
      spec.layout = layout;
      if (kv == DType::kFP8E4M3) spec.kv_scale = 2.0f;
      cases.push_back(spec);
    }
  }
  for (auto [qk, vo] : {std::pair{192, 128}, {128, 128}, {16, 16}, {256, 256}, {128, 64}}) {
    CaseSpec spec = base_prefill();
    spec.q_dtype = spec.kv_dtype = DType::kF32;
    spec.head_dim_qk = qk;
    spec.head_dim_vo = vo;
    cases.push_back(spec);
  }
  for (auto [hq, hkv] : {std::pair{3, 3}, {6, 2}, {10, 2}, {14, 2}, {12, 1}, {24, 2}}) {
    CaseSpec spec = base_prefill();
    spec.num_qo_heads = hq;
    spec.num_kv_heads = hkv;
    cases.push_back(spec);
  }
  for (int32_t page : {1, 5, 64}) {
    CaseSpec spec = base_prefill();
    spec.page_size = page;
    spec.alloc_page_size = page == 5 ? 20 : page;
    spec.kv_lens = {1, std::max(1, page - 1), page, page + 1, 150};
    spec.q_lens = {1, std::max(1, page - 1) / 2 + 1, page, 1, 100};
    cases.push_back(spec);
  }
  for (bool causal : {true, false}) {
    for (int32_t window : {-1, 0, 9}) {
      if (causal && window < 0) continue;  // the base
      CaseSpec spec = base_prefill();
      spec.q_dtype = spec.kv_dtype = DType::kF32;
      spec.causal = causal;
      spec.window_left = window;
      cases.push_back(spec);
    }
  }
  {
    CaseSpec spec = base_prefill();
    spec.q_dtype = spec.kv_dtype = DType::kF32;
    spec.logits_soft_cap = 4.0f;
    spec.logit_std = 6.0f;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_prefill();  // soft-cap with a window, not causal: masked keys weigh 0
    spec.q_dtype = spec.kv_dtype = DType::kBF16;
    spec.logits_soft_cap = 4.0f;
    spec.logit_std = 6.0f;
    spec.causal = false;
    spec.window_left = 9;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_prefill();  // padding requests with no query rows and no KV
    spec.padded_batch = 8;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_prefill();  // a whole-prompt prefill (no cached prefix) of many tiles
    spec.kv_lens = {200, 33};
    spec.q_lens = {200, 33};
    spec.with_lse = false;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_prefill();  // flat softmax: the plain uniform inputs
    spec.logit_std = 0;
    spec.dominant_keys = 0;
    spec.v_mean = 0;
    cases.push_back(spec);
  }
  return cases;
}

class PrefillTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(PrefillTest, MatchesReference) {
  const uint64_t seed = fresh_seed();
  const std::string report = run_and_check(GetParam(), seed);
  EXPECT_TRUE(report.empty()) << report;
}

// One request with few query rows and a long prefix, on a workspace for 8 threads: the KV is
// split into chunks and the partial outputs merged (including chunks a causal row cannot see).
TEST_P(PrefillTest, MatchesReferenceWithSplitKv) {
  CaseSpec spec = GetParam();
  spec.kv_lens = {700};
  spec.q_lens = {3};
  spec.padded_batch = 0;
  spec.with_lse = true;  // whatever the base case: split partials merge through lse
  const uint64_t seed = fresh_seed();
  const std::string report = run_and_check(spec, seed, {.threads = 8, .min_kv_chunks = 2});
  EXPECT_TRUE(report.empty()) << report;
}

INSTANTIATE_TEST_SUITE_P(Cpu, PrefillTest, ::testing::ValuesIn(prefill_cases()), case_name);

TEST(PrefillCorners, RowsWithoutKeys) {
  // kv_len 0 with a query row (out 0, lse -inf; one row is the most a request without KV may have:
  // q_len > kv_len is an error, validation_test.cpp), and a window of 0 under non-causal masking.
  CaseSpec spec = base_prefill();
  spec.kv_lens = {0, 4, 0};
  spec.q_lens = {1, 4, 0};
  EXPECT_EQ(run_and_check(spec, fresh_seed()), "");
}

TEST(PrefillCorners, PageSizeInvariance) {
  CaseSpec spec = base_prefill();
  spec.q_dtype = spec.kv_dtype = DType::kF32;
  EXPECT_EQ(check_page_size_invariance(spec, fresh_seed()), "");
}

}  // namespace
}  // namespace pagedattn::testing
