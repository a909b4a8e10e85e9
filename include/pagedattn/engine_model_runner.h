// What the engine asks of a model: the plan of one step and the ModelRunner interface.
//
// A step is a list of sequences, decodes first (one token each) then prefill chunks. For each:
// the new tokens, the position of the first one (= the tokens whose KV is already in the pages;
// the new tokens sit at first_position, first_position + 1, ...), the block table (allocation
// page ids covering first_position + new tokens, page size `page_size`: position x lives in
// page block_table[x / page_size] at offset x % page_size), and how many of its last rows want
// logits (0 for a prefill chunk that does not reach the end, else 1; every new token of a prompt
// chunk of a request that scores its prompt: SamplingParams::prompt_logprobs).
//
// The runner writes the KV of every new token into its slot and attends each token over
// positions [0, its position] of its own sequence, reading earlier KV through the block table.
// Pages that several sequences share (a cached prefix, or the prompt of n > 1 choices) are full
// and lie entirely below first_position of each of them: no step ever writes a shared page, and
// the engine never asks the runner to copy or fork a page.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "pagedattn/sampling.h"

namespace pagedattn::engine {

using SequenceId = int64_t;

struct ScheduledSequence {
  SequenceId sequence = 0;
  std::vector<int32_t> token_ids;    // [num_new_tokens]
  int64_t first_position = 0;        // tokens of this sequence already in the KV pages
  std::vector<int32_t> block_table;  // [ceil((first_position + num_new_tokens) / page_size)]
  int32_t num_logit_rows = 0;        // logits of the last num_logit_rows new tokens (0, 1, or all)
  int64_t num_new_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t context_length() const { return first_position + num_new_tokens(); }
};

struct StepPlan {
  int32_t page_size = 0;
  std::vector<ScheduledSequence> sequences;  // decodes first, then prefill chunks
  int32_t num_decodes = 0;                   // sequences[0 .. num_decodes) are single-token decodes
  int64_t num_tokens = 0;                    // sum of num_new_tokens
  int32_t num_logit_rows = 0;                // sum of num_logit_rows: the rows forward() writes
  bool empty() const { return sequences.empty(); }
};

// A step as flat arrays, the form a model's forward and the planner (planner.h: PlanInput with a
// BlockTableInput of row_stride, seq_lens and q_lens) read. Sequences in plan order; tokens of
// sequence i are token_ids[query_start[i] .. query_start[i + 1]).
struct FlatStep {
  std::vector<int32_t> token_ids;    // [num_tokens]
  std::vector<int32_t> positions;    // [num_tokens]
  std::vector<int32_t> query_start;  // [num_sequences + 1] (qo_indptr)
  std::vector<int32_t> q_lens;       // [num_sequences] new tokens
  std::vector<int32_t> seq_lens;     // [num_sequences] KV length after the step (cached + new)
  std::vector<int32_t> block_table;  // [num_sequences, row_stride]; unused entries 0
  int64_t row_stride = 0;            // the longest block table of the step
  std::vector<int32_t> logit_rows;   // [num_logit_rows] index into token_ids of each logits row
};

// Fills `out` from `plan`, reusing its capacity (no allocation once it has grown).
void flatten(const StepPlan& plan, FlatStep* out);

// Overlap scheduling (ModelRunner::launch): a token id of a launched step may stand for a token
// not drawn yet, the one the step launched just before it draws at its logit row r. Such ids are
// negative: pending_token(r) = -(r + 1).
constexpr int32_t pending_token(int32_t row) { return -(row + 1); }
constexpr bool is_pending_token(int32_t token) { return token < 0; }
constexpr int32_t pending_row(int32_t token) { return -token - 1; }
// Replaces each pending token of `plan` by the token `previous` (the step launched before it) drew
// at that row, as a runner that runs steps on the host does; returns how many it replaced. Throws
// Error naming the sequence for a row `previous` does not have.
int64_t resolve_pending_tokens(StepPlan& plan, std::span<const ops::SampledToken> previous);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int32_t vocab_size() const = 0;
  // Runs one step. `logits` is [plan.num_logit_rows, vocab_size()] f32, row-major; row r is the
  // r-th logit row in plan order (sequence by sequence). Throws Error on failure; the engine
  // then finishes the step's sequences with FinishReason::kError.
  virtual void forward(const StepPlan& plan, std::span<float> logits) = 0;

  // Sampling by the runner (opt-in). The engine hands it the rows whose requests ops sampling can
  // draw (pagedattn/sampling.h; no logit bias, penalties or top-n logprobs) when
  // EngineConfig::model_sampling says so, by default when the runner prefers it: a model on a GPU,
  // which then copies back one token per row instead of every logits row.
  virtual bool prefers_model_sampling() const { return false; }
  // Runs one step as forward() does; `sampling` and `sampled` are [plan.num_logit_rows]. Row r
  // whose sampling[r].sample is set is drawn by the runner: sampled[r] = its token and logprob,
  // logits row r left unwritten. The other rows' logits are written (sampled[r].token -1). The
  // default runs forward() and draws the marked rows on the host with ops::RowSampler.
  virtual void forward_sampled(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                               std::span<float> logits, std::span<ops::SampledToken> sampled);

  // Overlap scheduling (EngineConfig::overlap; on by default when the runner says it pays):
  // launch() starts a step every logit row of which the runner draws (sampling[r].sample set on
  // each of the plan's num_logit_rows entries) and may return before the step ends; collect()
  // waits for the oldest launched step not collected yet and writes its tokens ([its logit rows]).
  // The engine launches step N + 1 before it collects step N, so the device runs N + 1 right after
  // N while the host takes in N's tokens: at most two steps are launched and not collected, and
  // none of forward / forward_sampled runs while one is. A launched step's token ids may be
  // pending_token(r): the token of row r of the step launched just before it, which the runner
  // reads where it was drawn (on the device), so step N + 1 needs nothing of step N on the host.
  // The steps run in launch order: a page that step N writes may be freed and given to another
  // sequence in step N + 1.
  //
  // The default runs the step at launch() with forward_sampled(), replacing pending tokens by the
  // previous launch's tokens: the same tokens, no overlap (for runners on the host, and tests).
  virtual bool supports_overlap() const { return false; }
  virtual void launch(const StepPlan& plan, std::span<const ops::RowSampling> sampling);
  virtual void collect(std::span<ops::SampledToken> sampled);

 private:
  // The default launch / collect: steps run at launch, their tokens kept until collected.
  StepPlan launched_plan_;
  std::vector<float> launched_logits_;
  std::vector<ops::SampledToken> previous_launch_;
  std::deque<std::vector<ops::SampledToken>> uncollected_;
};

}  // namespace pagedattn::engine
