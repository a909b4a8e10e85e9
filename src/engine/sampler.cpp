// The CPU sampler (see engine_sampler.h for the order of operations and the generator): logit
// bias and penalties here, then ops::RowSampler's filters and draw (src/ops/sampling.cpp).
//
// The scratch vectors are vocab-sized and reused across calls; counts_ and seen_ are reset
// through touched_, so a row costs O(vocab) plus O(prompt + output), not O(vocab) allocations.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "pagedattn/engine_sampler.h"

namespace pagedattn::engine {

namespace {

// Descending by value, ascending id on ties: the order of the top-n logprobs.
bool before(std::span<const float> values, int32_t a, int32_t b) {
  const float va = values[static_cast<size_t>(a)];
  const float vb = values[static_cast<size_t>(b)];
  return va > vb || (va == vb && a < b);
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t choice, uint64_t position) {
  return ops::sampling_uniform(seed, choice, position);
}

bool is_greedy(const SamplingParams& params) { return ops::is_greedy(params.temperature); }

ops::RowSampling row_sampling(const SamplingParams& params, const SampleContext& context) {
  ops::RowSampling spec;
  spec.sample = true;
  spec.temperature = params.temperature;
  spec.top_k = params.top_k;
  spec.top_p = params.top_p;
  spec.min_p = params.min_p;
  spec.seed = context.seed;
  spec.choice = context.choice;
  spec.position = context.position;
  return spec;
}

bool model_can_sample(const SamplingParams& params) {
  return params.logit_bias.empty() && params.repetition_penalty == 1.0 &&
         params.presence_penalty == 0.0 && params.frequency_penalty == 0.0 &&
         (!params.logprobs || *params.logprobs == 0);
}

void Sampler::apply_bias_and_penalties(std::span<float> logits, const SamplingParams& params,
                                       const SampleContext& context) {
  const size_t vocab = logits.size();
  for (const auto& [token, bias] : params.logit_bias) logits[static_cast<size_t>(token)] += bias;
  const bool repetition = params.repetition_penalty != 1.0;
  const bool additive = params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
  if (!repetition && !additive) return;
  if (counts_.size() != vocab) {
    counts_.assign(vocab, 0);
    seen_.assign(vocab, 0);
  }
  auto mark = [&](int32_t token, bool in_output) {
    PA_CHECK(token >= 0 && static_cast<size_t>(token) < vocab,
             "sampler: token {} of the context is outside the vocabulary [0, {})", token, vocab);
    const size_t t = static_cast<size_t>(token);
    if (!seen_[t]) {
      seen_[t] = 1;
      touched_.push_back(token);
    }
    if (in_output) ++counts_[t];
  };
  if (repetition) {
    for (const int32_t token : context.prompt) mark(token, false);
  }
  for (const int32_t token : context.output) mark(token, true);
  const float penalty = static_cast<float>(params.repetition_penalty);
  const float frequency = static_cast<float>(params.frequency_penalty);
  const float presence = static_cast<float>(params.presence_penalty);
  for (const int32_t token : touched_) {
    const size_t t = static_cast<size_t>(token);
    float& logit = logits[t];
    if (repetition) logit = logit > 0.0f ? logit / penalty : logit * penalty;
    const int32_t count = counts_[t];
    if (count > 0) logit -= frequency * static_cast<float>(count) + presence;
    counts_[t] = 0;
    seen_[t] = 0;
  }
  touched_.clear();
}

std::vector<float> Sampler::processed_logits(std::span<const float> logits,
                                             const SamplingParams& params,
                                             const SampleContext& context) {
  std::vector<float> out(logits.begin(), logits.end());
  apply_bias_and_penalties(out, params, context);
  if (!is_greedy(params)) row_.filter(out, ops::row_filter(row_sampling(params, context)));
  return out;
}

TokenLogprob Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             const SampleContext& context) {
  PA_CHECK(!logits.empty(), "sampler: an empty logits row");
  const bool modifies = !params.logit_bias.empty() || params.repetition_penalty != 1.0 ||
                        params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
  TokenLogprob result;
  if (is_greedy(params)) {
    // Plain greedy reads the row in place.
    if (modifies) {
      work_.assign(logits.begin(), logits.end());
      apply_bias_and_penalties(work_, params, context);
    }
    result.token = ops::greedy_token(modifies ? std::span<const float>(work_) : logits);
  } else {
    const ops::RowFilter filter = ops::row_filter(row_sampling(params, context));
    work_.assign(logits.begin(), logits.end());
    apply_bias_and_penalties(work_, params, context);
    row_.filter(work_, filter);
    result.token = row_.draw(work_, filter.uniform);
  }
  if (params.logprobs) return score(logits, result.token, *params.logprobs);
  return result;
}

TokenLogprob Sampler::score(std::span<const float> logits, int32_t token, int32_t top_n) {
  PA_CHECK(!logits.empty(), "sampler: an empty logits row");
  const size_t vocab = logits.size();
  PA_CHECK(token >= 0 && static_cast<size_t>(token) < vocab, "sampler: token {} outside [0, {})",
           token, vocab);
  const double log_total = ops::log_sum_exp(logits);
  auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(t)]) - log_total);
  };
  TokenLogprob result;
  result.token = token;
  result.logprob = logprob(token);
  int32_t ahead = 0;
  for (size_t t = 0; t < vocab; ++t) ahead += before(logits, static_cast<int32_t>(t), token) ? 1 : 0;
  result.rank = ahead + 1;
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top_n, 0)), vocab);
  if (n > 0) {
    order_.resize(vocab);
    for (size_t t = 0; t < vocab; ++t) order_[t] = static_cast<int32_t>(t);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(n), order_.end(),
                      [&](int32_t a, int32_t b) { return before(logits, a, b); });
    for (size_t i = 0; i < n; ++i) result.top.emplace_back(order_[i], logprob(order_[i]));
  }
  return result;
}

}  // namespace pagedattn::engine
