// Scheduler unit tests, with a page allocator and no model: the order inside a step (decodes,
// then running prefill chunks, then admissions), the token budget and chunked prefill
// (positions, block tables, logit rows), max_running, preemption of the newest by recompute,
// rejection of what the pool can never hold, prefix-cache admission, n > 1 sharing.
#include <gtest/gtest.h>

#include <memory>

#include "pagedattn/engine_scheduler.h"

namespace pagedattn::engine {
namespace {

struct Fixture {
  Fixture(int32_t num_pages, int32_t page_size, SchedulerConfig config, bool cache = false)
      : allocator(num_pages, page_size), kv(allocator, cache), scheduler(config, kv) {}

  Sequence* add(int64_t prompt_length, int32_t first_token = 1) {
    auto sequence = std::make_unique<Sequence>();
    sequence->id = static_cast<SequenceId>(sequences.size());
    for (int64_t i = 0; i < prompt_length; ++i) {
      sequence->tokens.push_back(first_token + static_cast<int32_t>(i));
    }
    sequence->prompt_length = prompt_length;
    sequences.push_back(std::move(sequence));
    scheduler.add(sequences.back().get());
    return sequences.back().get();
  }

  // One step as the engine runs it, with token 7 "sampled" for each logit row.
  ScheduleResult step() {
    ScheduleResult result = scheduler.schedule();
    scheduler.complete(result);
    for (size_t i = 0; i < result.scheduled.size(); ++i) {
      if (result.plan.sequences[i].num_logit_rows == 1) result.scheduled[i]->tokens.push_back(7);
    }
    allocator.check_consistency();
    return result;
  }

  PageAllocator allocator;
  KvManager kv;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> sequences;
};

TEST(Scheduler, ChunkedPrefillPositionsBlockTablesAndLogitRows) {
  Fixture f(16, 4, {8, 4});
  Sequence* a = f.add(20);
  std::vector<int64_t> firsts, counts, rows;
  for (int i = 0; i < 3; ++i) {
    const ScheduleResult r = f.step();
    ASSERT_EQ(r.plan.sequences.size(), 1u);
    const ScheduledSequence& s = r.plan.sequences[0];
    firsts.push_back(s.first_position);
    counts.push_back(s.num_new_tokens());
    rows.push_back(s.num_logit_rows);
    EXPECT_EQ(s.token_ids.front(), 1 + s.first_position);  // the prompt's own tokens
    EXPECT_EQ(static_cast<int64_t>(s.block_table.size()), (s.context_length() + 3) / 4);
    EXPECT_EQ(r.plan.num_tokens, s.num_new_tokens());
  }
  EXPECT_EQ(firsts, (std::vector<int64_t>{0, 8, 16}));
  EXPECT_EQ(counts, (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(a->num_computed, 20);
  const ScheduleResult decode = f.step();
  ASSERT_EQ(decode.plan.sequences.size(), 1u);
  EXPECT_EQ(decode.plan.sequences[0].token_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(decode.plan.sequences[0].first_position, 20);
  EXPECT_EQ(decode.plan.num_decodes, 1);
}

TEST(Scheduler, DecodesComeFirstThenPrefillWithinTheBudget) {
  Fixture f(64, 4, {6, 8});
  f.add(3);
  f.add(3, 50);
  ASSERT_EQ(f.step().plan.num_tokens, 6);  // both prompts in one step
  Sequence* long_prompt = f.add(30, 100);
  for (int i = 0; i < 3; ++i) {
    const ScheduleResult r = f.step();
    ASSERT_EQ(r.plan.sequences.size(), 3u);
    EXPECT_EQ(r.plan.num_decodes, 2);
    EXPECT_EQ(r.plan.sequences[0].num_new_tokens(), 1);
    EXPECT_EQ(r.plan.sequences[1].num_new_tokens(), 1);
    EXPECT_EQ(r.plan.sequences[2].sequence, long_prompt->id);
    EXPECT_EQ(r.plan.sequences[2].num_new_tokens(), 4);  // what the budget leaves
    EXPECT_EQ(r.plan.num_tokens, 6);
    EXPECT_EQ(r.plan.num_logit_rows, 2);
  }
}

TEST(Scheduler, MaxRunningLimitsAdmission) {
  Fixture f(64, 4, {0, 2});
  for (int i = 0; i < 5; ++i) f.add(2);
  const ScheduleResult r = f.step();
  EXPECT_EQ(r.plan.sequences.size(), 2u);
  EXPECT_EQ(f.scheduler.num_running(), 2u);
  EXPECT_EQ(f.scheduler.num_waiting(), 3u);
}

TEST(Scheduler, OutOfPagesPreemptsTheNewestByRecompute) {
  Fixture f(4, 2, {0, 8});  // 8 token slots
  Sequence* old_one = f.add(3);
  Sequence* new_one = f.add(3, 20);
  f.step();  // both prefilled: 2 pages each, 4 tokens each after sampling
  EXPECT_EQ(f.allocator.num_free_pages(), 0);
  // Both decode position 3 within their second page; then position 4 needs a third page each.
  f.step();
  const ScheduleResult r = f.step();
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0], new_one);
  EXPECT_EQ(new_one->status, SequenceStatus::kPreempted);
  EXPECT_EQ(new_one->num_computed, 0);
  EXPECT_EQ(new_one->num_preemptions, 1);
  EXPECT_FALSE(f.allocator.has_request(new_one->id));
  ASSERT_EQ(r.plan.sequences.size(), 1u);
  EXPECT_EQ(r.plan.sequences[0].sequence, old_one->id);
  EXPECT_EQ(f.scheduler.num_waiting(), 1u);
  // The preempted sequence comes back recomputing prompt + generated tokens (5 tokens), once
  // the old one finishes.
  f.scheduler.remove(old_one);
  const ScheduleResult back = f.step();
  ASSERT_EQ(back.plan.sequences.size(), 1u);
  EXPECT_EQ(back.plan.sequences[0].first_position, 0);
  EXPECT_EQ(back.plan.sequences[0].token_ids, (std::vector<int32_t>{20, 21, 22, 7, 7}));
  EXPECT_EQ(back.plan.sequences[0].num_logit_rows, 1);
}

TEST(Scheduler, RejectsWhatThePoolCanNeverHold) {
  Fixture f(3, 4, {0, 8});
  Sequence* too_long = f.add(13);
  Sequence* fits = f.add(12);
  const ScheduleResult r = f.step();
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_EQ(r.rejected[0], too_long);
  EXPECT_EQ(too_long->status, SequenceStatus::kFinished);
  ASSERT_EQ(r.plan.sequences.size(), 1u);
  EXPECT_EQ(r.plan.sequences[0].sequence, fits->id);
}

TEST(Scheduler, PrefixCacheHitSkipsWholeCachedPages) {
  Fixture f(32, 4, {0, 8}, /*cache=*/true);
  Sequence* first = f.add(10);
  f.step();
  f.scheduler.remove(first);
  Sequence* second = f.add(10);  // same tokens: 8 tokens in 2 full pages are cached
  const ScheduleResult r = f.step();
  ASSERT_EQ(r.plan.sequences.size(), 1u);
  EXPECT_EQ(r.plan.sequences[0].first_position, 8);
  EXPECT_EQ(r.plan.sequences[0].num_new_tokens(), 2);
  EXPECT_EQ(second->num_cached_tokens, 8);
  Sequence* exact_pages = f.add(8);  // 8 tokens: at most 7 may match, so 1 page
  const ScheduleResult r2 = f.step();
  EXPECT_EQ(r2.plan.sequences.back().sequence, exact_pages->id);
  EXPECT_EQ(r2.plan.sequences.back().first_position, 4);
}

TEST(Scheduler, SiblingWaitsForThePromptAndSharesItsPages) {
  Fixture f(32, 4, {4, 8});
  Sequence* first = f.add(10);
  Sequence* second = f.add(10);
  second->share_from = first;
  ScheduleResult r = f.step();  // budget 4: the first's first chunk; the sibling waits
  ASSERT_EQ(r.plan.sequences.size(), 1u);
  r = f.step();
  ASSERT_EQ(r.plan.sequences.size(), 1u);
  r = f.step();  // the first has computed 8 tokens = the 2 shareable pages
  ASSERT_EQ(r.plan.sequences.size(), 2u);
  EXPECT_EQ(r.plan.sequences[1].sequence, second->id);
  EXPECT_EQ(r.plan.sequences[1].first_position, 8);
  const auto a = f.allocator.block_table(first->id);
  const auto b = f.allocator.block_table(second->id);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  EXPECT_EQ(f.allocator.ref_count(a[0]), 2);
  EXPECT_EQ(second->num_cached_tokens, 8);
}

}  // namespace
}  // namespace pagedattn::engine

namespace pagedattn::engine {
namespace {

TEST(StepPlan, FlattenLaysOutTokensPositionsTablesAndLogitRows) {
  StepPlan plan;
  plan.page_size = 4;
  plan.sequences.push_back({7, {42}, 9, {3, 1, 8}, 1});          // decode at position 9
  plan.sequences.push_back({2, {5, 6, 7, 8, 9}, 4, {0, 2}, 0});  // prefill chunk, no logits
  plan.sequences.push_back({4, {1, 2}, 0, {6}, 1});              // the last chunk of a prompt
  FlatStep flat;
  flatten(plan, &flat);
  EXPECT_EQ(flat.token_ids, (std::vector<int32_t>{42, 5, 6, 7, 8, 9, 1, 2}));
  EXPECT_EQ(flat.positions, (std::vector<int32_t>{9, 4, 5, 6, 7, 8, 0, 1}));
  EXPECT_EQ(flat.query_start, (std::vector<int32_t>{0, 1, 6, 8}));
  EXPECT_EQ(flat.q_lens, (std::vector<int32_t>{1, 5, 2}));
  EXPECT_EQ(flat.seq_lens, (std::vector<int32_t>{10, 9, 2}));
  EXPECT_EQ(flat.row_stride, 3);
  EXPECT_EQ(flat.block_table, (std::vector<int32_t>{3, 1, 8, 0, 2, 0, 6, 0, 0}));
  EXPECT_EQ(flat.logit_rows, (std::vector<int32_t>{0, 7}));
  plan.sequences.pop_back();
  flatten(plan, &flat);  // reuse
  EXPECT_EQ(flat.token_ids.size(), 6u);
  EXPECT_EQ(flat.logit_rows, (std::vector<int32_t>{0}));
}

TEST(Scheduler, ScoringChunksHaveARowPerTokenWithinTheirOwnBound) {
  // Budget 16, at most 6 scored prompt tokens a step: the scoring prompt goes 6 at a time, a row
  // per token (its last chunk also samples), while a plain prompt beside it takes the rest of the
  // budget with one row at its end.
  Fixture f(64, 4, {16, 4, 6});
  Sequence* scored = f.add(20, 1);
  scored->score_prompt = true;
  Sequence* plain = f.add(30, 100);
  std::vector<int64_t> scored_counts, scored_rows, plain_counts;
  for (int i = 0; i < 4; ++i) {
    const ScheduleResult r = f.step();
    for (size_t k = 0; k < r.scheduled.size(); ++k) {
      const ScheduledSequence& s = r.plan.sequences[k];
      if (r.scheduled[k] == scored) {
        scored_counts.push_back(s.num_new_tokens());
        scored_rows.push_back(s.num_logit_rows);
      } else if (r.scheduled[k] == plain && s.num_new_tokens() > 1) {
        plain_counts.push_back(s.num_new_tokens());
      }
    }
    EXPECT_LE(r.plan.num_tokens, 16);
  }
  EXPECT_EQ(scored_counts, (std::vector<int64_t>{6, 6, 6, 2}));
  EXPECT_EQ(scored_rows, (std::vector<int64_t>{6, 6, 6, 2}));
  EXPECT_EQ(plain_counts, (std::vector<int64_t>{10, 10, 10}));
  // A scoring sequence takes no prefix-cache hit: admitted again with the cache on, it starts
  // at 0 where a plain one with the same tokens starts past the cached pages.
  Fixture cached(64, 4, {0, 4, 0}, /*cache=*/true);
  Sequence* first = cached.add(12, 1);
  for (int i = 0; i < 3; ++i) cached.step();
  cached.scheduler.remove(first);
  Sequence* again = cached.add(12, 1);
  again->score_prompt = true;
  Sequence* plain_again = cached.add(12, 1);
  const ScheduleResult r = cached.step();
  ASSERT_EQ(r.scheduled.size(), 2u);
  EXPECT_EQ(r.scheduled[0], again);
  EXPECT_EQ(r.plan.sequences[0].first_position, 0);
  EXPECT_EQ(r.plan.sequences[0].num_logit_rows, 12);
  EXPECT_EQ(r.scheduled[1], plain_again);
  EXPECT_EQ(r.plan.sequences[1].first_position, 8);
  EXPECT_EQ(r.plan.sequences[1].num_logit_rows, 1);
}

}  // namespace
}  // namespace pagedattn::engine
