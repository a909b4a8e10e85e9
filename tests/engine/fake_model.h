// Test doubles for the engine: a fake model that keeps its "KV" in pages, and a fake
// detokenizer.
//
// FakeModel stores, for every position a step computes, the token id in a pool laid out
// [num_pages][page_size] at block_table[pos / P], offset pos % P. The logits of a row are a
// pseudo-random function of the whole prefix *read back through the block table*, so a wrong
// page, a stale page, a missed write, a wrong position or a prefix-cache hit on the wrong tokens
// changes the output. It also checks what a real runner relies on: block tables cover the
// context, logit rows sit where the plan says, and no step writes a page another sequence (or
// the prefix cache) holds (reference count > 1 in the engine's allocator). A sequence that wants k
// logit rows gets the rows of its last k new tokens, each the function of the prefix up to it.
//
// reference_logits() computes the same function from the token list directly (no pages), the
// independent oracle for the engine's greedy output.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_model_runner.h"
#include "pagedattn/engine_stop.h"
#include "pagedattn/page_allocator.h"
#include "pagedattn/sampling.h"

namespace pagedattn::engine::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t prefix_hash(std::span<const int32_t> tokens) {
  uint64_t hash = 0x1234567;
  for (const int32_t token : tokens) hash = mix64(hash ^ static_cast<uint64_t>(token));
  return hash;
}

// Logits in [-4, 4) from the prefix hash: distinct enough that greedy has no ties in practice.
inline void reference_logits(std::span<const int32_t> prefix, std::span<float> out) {
  const uint64_t hash = prefix_hash(prefix);
  for (size_t v = 0; v < out.size(); ++v) {
    const uint64_t bits = mix64(hash ^ (0xabcdefULL * (v + 1)));
    out[v] = static_cast<float>(static_cast<double>(bits >> 40) / 16777216.0 * 8.0 - 4.0);
  }
}

class FakeModel : public ModelRunner {
 public:
  FakeModel(int32_t vocab, int32_t num_pages, int32_t page_size)
      : vocab_(vocab),
        page_size_(page_size),
        pool_(static_cast<size_t>(num_pages) * static_cast<size_t>(page_size), -1) {}

  // The engine's allocator, to check that no step writes a shared page (optional).
  void watch(const PageAllocator* allocator) { allocator_ = allocator; }

  int32_t vocab_size() const override { return vocab_; }

  void forward(const StepPlan& plan, std::span<float> logits) override {
    PA_CHECK(queue_.empty(), "fake: forward with {} launched steps not collected", queue_.size());
    check(plan, 0);
    last_launch_rows_ = 0;  // a launch after this step has nothing pending
    ran_tokens_.clear();
    execute(plan, logits);
  }

  // Overlap scheduling. launch() checks the plan against the engine's allocator as it is at launch
  // and queues the step; collect() runs the oldest queued step, as late as a device may: whatever
  // the engine does between the two (frees, admissions, evictions, the next launch) happens
  // before the step writes its tokens and reads its prefixes. Its pending tokens take the tokens
  // of the step run before it; its rows are drawn as ModelRunner's default forward_sampled does.
  void enable_overlap() { overlap_ = true; }
  bool supports_overlap() const override { return overlap_; }
  bool prefers_model_sampling() const override { return overlap_; }
  void launch(const StepPlan& plan, std::span<const ops::RowSampling> sampling) override {
    PA_CHECK(overlap_, "fake: launch without overlap");
    PA_CHECK(queue_.size() <= 1, "fake: launch with {} steps launched and not collected",
             queue_.size());
    PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows,
             "fake: {} sampling entries for {} rows", sampling.size(), plan.num_logit_rows);
    for (const ops::RowSampling& row : sampling) PA_CHECK(row.sample, "fake: a row not sampled");
    check(plan, last_launch_rows_);
    queue_.push_back({plan, std::vector<ops::RowSampling>(sampling.begin(), sampling.end())});
    last_launch_rows_ = plan.num_logit_rows;
    max_in_flight_ = std::max(max_in_flight_, static_cast<int32_t>(queue_.size()));
  }
  void collect(std::span<ops::SampledToken> sampled) override {
    PA_CHECK(!queue_.empty(), "fake: collect with no step launched");
    Launched step = std::move(queue_.front());
    queue_.pop_front();
    PA_CHECK(sampled.size() == step.sampling.size(), "fake: {} outputs for {} rows",
             sampled.size(), step.sampling.size());
    num_pending_resolved_ += resolve_pending_tokens(step.plan, ran_tokens_);
    std::vector<float> logits(step.sampling.size() * static_cast<size_t>(vocab_));
    execute(step.plan, logits);
    ops::RowSampler sampler;
    ran_tokens_.resize(step.sampling.size());
    for (size_t r = 0; r < step.sampling.size(); ++r) {
      const ops::RowDraw draw = sampler.sample(
          std::span<const float>(logits).subspan(r * static_cast<size_t>(vocab_), vocab_),
          step.sampling[r]);
      sampled[r] = ran_tokens_[r] = {draw.token, draw.logprob};
    }
    ++num_overlapped_steps_;
  }

  // The plan's shape, block tables, the write rule (no step writes a page another holder shares)
  // and its pending tokens (rows of the previous launch, which has `previous_rows`).
  void check(const StepPlan& plan, int32_t previous_rows) const {
    PA_CHECK(plan.page_size == page_size_, "fake: page size {} != {}", plan.page_size, page_size_);
    for (const ScheduledSequence& entry : plan.sequences) {
      const int64_t context = entry.context_length();
      PA_CHECK(!entry.token_ids.empty(), "fake: a sequence with no new tokens");
      PA_CHECK(
          static_cast<int64_t>(entry.block_table.size()) >= (context + page_size_ - 1) / page_size_,
          "fake: block table of {} pages for {} tokens", entry.block_table.size(), context);
      for (int64_t i = 0; i < entry.num_new_tokens(); ++i) {
        const int32_t token = entry.token_ids[static_cast<size_t>(i)];
        PA_CHECK(token < vocab_, "fake: token {} (vocabulary {})", token, vocab_);
        PA_CHECK(!is_pending_token(token) || pending_row(token) < previous_rows,
                 "fake: sequence {} waits for row {} of a previous launch of {} rows",
                 entry.sequence, pending_row(token), previous_rows);
        const int64_t position = entry.first_position + i;
        const int32_t page = entry.block_table[static_cast<size_t>(position / page_size_)];
        if (allocator_ != nullptr) {
          PA_CHECK(allocator_->ref_count(page) == 1,
                   "fake: sequence {} writes position {} into page {} shared by {} holders",
                   entry.sequence, position, page, allocator_->ref_count(page));
        }
      }
    }
  }

  // Writes the plan's tokens into the pages and computes its logit rows from the prefixes read
  // back through the block tables.
  void execute(const StepPlan& plan, std::span<float> logits) {
    ++num_steps_;
    PA_CHECK(logits.size() == static_cast<size_t>(plan.num_logit_rows) * vocab_,
             "fake: logits of {} floats for {} rows", logits.size(), plan.num_logit_rows);
    int64_t tokens = 0;
    int32_t rows = 0;
    for (const ScheduledSequence& entry : plan.sequences) {
      const int64_t context = entry.context_length();
      for (int64_t i = 0; i < entry.num_new_tokens(); ++i) {
        const int64_t position = entry.first_position + i;
        const int32_t page = entry.block_table[static_cast<size_t>(position / page_size_)];
        PA_CHECK(entry.token_ids[static_cast<size_t>(i)] >= 0, "fake: token {} at position {}",
                 entry.token_ids[static_cast<size_t>(i)], position);
        pool_[slot(page, position)] = entry.token_ids[static_cast<size_t>(i)];
      }
      tokens += entry.num_new_tokens();
      PA_CHECK(entry.num_logit_rows >= 0 && entry.num_logit_rows <= entry.num_new_tokens(),
               "fake: {} logit rows of {} new tokens", entry.num_logit_rows,
               entry.num_new_tokens());
      if (entry.num_logit_rows > 0) {
        // Row of position p: the function of the prefix [0, p], read back through the pages.
        const std::vector<int32_t> prefix = read_prefix(entry);
        for (int64_t end = context - entry.num_logit_rows + 1; end <= context; ++end) {
          reference_logits(std::span<const int32_t>(prefix).first(static_cast<size_t>(end)),
                           logits.subspan(static_cast<size_t>(rows) * vocab_, vocab_));
          ++rows;
        }
        max_rows_per_sequence_ = std::max(max_rows_per_sequence_, entry.num_logit_rows);
      }
    }
    PA_CHECK(tokens == plan.num_tokens && rows == plan.num_logit_rows,
             "fake: plan totals disagree ({} tokens / {} rows counted)", tokens, rows);
    max_step_tokens_ = std::max(max_step_tokens_, tokens);
  }

  // The tokens of `entry`'s sequence up to its context length, read back through its block
  // table (as forward() wrote them).
  std::vector<int32_t> read_prefix(const ScheduledSequence& entry) const {
    std::vector<int32_t> prefix(static_cast<size_t>(entry.context_length()));
    for (int64_t position = 0; position < entry.context_length(); ++position) {
      const int32_t page = entry.block_table[static_cast<size_t>(position / page_size_)];
      prefix[static_cast<size_t>(position)] = pool_[slot(page, position)];
    }
    return prefix;
  }

  int64_t num_steps() const { return num_steps_; }
  int64_t num_overlapped_steps() const { return num_overlapped_steps_; }
  int64_t num_pending_resolved() const { return num_pending_resolved_; }
  int32_t max_in_flight() const { return max_in_flight_; }
  int64_t max_step_tokens() const { return max_step_tokens_; }
  int32_t max_rows_per_sequence() const { return max_rows_per_sequence_; }

 private:
  size_t slot(int32_t page, int64_t position) const {
    return static_cast<size_t>(page) * static_cast<size_t>(page_size_) +
           static_cast<size_t>(position % page_size_);
  }

  int32_t vocab_;
  int32_t page_size_;
  std::vector<int32_t> pool_;
  const PageAllocator* allocator_ = nullptr;
  int64_t num_steps_ = 0;
  int64_t max_step_tokens_ = 0;
  int32_t max_rows_per_sequence_ = 0;
  struct Launched {
    StepPlan plan;
    std::vector<ops::RowSampling> sampling;
  };
  bool overlap_ = false;
  std::deque<Launched> queue_;
  int32_t last_launch_rows_ = 0;
  std::vector<ops::SampledToken> ran_tokens_;  // the tokens of the step run last
  int64_t num_overlapped_steps_ = 0;
  int64_t num_pending_resolved_ = 0;
  int32_t max_in_flight_ = 0;
};

// Token t decodes to token_text(t); every third token's text is held until the next push (as a
// byte-level detokenizer holds an incomplete UTF-8 character), flushed at the end.
inline std::string token_text(int32_t token) {
  std::string text(1, static_cast<char>('a' + token % 5));
  if (token % 4 == 0) text += 'x';
  return text;
}

class FakeDetokenizer : public IncrementalDetokenizer {
 public:
  std::string push(int32_t token) override {
    pending_ += token_text(token);
    if (token % 3 == 0) return {};
    return std::exchange(pending_, {});
  }
  std::string flush() override { return std::exchange(pending_, {}); }

 private:
  std::string pending_;
};

inline DetokenizerFactory fake_detokenizer() {
  return [](std::span<const int32_t>) { return std::make_unique<FakeDetokenizer>(); };
}

}  // namespace pagedattn::engine::testing
