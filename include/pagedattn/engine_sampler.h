// The sampler: one row of f32 logits [vocab] in, one token (and its logprobs) out, on the CPU.
//
// Order, as vLLM v1 applies it: logit bias -> repetition / frequency / presence penalties ->
// greedy (temperature below 1e-5: argmax, lowest id on ties) or temperature -> min-p -> top-k ->
// top-p -> a draw (in value order when top-p runs, else in id order). min-p keeps tokens whose probability is at least min_p times the top one;
// top-k keeps tokens whose logit is at least the k-th largest (ties at the boundary kept); top-p
// keeps, over what is left (renormalised), the fewest most-probable tokens (ties by lower id)
// whose mass reaches top_p. The draw is one uniform number from a counter-based generator keyed
// by (seed, choice, output position) (splitmix64), so a seed gives the same tokens whatever
// else is in the batch and however the request was scheduled or preempted. Logprobs are those of
// the raw logits (vLLM's default), computed in double.
//
// Temperature, the filters and the draw are ops::RowSampler's (pagedattn/sampling.h), the
// algorithm a model also runs on its device for the rows the engine hands it (rows without bias,
// penalties or top-n logprobs: model_can_sample); this sampler adds the bias, the penalties and
// the top-n logprobs around it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/engine_request.h"
#include "pagedattn/sampling.h"

namespace pagedattn::engine {

struct SampleContext {
  std::span<const int32_t> prompt;  // for the repetition penalty
  std::span<const int32_t> output;  // tokens generated so far (all penalties)
  uint64_t seed = 0;
  uint64_t choice = 0;    // the choice index: siblings of one seed draw different numbers
  uint64_t position = 0;  // output position of the token being drawn
};

// The uniform number in [0, 1) that the draw for (seed, choice, position) uses.
double sampling_uniform(uint64_t seed, uint64_t choice, uint64_t position);

class Sampler {
 public:
  // Samples from `logits` [vocab]. `params` must be valid (validate()).
  TokenLogprob sample(std::span<const float> logits, const SamplingParams& params,
                      const SampleContext& context);

  // `token`'s logprob under the raw `logits` (log-softmax in double) and the top_n (token,
  // logprob) of the row, best first (ties by lower id): a sampled token's logprobs, and a prompt
  // token's (SamplingParams::prompt_logprobs).
  TokenLogprob score(std::span<const float> logits, int32_t token, int32_t top_n);

  // The processed logits before the draw (bias, penalties, temperature; filtered tokens at
  // -inf), for tests and debugging; greedy rows are returned without temperature.
  std::vector<float> processed_logits(std::span<const float> logits, const SamplingParams& params,
                                      const SampleContext& context);

 private:
  void apply_bias_and_penalties(std::span<float> logits, const SamplingParams& params,
                                const SampleContext& context);

  std::vector<float> work_;
  std::vector<int32_t> counts_;  // per token occurrences in the output; zero between calls
  std::vector<uint8_t> seen_;    // per token: in prompt or output; zero between calls
  std::vector<int32_t> touched_;
  std::vector<int32_t> order_;   // top-n logprobs
  ops::RowSampler row_;
};

bool is_greedy(const SamplingParams& params);

// The row's parameters for ops sampling (sample = true), from a request and its context.
ops::RowSampling row_sampling(const SamplingParams& params, const SampleContext& context);

// Whether a model may draw this request's tokens (ops::RowSampling can say all it needs): no
// logit bias, no penalties, no top-n logprobs (the sampled token's own logprob comes back). The
// engine masks no logits otherwise (no min_tokens / EOS suppression yet): a mask added later must
// keep its rows on the host while it is active.
bool model_can_sample(const SamplingParams& params);

}  // namespace pagedattn::engine
