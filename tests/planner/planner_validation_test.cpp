// Every validation error of the planner: the message names the argument, the request index, the
// position and the value, and nothing is written. validate = false skips the data checks but
// never the buffer capacities.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "pagedattn/error.h"
#include "planner/batch_maker.h"

namespace pagedattn {
namespace {

using testing::EngineBatch;

constexpr int32_t kSentinel = 0x5a5a5a5a;

// Plans `in`, expects an Error whose message holds every needle, and checks nothing was written.
void expect_plan_error(const PlanInput& in, const std::vector<std::string>& needles,
                       int32_t max_batch = 16, int64_t max_pages = 4096) {
  PlanStorage s(max_batch, max_pages);
  for (auto* v : {&s.qo_indptr, &s.kv_indptr, &s.kv_indices, &s.kv_last_page_len, &s.kv_lens}) {
    std::fill(v->begin(), v->end(), kSentinel);
  }
  try {
    plan(in, s.buffers());
    ADD_FAILURE() << "no error; expected one mentioning " << fmt::format("{}", needles[0]);
    return;
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "message '" << message << "' lacks '" << needle << "'";
    }
  }
  for (auto* v : {&s.qo_indptr, &s.kv_indptr, &s.kv_indices, &s.kv_last_page_len, &s.kv_lens}) {
    for (int32_t value : *v) ASSERT_EQ(value, kSentinel) << "an output was written";
  }
}

class PlannerValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::fresh_seed();
    std::mt19937_64 rng(seed_);
    // Request 1 spans three allocation pages (the last partial) so middle positions exist.
    batch_ = testing::make_batch(rng, 16, {20, 40, 0, 16}, true);
  }
  int32_t& block(int32_t r, int64_t i) { return batch_.block_table[r * batch_.block_stride + i]; }
  int32_t& slot(int32_t r, int64_t t) { return batch_.slots[r * batch_.slot_stride + t]; }

  uint64_t seed_ = 0;
  EngineBatch batch_;
};

TEST_F(PlannerValidation, ValidBatchPlans) {
  PlanStorage s(4, 64);
  EXPECT_NO_THROW(plan(batch_.input(false, 4), s.buffers()));
  EXPECT_NO_THROW(plan(batch_.input(true, 4), s.buffers()));
}

TEST_F(PlannerValidation, PageSizeMustDivideAllocPageSize) {
  expect_plan_error(batch_.input(false, 3), {"page_size (P) = 3", "alloc_page_size = 16"});
  expect_plan_error(batch_.input(true, 32), {"page_size (P) = 32"});
  expect_plan_error(batch_.input(false, 0), {"page_size (P) = 0"});
  PlanInput in = batch_.input(false, 1);
  in.alloc_page_size = 0;
  expect_plan_error(in, {"alloc_page_size = 0"});
}

TEST_F(PlannerValidation, BlockIdOutOfRange) {
  block(1, 2) = static_cast<int32_t>(batch_.num_alloc_pages);
  expect_plan_error(batch_.input(false, 16),
                    {"block_table[1][2]", fmt::format("= {}", batch_.num_alloc_pages),
                     "out of range", fmt::format("[0, {})", batch_.num_alloc_pages)});
  block(1, 2) = -1;
  expect_plan_error(batch_.input(false, 4), {"block_table[1][2] = -1", "out of range"});
}

TEST_F(PlannerValidation, UnusedBlockEntriesAreNotRead) {
  block(0, 2) = -99;  // request 0 has 20 tokens: two blocks
  PlanStorage s(4, 64);
  EXPECT_NO_THROW(plan(batch_.input(false, 16), s.buffers()));
}

TEST_F(PlannerValidation, SeqLenMustFitTheRow) {
  batch_.seq_lens[3] = static_cast<int32_t>(batch_.block_stride * 16 + 1);
  expect_plan_error(batch_.input(false, 16),
                    {fmt::format("seq_lens[3] = {}", batch_.seq_lens[3]), "row_stride"});
  batch_.seq_lens[3] = static_cast<int32_t>(batch_.slot_stride + 1);
  expect_plan_error(batch_.input(true, 16),
                    {fmt::format("seq_lens[3] = {}", batch_.seq_lens[3]), "row_stride"});
  batch_.seq_lens[3] = -2;
  expect_plan_error(batch_.input(false, 16), {"seq_lens[3] = -2"});
}

TEST_F(PlannerValidation, QLenMustNotExceedSeqLen) {
  batch_.q_lens[1] = 41;
  expect_plan_error(batch_.input(false, 16), {"q_lens[1] = 41", "seq_lens[1] = 40"});
  batch_.q_lens[1] = -1;
  expect_plan_error(batch_.input(true, 16), {"q_lens[1] = -1"});
}

TEST_F(PlannerValidation, SlotAtPageStartMustBeAligned) {
  slot(1, 16) += 1;
  expect_plan_error(batch_.input(true, 4), {"slots[1][16]", "multiple of alloc_page_size 16"});
}

TEST_F(PlannerValidation, EveryTokenOfAPageIsChecked) {
  // Middle and last token of a page, not only the page starts: positions 21 and 31 of request 1,
  // and the last (partial-page) token 39.
  for (int64_t position : {21, 31, 39}) {
    SCOPED_TRACE(fmt::format("seed {} position {}", seed_, position));
    const int32_t saved = slot(1, position);
    slot(1, position) = saved + 1;
    expect_plan_error(batch_.input(true, 16),
                      {fmt::format("slots[1][{}] = {}", position, saved + 1),
                       fmt::format("expected {}", saved), "contiguous"});
    slot(1, position) = saved;
  }
}

TEST_F(PlannerValidation, SlotPageOutOfRange) {
  const int32_t base = static_cast<int32_t>(batch_.num_alloc_pages * 16);
  for (int32_t t = 0; t < 16; ++t) slot(3, t) = base + t;
  expect_plan_error(batch_.input(true, 16),
                    {fmt::format("slots[3][0] = {}", base),
                     fmt::format("page {} out of range", batch_.num_alloc_pages)});
  slot(3, 0) = -16;
  expect_plan_error(batch_.input(true, 16), {"slots[3][0] = -16", "negative"});
}

TEST_F(PlannerValidation, BufferCapacities) {
  const PlanInput in = batch_.input(false, 4);  // 5 + 10 + 0 + 4 = 19 attention pages
  expect_plan_error(in, {"kv_indices", "19"}, 4, 18);
  PlanStorage ok(4, 19);
  EXPECT_NO_THROW(plan(in, ok.buffers()));
  const struct {
    const char* name;
    std::span<int32_t> PlanBuffers::*field;
  } fields[] = {{"qo_indptr", &PlanBuffers::qo_indptr},
                {"kv_indptr", &PlanBuffers::kv_indptr},
                {"kv_last_page_len", &PlanBuffers::kv_last_page_len},
                {"kv_lens", &PlanBuffers::kv_lens}};
  for (const auto& f : fields) {
    PlanStorage s(4, 19);
    PlanBuffers buffers = s.buffers();
    buffers.*f.field = (buffers.*f.field).first((buffers.*f.field).size() - 1);
    try {
      plan(in, buffers);
      ADD_FAILURE() << f.name << ": no error";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(f.name), std::string::npos) << error.what();
    }
  }
  // Padding counts against the capacities too, and validate = false still checks them.
  PlanInput padded = in;
  padded.padded_batch = 5;
  padded.validate = false;
  expect_plan_error(padded, {"qo_indptr", "6"}, 4, 64);
}

TEST_F(PlannerValidation, BatchShapeArguments) {
  PlanInput in = batch_.input(false, 16);
  in.padded_batch = 3;
  expect_plan_error(in, {"padded_batch = 3", "num_reqs = 4"});
  in = batch_.input(false, 16);
  in.seq_lens = in.seq_lens.first(3);
  expect_plan_error(in, {"seq_lens has 3 entries", "num_reqs = 4"});
  in = batch_.input(false, 16);
  in.q_lens = in.q_lens.first(2);
  expect_plan_error(in, {"q_lens has 2 entries"});
  in = batch_.input(false, 16);
  in.table =
      BlockTableInput{std::span<const int32_t>(batch_.block_table).first(5), batch_.block_stride};
  expect_plan_error(in, {"block_table has 5 entries"});
  in.table = SlotTableInput{batch_.slots, int64_t{1} << 62};  // product overflows int64
  expect_plan_error(in, {"slots has", "row_stride = 4 x 4611686018427387904"});
  in = batch_.input(true, 16);
  in.num_reqs = -1;
  expect_plan_error(in, {"num_reqs = -1"});
}

TEST_F(PlannerValidation, TrustedPathSkipsDataChecks) {
  block(1, 0) = static_cast<int32_t>(batch_.num_alloc_pages) + 3;
  PlanInput in = batch_.input(false, 16);
  in.validate = false;
  PlanStorage s(4, 64);
  plan(in, s.buffers());
  EXPECT_EQ(s.kv_indices[s.kv_indptr[1]], batch_.num_alloc_pages + 3);
}

}  // namespace
}  // namespace pagedattn
