// The scheduler: continuous batching under one token budget per step, plain host code.
//
// Every step: (1) running sequences that decode (one token left to compute) get one token each,
// oldest first (not one whose last token under max_tokens is still being drawn: with overlap
// scheduling a sequence's newest token may be pending while the next step is scheduled); (2) running sequences still prefilling get a chunk of what the budget leaves;
// (3) waiting sequences are admitted, front first, while the budget, max_running and the pages
// allow (a prefix-cache hit skips the cached tokens; the first chunk may be partial). So a long
// prompt is cut into chunks and never stalls decoding.
//
// Pages: before a sequence is scheduled, its pages grow to hold what the step writes. When they
// run out (after evicting the prefix cache), the newest running sequence not yet scheduled in
// this step is preempted by recompute: its pages are released (its computed full pages stay in
// the prefix cache when that is on), it goes to the front of the waiting queue, and when it comes
// back it recomputes prompt + generated tokens. A decode preempts even itself when it is the
// newest; a prefill chunk that finds nothing to preempt waits while other work holds pages. No
// admission happens in a step that preempted. A waiting sequence that the whole pool could not
// hold alone is handed back (`rejected`) for the engine to finish, so nothing waits forever.
//
// Logit rows: a chunk that reaches the end of a sequence's tokens gets one row (the next token's).
// A sequence with `score_prompt` set (its request asked for prompt_logprobs and does not have them
// all yet) gets a row for every new token of each prompt chunk instead, and takes no prefix-cache
// hit: a cached page's tokens were computed by another request, whose rows never reached the
// lm_head, so their logprobs do not exist. Its own pages still enter the cache as they fill. The
// rows of such chunks are bounded per step (max_scoring_rows, which the engine derives from the
// vocabulary: each row is vocab floats of logits), so a long prompt is scored over several steps
// and decodes still run beside it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "pagedattn/engine_kv.h"
#include "pagedattn/engine_model_runner.h"

namespace pagedattn::engine {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kPreempted, kFinished };

// One choice of a request as the scheduler sees it.
struct Sequence {
  SequenceId id = 0;
  int64_t request = 0;          // the engine request it belongs to
  int32_t index = 0;            // choice index among the request's n
  std::vector<int32_t> tokens;  // the prompt, then the generated tokens
  int64_t prompt_length = 0;
  int64_t max_output = 0;         // output budget (max_tokens)
  int64_t num_computed = 0;       // tokens whose KV is in the sequence's pages
  int32_t num_offered_pages = 0;  // full pages already offered to the prefix cache
  SequenceStatus status = SequenceStatus::kWaiting;
  int64_t num_cached_tokens = -1;  // reused tokens at first admission; -1: not admitted yet
  int32_t num_preemptions = 0;
  Sequence* share_from = nullptr;  // n > 1: the first choice, whose prompt pages this one shares
  uint64_t scheduled_step = 0;     // the last step that scheduled it
  bool score_prompt = false;       // a logits row per prompt token (prompt_logprobs); no cache hit

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output() const { return num_tokens() - prompt_length; }
};

struct SchedulerConfig {
  int64_t max_tokens_per_step = 2048;  // the token budget; <= 0: unbounded
  int32_t max_running = 256;
  int64_t max_scoring_rows = 0;  // prompt tokens of score_prompt chunks per step; <= 0: unbounded
};

struct ScheduleResult {
  StepPlan plan;
  std::vector<Sequence*> scheduled;  // parallel to plan.sequences
  std::vector<int64_t> counts;       // parallel to scheduled: the new tokens of each
  std::vector<Sequence*> preempted;  // preempted in this step (now waiting)
  std::vector<Sequence*> rejected;   // removed: the pool can never hold them
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvManager& kv);

  // Queues a sequence (status kWaiting, no pages) at the back of the waiting queue.
  void add(Sequence* sequence);
  // Drops a sequence from the queues and releases its pages (finish, abort). Its computed full
  // pages were offered to the prefix cache as they filled.
  void remove(Sequence* sequence);

  // The next step: decides it, then fills its plan.
  ScheduleResult schedule();
  // The step's decisions into `result` (cleared first, its buffers kept for reuse: the engine
  // passes the same one every step): the scheduled sequences with their new token counts, each
  // plan entry's sequence, first position and logit rows, the plan's totals, pages grown,
  // preemptions and rejections. The entries' token ids and block tables are not yet filled
  // (stale): fill_plan does that (the engine times the two apart).
  void schedule(ScheduleResult* result);
  // Copies each scheduled sequence's new token ids and block table into its plan entry. The
  // tables are final once schedule() returns: a scheduled sequence's pages are never taken back
  // in its step, and eviction frees only pages that no sequence holds.
  void fill_plan(ScheduleResult* result) const;
  // After the step's forward (or its launch, with overlap scheduling: the steps run in order, so a
  // page offered now is read only by a later step): the scheduled tokens are in the KV; offers
  // new full pages to the prefix cache. Null entries of result.scheduled (sequences that finished
  // since the step was scheduled) are skipped.
  void complete(const ScheduleResult& result);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }
  KvManager& kv() { return kv_; }

 private:
  // Whether `sequence` (waiting, n > 1) must wait for its first choice's prompt pages; detaches
  // it when the first choice is no longer running.
  bool blocked_on_sibling(Sequence* sequence);
  int32_t sibling_pages(const Sequence& sequence) const;
  void preempt(Sequence* victim);
  // The newest running sequence not scheduled in this step, other than `except` (may be null).
  Sequence* newest_unscheduled(const Sequence* except) const;
  void schedule_tokens(Sequence* sequence, int64_t count, ScheduleResult* result);

  SchedulerConfig config_;
  KvManager& kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: newest last
  uint64_t step_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace pagedattn::engine
