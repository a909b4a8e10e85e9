// Step::sampling on the CPU model: a prefill of eight fixture prompts with every row's logits
// (LogitsRows::kAll), two rows in three sampled by the model with random parameters (every filter
// and edge value), run twice over the same pool slots: without sampling (every row's logits) and
// with. The sampled rows' tokens and logprobs are ops::RowSampler's over the first run's row
// (the CPU model is deterministic: exactly), Logits::values holds exactly the other rows in row
// order, Logits::sampled has token -1 for them. (The CUDA model's counterpart:
// tests/model/cuda/sampling_cuda_test.cpp; bad specs: forward_errors_test.)
#include <gtest/gtest.h>

#include <random>

#include "common/sampling_reference.h"
#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"

namespace pagedattn::model {
namespace {

TEST(ForwardSampling, SampledRowsAreTheReferenceDrawOverTheRowsLogits) {
  const testing::Fixture fixture = testing::Fixture::load("qwen3_bf16");
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  Model model(checkpoint.config(), checkpoint.weights(), testing::cpu_options());
  KvPoolConfig pool_config;
  pool_config.alloc_page_size = 16;
  pool_config.dtype = DType::kF32;
  pool_config.num_pages = 64;
  KvPool pool = model.make_kv_pool(pool_config);
  testing::PageSource pages(pool.num_pages(), 3);
  std::vector<testing::Sequence> seqs(8);
  Step step;
  step.rows = LogitsRows::kAll;
  int64_t rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int32_t>& prompt = fixture.prompts[i % fixture.prompts.size()].prompt;
    seqs[i].reserve(static_cast<int64_t>(prompt.size()), 16, pages);
    step.requests.push_back({prompt, 0, {}, seqs[i].block_table});
    rows += static_cast<int64_t>(prompt.size());
  }
  const Logits full = model.forward(step, pool);
  ASSERT_EQ(full.rows, rows);
  EXPECT_TRUE(full.sampled.empty());
  std::mt19937_64 rng(21);
  for (int64_t r = 0; r < rows; ++r) {
    const auto spec = ::pagedattn::testing::random_sampling_spec(rng, full.vocab);
    ops::RowSampling row = ::pagedattn::testing::to_row_sampling(spec);
    row.sample = r % 3 != 2;
    step.sampling.push_back(row);
  }
  const Logits sampled = model.forward(step, pool);
  ASSERT_EQ(sampled.rows, rows);
  ASSERT_EQ(sampled.sampled.size(), static_cast<size_t>(rows));
  ops::RowSampler reference;
  int64_t value_row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const ops::SampledToken& got = sampled.sampled[static_cast<size_t>(r)];
    if (!step.sampling[static_cast<size_t>(r)].sample) {
      EXPECT_EQ(got.token, -1);
      const std::span<const float> want = full.row(r), row = sampled.row(value_row++);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), row.begin(), row.end()));
      continue;
    }
    const ops::RowDraw want = reference.sample(full.row(r), step.sampling[static_cast<size_t>(r)]);
    EXPECT_EQ(got.token, want.token);
    EXPECT_EQ(got.logprob, want.logprob);
  }
  EXPECT_EQ(value_row, sampled.value_rows());
}

}  // namespace
}  // namespace pagedattn::model
