// The CPU reference of row sampling (see include/pagedattn/sampling.h for the algorithm).
//
// Scratch vectors are vocab-sized and reused across rows (one RowSampler per thread). Top-k finds
// its threshold with nth_element over a copy of the candidates' values and keeps the candidates in
// id order; top-p sorts only the head of the (value descending, id ascending) order, growing it x4
// while its mass falls short (a large vocabulary is never fully sorted in the usual case).
#include "pagedattn/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace pagedattn::ops {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t choice, uint64_t position) {
  const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ choice) ^ position);
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}

RowFilter row_filter(const RowSampling& spec) {
  PA_CHECK(spec.temperature >= 0.0 && std::isfinite(spec.temperature),
           "sampling: temperature {} (expected >= 0)", spec.temperature);
  PA_CHECK(spec.top_p > 0.0 && spec.top_p <= 1.0, "sampling: top_p {} (expected in (0, 1])",
           spec.top_p);
  PA_CHECK(spec.min_p >= 0.0 && spec.min_p <= 1.0, "sampling: min_p {} (expected in [0, 1])",
           spec.min_p);
  RowFilter filter;
  filter.greedy = is_greedy(spec.temperature) ? 1 : 0;
  if (filter.greedy) return filter;
  filter.top_k = spec.top_k > 0 ? spec.top_k : 0;
  filter.inverse_temperature = static_cast<float>(1.0 / spec.temperature);
  filter.has_min_p = spec.min_p > 0.0 ? 1 : 0;
  filter.log_min_p = filter.has_min_p ? static_cast<float>(std::log(spec.min_p)) : 0.0f;
  filter.sorted_draw = spec.top_p < 1.0 ? 1 : 0;
  filter.top_p = spec.top_p;
  filter.uniform = sampling_uniform(spec.seed, spec.choice, spec.position);
  return filter;
}

int32_t greedy_token(std::span<const float> logits) {
  PA_CHECK(!logits.empty(), "sampling: an empty logits row");
  size_t best = 0;
  for (size_t t = 1; t < logits.size(); ++t) {
    if (logits[t] > logits[best] || std::isnan(logits[best])) best = t;
  }
  return static_cast<int32_t>(best);
}

double log_sum_exp(std::span<const float> logits) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (const float logit : logits) max_logit = std::max<double>(max_logit, logit);
  double total = 0.0;
  for (const float logit : logits) total += std::exp(static_cast<double>(logit) - max_logit);
  return max_logit + std::log(total);
}

void RowSampler::filter(std::span<float> logits, const RowFilter& filter) {
  PA_CHECK(!filter.greedy, "sampling: filter() of a greedy row");
  const size_t vocab = logits.size();
  float max_logit = kNegInf;
  for (float& logit : logits) {
    logit *= filter.inverse_temperature;
    max_logit = std::max(max_logit, logit);
  }
  PA_CHECK(max_logit > kNegInf, "sampler: every logit is -inf or NaN (nothing to sample)");
  max_ = max_logit;
  // min-p: p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p).
  const float floor = filter.has_min_p ? max_logit + filter.log_min_p : kNegInf;
  candidates_.clear();
  for (size_t t = 0; t < vocab; ++t) {
    if (logits[t] >= floor && logits[t] > kNegInf) {
      candidates_.push_back(static_cast<int32_t>(t));
    } else {
      logits[t] = kNegInf;
    }
  }
  if (filter.top_k > 0 && static_cast<size_t>(filter.top_k) < candidates_.size()) {
    scratch_.clear();
    for (const int32_t t : candidates_) scratch_.push_back(logits[static_cast<size_t>(t)]);
    const auto kth = scratch_.begin() + (filter.top_k - 1);
    std::nth_element(scratch_.begin(), kth, scratch_.end(), std::greater<float>());
    const float threshold = *kth;
    std::erase_if(candidates_, [&](int32_t t) {
      if (logits[static_cast<size_t>(t)] >= threshold) return false;
      logits[static_cast<size_t>(t)] = kNegInf;
      return true;
    });
  }
  weights_.resize(vocab);
  const double top = static_cast<double>(max_logit);
  for (const int32_t t : candidates_) {
    weights_[static_cast<size_t>(t)] =
        std::exp(static_cast<double>(logits[static_cast<size_t>(t)]) - top);
  }
  filter_margin_ = margin_ = 1.0;
  if (!filter.sorted_draw) return;
  // top-p over the (value descending, id ascending) order.
  auto order = [&](int32_t a, int32_t b) {
    const float va = logits[static_cast<size_t>(a)];
    const float vb = logits[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  };
  double total = 0.0;
  for (const int32_t t : candidates_) total += weights_[static_cast<size_t>(t)];
  const double target = filter.top_p * total;
  double mass = 0.0, before = 0.0;
  size_t keep = 0;
  size_t sorted = 0;
  while (keep < candidates_.size() && mass < target) {
    if (keep == sorted) {
      sorted = std::min(candidates_.size(), std::max<size_t>(64, sorted * 4));
      std::partial_sort(candidates_.begin() + static_cast<ptrdiff_t>(keep),
                        candidates_.begin() + static_cast<ptrdiff_t>(sorted), candidates_.end(),
                        order);
    }
    before = mass;
    mass += weights_[static_cast<size_t>(candidates_[keep])];
    ++keep;
  }
  // The cut moves if target crosses the mass before the last kept token (unless that is the
  // first: one is always kept) or the mass with it (unless every token is kept already).
  margin_ = 1.0;
  if (keep >= 2) margin_ = std::min(margin_, (target - before) / total);
  if (keep < candidates_.size()) margin_ = std::min(margin_, (mass - target) / total);
  filter_margin_ = margin_;
  keep = std::max<size_t>(keep, 1);
  for (size_t i = keep; i < candidates_.size(); ++i) {
    logits[static_cast<size_t>(candidates_[i])] = kNegInf;
  }
  candidates_.resize(keep);
}

int32_t RowSampler::draw(std::span<const float> logits, double uniform) {
  PA_CHECK(!candidates_.empty() && weights_.size() == logits.size(),
           "sampling: draw() without a filter() of this row");
  double total = 0.0;
  for (const int32_t t : candidates_) total += weights_[static_cast<size_t>(t)];
  const double target = uniform * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const double before = cumulative;
    cumulative += weights_[static_cast<size_t>(candidates_[i])];
    if (target < cumulative) {
      // Boundaries that can change the token: not before the first, not after the last.
      margin_ = filter_margin_;
      if (i > 0) margin_ = std::min(margin_, (target - before) / total);
      if (i + 1 < candidates_.size()) margin_ = std::min(margin_, (cumulative - target) / total);
      return candidates_[i];
    }
  }
  margin_ = 0.0;  // only rounding gets here
  return candidates_.back();
}

RowDraw RowSampler::sample(std::span<const float> logits, const RowSampling& spec) {
  PA_CHECK(!logits.empty(), "sampling: an empty logits row");
  const RowFilter row = row_filter(spec);
  RowDraw out;
  if (row.greedy) {
    out.token = greedy_token(logits);
  } else {
    work_.assign(logits.begin(), logits.end());
    filter(work_, row);
    out.token = draw(work_, row.uniform);
    out.margin = margin_;
  }
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(out.token)]) -
                                   log_sum_exp(logits));
  return out;
}

}  // namespace pagedattn::ops
