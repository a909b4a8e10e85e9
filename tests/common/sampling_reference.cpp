// The float64 sampling reference and random rows (see sampling_reference.h).
#include "common/sampling_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagedattn::testing {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double reference_uniform(uint64_t seed, uint64_t choice, uint64_t position) {
  return static_cast<double>(mix(mix(mix(seed) ^ choice) ^ position) >> 11) / 9007199254740992.0;
}

int32_t SamplingReference::draw(double u, double* margin) const {
  if (greedy) {
    if (margin) *margin = 1.0;
    return kept.front();
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  const double target = u * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    const double before = cumulative;
    cumulative += weights[i];
    if (target < cumulative) {
      // The boundaries that can change the token: not before the first, not after the last.
      if (margin) {
        *margin = 1.0;
        if (i > 0) *margin = std::min(*margin, (target - before) / total);
        if (i + 1 < kept.size()) *margin = std::min(*margin, (cumulative - target) / total);
      }
      return kept[i];
    }
  }
  if (margin) *margin = 0.0;
  return kept.back();
}

SamplingReference sampling_reference(const std::vector<float>& logits, const SamplingSpec& spec) {
  const size_t vocab = logits.size();
  SamplingReference ref;
  double raw_max = -std::numeric_limits<double>::infinity();
  for (const float x : logits) {
    if (!std::isnan(x)) raw_max = std::max(raw_max, static_cast<double>(x));
  }
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - raw_max);
  const double log_total = raw_max + std::log(sum);
  auto finish = [&](SamplingReference& r) {
    r.logprob = static_cast<double>(logits[static_cast<size_t>(r.token)]) - log_total;
    return r;
  };
  if (spec.temperature < 1e-5) {
    ref.greedy = true;
    // The highest non-NaN value, lowest id among equals; every value NaN: the last id.
    int32_t best = static_cast<int32_t>(vocab) - 1;
    for (size_t t = vocab; t-- > 0;) {
      if (std::isnan(logits[t])) continue;
      if (std::isnan(logits[static_cast<size_t>(best)]) ||
          logits[t] >= logits[static_cast<size_t>(best)]) {
        best = static_cast<int32_t>(t);
      }
    }
    ref.kept = {best};
    ref.weights = {1.0};
    ref.token = best;
    return finish(ref);
  }
  // The scaled logits: one f32 multiply each (part of the definition).
  const float inverse = static_cast<float>(1.0 / spec.temperature);
  std::vector<float> scaled(vocab);
  float max = -std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < vocab; ++t) {
    scaled[t] = logits[t] * inverse;
    if (scaled[t] > max) max = scaled[t];
  }
  std::vector<int32_t> order;  // value descending, id ascending
  for (size_t t = 0; t < vocab; ++t) {
    if (!std::isnan(scaled[t]) && scaled[t] > -std::numeric_limits<float>::infinity()) {
      order.push_back(static_cast<int32_t>(t));
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scaled[size_t(a)] > scaled[size_t(b)]; });
  if (spec.min_p > 0.0) {
    const float floor = max + static_cast<float>(std::log(spec.min_p));
    std::erase_if(order, [&](int32_t t) { return !(scaled[size_t(t)] >= floor); });
  }
  if (spec.top_k > 0 && static_cast<size_t>(spec.top_k) < order.size()) {
    const float kth = scaled[size_t(order[size_t(spec.top_k - 1)])];
    std::erase_if(order, [&](int32_t t) { return scaled[size_t(t)] < kth; });
  }
  auto weight = [&](int32_t t) {
    return std::exp(static_cast<double>(scaled[size_t(t)]) - static_cast<double>(max));
  };
  if (spec.top_p < 1.0) {
    double total = 0.0;
    for (const int32_t t : order) total += weight(t);
    const double target = spec.top_p * total;
    double mass = 0.0;
    size_t n = 0;
    ref.top_p_margin = 1.0;
    double before = 0.0;
    while (n < order.size() && mass < target) {
      before = mass;
      mass += weight(order[n++]);
    }
    // The count changes if target crosses the mass before the last kept token (unless it is the
    // first: one is always kept) or the mass with it (unless all are kept).
    if (n >= 2) ref.top_p_margin = std::min(ref.top_p_margin, (target - before) / total);
    if (n < order.size()) ref.top_p_margin = std::min(ref.top_p_margin, (mass - target) / total);
    order.resize(std::max<size_t>(n, 1));
  } else {
    std::sort(order.begin(), order.end());  // the draw goes in id order
  }
  ref.kept = order;
  for (const int32_t t : order) ref.weights.push_back(weight(t));
  ref.uniform = reference_uniform(spec.seed, spec.choice, spec.position);
  ref.token = ref.draw(ref.uniform, &ref.draw_margin);
  return finish(ref);
}

std::vector<float> random_sampling_row(std::mt19937_64& rng, int64_t vocab, int kind) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::uniform_real_distribution<float> scale_dist(1.0f, 6.0f);
  std::normal_distribution<float> normal(0.0f, scale_dist(rng));
  for (float& x : row) x = normal(rng);
  if (kind == 1) {
    for (float& x : row) x = std::round(x * 2.0f) / 2.0f;
  } else if (kind == 2) {
    std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
    for (int64_t i = 0; i < std::max<int64_t>(1, vocab / 50); ++i) {
      row[static_cast<size_t>(pick(rng))] = -std::numeric_limits<float>::infinity();
      row[static_cast<size_t>(pick(rng))] = std::numeric_limits<float>::quiet_NaN();
    }
  } else if (kind == 3) {
    row[static_cast<size_t>(std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng))] += 25.0f;
  }
  return row;
}

SamplingSpec random_sampling_spec(std::mt19937_64& rng, int64_t vocab) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  SamplingSpec spec;
  spec.seed = rng();
  spec.choice = static_cast<uint64_t>(pick(4));
  spec.position = static_cast<uint64_t>(pick(5000));
  if (pick(6) == 0) {
    spec.temperature = 0.0;
    return spec;
  }
  const double temperatures[] = {0.3, 0.7, 1.0, 1.0, 1.6};
  spec.temperature = temperatures[pick(5)];
  switch (pick(5)) {
    case 0:
      spec.top_k = 1;
      break;
    case 1:
      spec.top_k = static_cast<int32_t>(vocab);
      break;
    case 2:
      spec.top_k = 1 + pick(static_cast<int>(std::min<int64_t>(vocab, 100)));
      break;
    default:
      break;  // off
  }
  switch (pick(6)) {
    case 0:
      spec.top_p = 1e-9;
      break;
    case 1:
      spec.top_p = 0.5;
      break;
    case 2:
      spec.top_p = 0.9;
      break;
    case 3:
      spec.top_p = 0.05 + 0.9 * std::uniform_real_distribution<double>(0, 1)(rng);
      break;
    default:
      break;  // 1
  }
  switch (pick(6)) {
    case 0:
      spec.min_p = 1.0;
      break;
    case 1:
      spec.min_p = 0.05;
      break;
    case 2:
      spec.min_p = 0.3;
      break;
    default:
      break;  // 0
  }
  return spec;
}

}  // namespace pagedattn::testing
