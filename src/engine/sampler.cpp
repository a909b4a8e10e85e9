// The CPU sampler (see engine_sampler.h for the order of operations and the generator).
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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Descending by value, ascending id on ties: the one order every filter uses.
bool before(std::span<const float> values, int32_t a, int32_t b) {
  const float va = values[static_cast<size_t>(a)];
  const float vb = values[static_cast<size_t>(b)];
  return va > vb || (va == vb && a < b);
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t choice, uint64_t position) {
  const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ choice) ^ position);
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}

bool is_greedy(const SamplingParams& params) { return params.temperature < 1e-5; }

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

void Sampler::filter(std::span<float> logits, const SamplingParams& params) {
  const size_t vocab = logits.size();
  const float inverse_temperature = static_cast<float>(1.0 / params.temperature);
  float max_logit = kNegInf;
  for (float& logit : logits) {
    logit *= inverse_temperature;
    max_logit = std::max(max_logit, logit);
  }
  PA_CHECK(max_logit > kNegInf, "sampler: every logit is -inf or NaN (nothing to sample)");
  // min-p: p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p).
  const float min_p_floor =
      params.min_p > 0.0 ? max_logit + static_cast<float>(std::log(params.min_p)) : kNegInf;
  candidates_.clear();
  for (size_t t = 0; t < vocab; ++t) {
    if (logits[t] >= min_p_floor && logits[t] > kNegInf) {
      candidates_.push_back(static_cast<int32_t>(t));
    } else {
      logits[t] = kNegInf;
    }
  }
  const std::span<const float> values(logits.data(), vocab);
  auto order = [&](int32_t a, int32_t b) { return before(values, a, b); };
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < candidates_.size()) {
    const auto kth = candidates_.begin() + (params.top_k - 1);
    std::nth_element(candidates_.begin(), kth, candidates_.end(), order);
    const float threshold = logits[static_cast<size_t>(*kth)];
    std::erase_if(candidates_, [&](int32_t t) {
      if (logits[static_cast<size_t>(t)] >= threshold) return false;
      logits[static_cast<size_t>(t)] = kNegInf;
      return true;
    });
  }
  if (params.top_p < 1.0) {
    // Only the head of the order matters: sort the best `sorted` candidates, and sort more
    // (x4) only while their mass falls short of top_p (a large vocabulary is never fully sorted
    // in the usual case).
    const double top = static_cast<double>(max_logit);
    double total = 0.0;
    for (const int32_t t : candidates_) total += std::exp(logits[static_cast<size_t>(t)] - top);
    const double target = params.top_p * total;
    double mass = 0.0;
    size_t keep = 0;
    size_t sorted = 0;
    while (keep < candidates_.size() && mass < target) {
      if (keep == sorted) {
        sorted = std::min(candidates_.size(), std::max<size_t>(64, sorted * 4));
        std::partial_sort(candidates_.begin() + static_cast<ptrdiff_t>(keep),
                          candidates_.begin() + static_cast<ptrdiff_t>(sorted), candidates_.end(),
                          order);
      }
      mass += std::exp(logits[static_cast<size_t>(candidates_[keep])] - top);
      ++keep;
    }
    keep = std::max<size_t>(keep, 1);
    for (size_t i = keep; i < candidates_.size(); ++i) {
      logits[static_cast<size_t>(candidates_[i])] = kNegInf;
    }
    candidates_.resize(keep);
  }
}

std::vector<float> Sampler::processed_logits(std::span<const float> logits,
                                             const SamplingParams& params,
                                             const SampleContext& context) {
  std::vector<float> out(logits.begin(), logits.end());
  apply_bias_and_penalties(out, params, context);
  if (!is_greedy(params)) filter(out, params);
  return out;
}

TokenLogprob Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             const SampleContext& context) {
  PA_CHECK(!logits.empty(), "sampler: an empty logits row");
  const size_t vocab = logits.size();
  const bool modifies = !params.logit_bias.empty() || params.repetition_penalty != 1.0 ||
                        params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
  TokenLogprob result;
  if (is_greedy(params)) {
    // Plain greedy reads the row in place; ties and NaN go to the lowest id.
    if (modifies) {
      work_.assign(logits.begin(), logits.end());
      apply_bias_and_penalties(work_, params, context);
    }
    const std::span<const float> row = modifies ? std::span<const float>(work_) : logits;
    size_t best = 0;
    for (size_t t = 1; t < vocab; ++t) {
      if (row[t] > row[best] || std::isnan(row[best])) best = t;
    }
    result.token = static_cast<int32_t>(best);
  } else {
    work_.assign(logits.begin(), logits.end());
    apply_bias_and_penalties(work_, params, context);
    filter(work_, params);
    float top = kNegInf;
    for (const int32_t t : candidates_) top = std::max(top, work_[static_cast<size_t>(t)]);
    weights_.resize(candidates_.size());
    double total = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      weights_[i] = std::exp(work_[static_cast<size_t>(candidates_[i])] - top);
      total += weights_[i];
    }
    const double target = sampling_uniform(context.seed, context.choice, context.position) * total;
    double cumulative = 0.0;
    result.token = candidates_.back();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += weights_[i];
      if (target < cumulative) {
        result.token = candidates_[i];
        break;
      }
    }
  }
  if (params.logprobs) return score(logits, result.token, *params.logprobs);
  return result;
}

TokenLogprob Sampler::score(std::span<const float> logits, int32_t token, int32_t top_n) {
  PA_CHECK(!logits.empty(), "sampler: an empty logits row");
  const size_t vocab = logits.size();
  PA_CHECK(token >= 0 && static_cast<size_t>(token) < vocab, "sampler: token {} outside [0, {})",
           token, vocab);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (const float logit : logits) max_logit = std::max<double>(max_logit, logit);
  double total = 0.0;
  for (const float logit : logits) total += std::exp(static_cast<double>(logit) - max_logit);
  const double log_total = max_logit + std::log(total);
  auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(t)]) - log_total);
  };
  TokenLogprob result;
  result.token = token;
  result.logprob = logprob(token);
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top_n, 0)), vocab);
  if (n > 0) {
    candidates_.resize(vocab);
    for (size_t t = 0; t < vocab; ++t) candidates_[t] = static_cast<int32_t>(t);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(n),
                      candidates_.end(),
                      [&](int32_t a, int32_t b) { return before(logits, a, b); });
    for (size_t i = 0; i < n; ++i) result.top.emplace_back(candidates_[i], logprob(candidates_[i]));
  }
  return result;
}

}  // namespace pagedattn::engine
