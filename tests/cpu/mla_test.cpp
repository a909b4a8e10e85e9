// CPU MLA (absorbed weights) against the float64 reference: decode (one row per request),
// speculative decode (2..4 rows), extend (causal and not) over the latent cache, whose ckv and kpe
// are slices of one [pages, alloc, rank + rope] buffer. Head counts 16..128, page sizes, dtypes,
// padding, split KV. Most cases use a small rank (64 + 16) to keep the reference cheap; the
// DeepSeek shape (512 + 64) runs with short contexts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "cpu/cpu_test_util.h"

namespace pagedattn::testing {
namespace {

CaseSpec base_mla() {
  CaseSpec spec;
  spec.op = OpKind::kMlaDecode;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 16;
  spec.num_kv_heads = 1;
  spec.head_dim_qk = 64 + 16;
  spec.head_dim_vo = 64;
  spec.page_size = 16;
  spec.kv_lens = {1, 15, 16, 17, 150};
  spec.sm_scale = 1.0f / std::sqrt(192.0f) * 1.3f;  // DeepSeek-style: not derived from the dims
  return with_power(spec);
}

std::vector<CaseSpec> mla_cases() {
  std::vector<CaseSpec> cases;
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kF16, DType::kF16},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kBF16, DType::kFP8E4M3}};
  for (auto [q, kv] : dtypes) {
    CaseSpec spec = base_mla();
    spec.q_dtype = q;
    spec.kv_dtype = kv;
    if (kv == DType::kFP8E4M3) spec.kv_scale = 0.5f;
    cases.push_back(spec);
  }
  for (int32_t heads : {20, 64, 128}) {
    CaseSpec spec = base_mla();
    spec.num_qo_heads = heads;
    spec.kv_lens = {1, 40};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla();  // the DeepSeek shape
    spec.head_dim_qk = 576;
    spec.head_dim_vo = 512;
    spec.kv_lens = {1, 17, 70};
    cases.push_back(spec);
  }
  for (int32_t page : {1, 64}) {
    CaseSpec spec = base_mla();
    spec.page_size = page;
    spec.alloc_page_size = page * 2;
    spec.kv_lens = {1, std::max(1, page - 1), page, page + 1, 150};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla();  // speculative decoding: 1..4 query rows per request, causal
    spec.q_lens = {1, 2, 4, 3, 4};
    cases.push_back(spec);
  }
  for (bool causal : {true, false}) {
    CaseSpec spec = base_mla();
    spec.op = OpKind::kMlaExtend;
    spec.q_dtype = spec.kv_dtype = DType::kF32;
    spec.kv_lens = {1, 15, 40, 90};
    spec.q_lens = {1, 15, 7, 30};
    spec.causal = causal;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla();
    spec.padded_batch = 8;
    spec.with_lse = false;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla();  // flat softmax: the plain uniform inputs
    spec.logit_std = 0;
    spec.dominant_keys = 0;
    spec.v_mean = 0;
    cases.push_back(spec);
  }
  return cases;
}

class MlaTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(MlaTest, MatchesReference) {
  const uint64_t seed = fresh_seed();
  const std::string report = run_and_check(GetParam(), seed);
  EXPECT_TRUE(report.empty()) << report;
}

TEST_P(MlaTest, MatchesReferenceWithSplitKv) {
  CaseSpec spec = GetParam();
  spec.kv_lens = {600};
  spec.q_lens = spec.q_lens.empty() ? std::vector<int32_t>{} : std::vector<int32_t>{2};
  spec.padded_batch = 0;
  spec.with_lse = true;  // whatever the base case: split partials merge through lse
  const uint64_t seed = fresh_seed();
  const std::string report = run_and_check(spec, seed, {.threads = 8, .min_kv_chunks = 2});
  EXPECT_TRUE(report.empty()) << report;
}

INSTANTIATE_TEST_SUITE_P(Cpu, MlaTest, ::testing::ValuesIn(mla_cases()), case_name);

TEST(MlaCorners, PageSizeInvariance) {
  CaseSpec spec = base_mla();
  spec.q_dtype = spec.kv_dtype = DType::kF32;
  EXPECT_EQ(check_page_size_invariance(spec, fresh_seed()), "");
}

// The long MLA request (6,000 keys), split across 8 threads, bf16, inputs with power.
TEST(LongSplitKv, Mla6000Keys) {
  CaseSpec spec = base_mla();
  spec.kv_lens = {6000};
  EXPECT_EQ(run_and_check(spec, fresh_seed(), {.threads = 8, .min_kv_chunks = 3}), "");
}

}  // namespace
}  // namespace pagedattn::testing
