// StepPlanner::prepare with padded_batch (src/model/forward_step.h), the host side of the CUDA
// model's graph steps, checked on the CPU: a decode step of 3 requests padded to 8 gives the
// requests' ids, positions and slots (page * alloc + offset, from their block tables, computed
// here) followed by padding rows (id 0, position 0, slot -1: nothing stored), and metadata of 8
// requests whose padding ones have one query row and no pages (kv_last_page_len 0), the real ones
// their pages in table order; padding a step that is not all decode, or to fewer requests than it
// has, is an Error naming padded_batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/forward_step.h"
#include "pagedattn/error.h"
#include "pagedattn/model_random.h"

namespace pagedattn::model {
namespace {

std::vector<int32_t> ints(const TensorView& view) {
  const auto* data = view.data_as<const int32_t>();
  return std::vector<int32_t>(data, data + view.shape[0]);
}

TEST(StepPlannerPadding, PaddingRowsStoreNothingAndAttendToNothing) {
  const ModelConfig config = model_shape("tiny");
  KvPoolConfig pool_config;
  pool_config.alloc_page_size = 16;
  pool_config.page_size = 4;  // 4 attention pages per allocation page
  pool_config.dtype = DType::kF32;
  pool_config.num_pages = 64;
  const KvPool pool(config, pool_config);
  ModelOptions options;
  options.device = "cpu";
  const ops::RopeTable rope = make_rope_table(config, options);
  StepPlanner planner(config, Selection::parse("cpu"));

  // Cached lengths 0, 20 and 35: sequence lengths 1, 21, 36 with the new token.
  const std::vector<int32_t> cached = {0, 20, 35};
  const std::vector<std::vector<int32_t>> tables = {{7}, {3, 9}, {12, 5, 40}};
  const std::vector<int32_t> tokens = {11, 22, 33};
  Step step;
  for (size_t r = 0; r < 3; ++r) {
    step.requests.push_back(
        {std::span<const int32_t>(tokens).subspan(r, 1), cached[r], {}, tables[r]});
  }
  const StepContext& ctx = planner.prepare(step, pool, rope, 8);
  ASSERT_EQ(ctx.tokens, 8);
  EXPECT_TRUE(ctx.decode);
  const std::vector<int32_t> ids(planner.token_ids().begin(), planner.token_ids().end());
  EXPECT_EQ(ids, (std::vector<int32_t>{11, 22, 33, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ctx.positions, (std::vector<int32_t>{0, 20, 35, 0, 0, 0, 0, 0}));
  // Slot of token index i: table[i / 16] * 16 + i % 16.
  EXPECT_EQ(ctx.slots,
            (std::vector<int64_t>{7 * 16 + 0, 9 * 16 + 4, 40 * 16 + 3, -1, -1, -1, -1, -1}));
  ASSERT_EQ(ctx.meta.batch_size, 8);
  EXPECT_EQ(ints(ctx.meta.qo_indptr), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  // Attention pages of 4 tokens: ceil(1/4) = 1, ceil(21/4) = 6, ceil(36/4) = 9; page b*4 + j of
  // allocation page b.
  EXPECT_EQ(ints(ctx.meta.kv_indptr), (std::vector<int32_t>{0, 1, 7, 16, 16, 16, 16, 16, 16}));
  const std::vector<int32_t> indices = ints(ctx.meta.kv_indices);
  const std::vector<int32_t> expected_indices = {28,                      // 7 * 4
                                                 12, 13, 14, 15, 36, 37,  // 3 * 4 .., 9 * 4 ..
                                                 48, 49, 50, 51, 20, 21,
                                                 22, 23, 160};  // 12 * 4 .., 5 * 4 .., 40 * 4
  ASSERT_GE(indices.size(), expected_indices.size());
  EXPECT_EQ(std::vector<int32_t>(indices.begin(), indices.begin() + 16), expected_indices);
  EXPECT_EQ(ints(ctx.meta.kv_last_page_len), (std::vector<int32_t>{1, 1, 4, 0, 0, 0, 0, 0}));

  // Without padding, the same step has 3 requests.
  const StepContext& plain = planner.prepare(step, pool, rope);
  EXPECT_EQ(plain.tokens, 3);
  EXPECT_EQ(plain.meta.batch_size, 3);
}

TEST(StepPlannerPadding, OnlyDecodeStepsOfAtMostThatManyRequests) {
  const ModelConfig config = model_shape("tiny");
  KvPoolConfig pool_config;
  pool_config.dtype = DType::kF32;
  pool_config.num_pages = 16;
  const KvPool pool(config, pool_config);
  ModelOptions options;
  options.device = "cpu";
  const ops::RopeTable rope = make_rope_table(config, options);
  StepPlanner planner(config, Selection::parse("cpu"));
  const std::vector<int32_t> prompt = {1, 2, 3}, one = {4}, table = {0}, other = {1};
  const auto message = [&](const Step& step, int32_t padded) {
    try {
      planner.prepare(step, pool, rope, padded);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  Step prefill;
  prefill.requests.push_back({prompt, 0, {}, table});
  EXPECT_NE(message(prefill, 4).find("padded_batch 4 for 1 requests (not decode"),
            std::string::npos)
      << message(prefill, 4);
  Step decode;
  decode.requests.push_back({one, 3, {}, table});
  decode.requests.push_back({one, 0, {}, other});
  EXPECT_NE(message(decode, 1).find("padded_batch 1 for 2 requests (decode"), std::string::npos)
      << message(decode, 1);
  EXPECT_EQ(message(decode, 2), "");
}

}  // namespace
}  // namespace pagedattn::model
