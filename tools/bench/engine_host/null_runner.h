// A ModelRunner that computes nothing: the engine's host work alone, for `bench engine-host`.
//
// It prefers model sampling (as a GPU model does), so the engine hands it the rows whose requests
// the model's sampler serves; it "draws" each such row's token as a pure function of the row's
// (seed, choice, position): token = floor(sampling_uniform(...) * vocab), stepped past the tokens
// it must never produce (the engine's EOS ids), with logprob -log(vocab). So a request's output
// depends on its own parameters only, never on the batch, like the real sampler's. Rows left to
// the host (logprobs, penalties, logit bias; or every row under --host-sampling) get logits by
// forward(): one filled row per logits row, 0 everywhere but 8 at a token that is a function of
// (sequence, position) and not an avoided one, so the host sampler has a real row to work on.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/engine_model_runner.h"

namespace pagedattn::tools {

class NullRunner final : public engine::ModelRunner {
 public:
  // vocab_size >= 2; `avoid` lists tokens never produced (fewer than vocab_size of them).
  NullRunner(int32_t vocab_size, std::vector<int32_t> avoid);

  int32_t vocab_size() const override { return vocab_; }
  bool prefers_model_sampling() const override { return true; }
  void forward(const engine::StepPlan& plan, std::span<float> logits) override;
  void forward_sampled(const engine::StepPlan& plan, std::span<const ops::RowSampling> sampling,
                       std::span<float> logits, std::span<ops::SampledToken> sampled) override;

  // The token a sampled row gets for (seed, choice, position); exposed for the tests.
  int32_t sampled_token(uint64_t seed, uint64_t choice, uint64_t position) const;
  // The token forward() puts the peak of a logits row at.
  int32_t peak_token(int64_t sequence, int64_t position) const;

  int64_t rows_sampled() const { return rows_sampled_; }     // by forward_sampled's draw
  int64_t rows_with_logits() const { return rows_logits_; }  // written for the host
  int64_t calls() const { return calls_; }                   // forward + forward_sampled
  // The last step's sequences, and how many of them were single-token decodes.
  int32_t last_sequences() const { return last_sequences_; }
  int32_t last_decodes() const { return last_decodes_; }

 private:
  int32_t not_avoided(int64_t token) const;
  // Writes the rows of `plan` whose index is in [0, rows) and which `skip` does not mark.
  void record(const engine::StepPlan& plan);
  void fill_logits(const engine::StepPlan& plan, std::span<float> logits,
                   std::span<const ops::RowSampling> skip);

  int32_t vocab_ = 0;
  std::vector<uint8_t> avoided_;  // [vocab]
  float logprob_ = 0.0f;
  int64_t rows_sampled_ = 0;
  int64_t rows_logits_ = 0;
  int64_t calls_ = 0;
  int32_t last_sequences_ = 0;
  int32_t last_decodes_ = 0;
};

}  // namespace pagedattn::tools
