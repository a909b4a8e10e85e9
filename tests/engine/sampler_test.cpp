// Sampler tests against a float64 reference written here from vLLM's definitions (bias ->
// repetition / frequency / presence penalties -> temperature -> min-p -> top-k -> top-p):
// greedy tokens, the set of tokens each filter keeps, the processed logits, logprobs and top-n;
// statistical tests with fixed seeds (no excluded token is ever drawn; over 40000 draws each
// token's frequency is within 5 standard deviations of the renormalised reference probability);
// seed determinism; parameter validation messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/expect_error.h"
#include "pagedattn/engine_sampler.h"

namespace pagedattn::engine {
namespace {
using testing::expect_error;

struct RefResult {
  std::vector<double> logits;  // processed (before temperature for greedy)
  std::vector<double> probs;   // renormalised over the kept tokens; 0 elsewhere
  int32_t greedy = -1;
};

RefResult reference(const std::vector<float>& raw, const SamplingParams& params,
                    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  const size_t vocab = raw.size();
  RefResult result;
  std::vector<double>& l = result.logits;
  l.assign(raw.begin(), raw.end());
  for (const auto& [token, bias] : params.logit_bias) l[static_cast<size_t>(token)] += bias;
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  std::map<int32_t, int> counts;
  for (const int32_t token : output) {
    seen.insert(token);
    ++counts[token];
  }
  if (params.repetition_penalty != 1.0) {
    for (const int32_t token : seen) {
      double& x = l[static_cast<size_t>(token)];
      x = x > 0 ? x / params.repetition_penalty : x * params.repetition_penalty;
    }
  }
  for (const auto& [token, count] : counts) {
    l[static_cast<size_t>(token)] -= params.frequency_penalty * count + params.presence_penalty;
  }
  if (params.temperature < 1e-5) {
    result.greedy = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    return result;
  }
  for (double& x : l) x /= params.temperature;
  const double top = *std::max_element(l.begin(), l.end());
  std::vector<bool> keep(vocab, true);
  for (size_t t = 0; t < vocab; ++t) {
    if (std::exp(l[t] - top) < params.min_p) keep[t] = false;  // p_t / p_max < min_p
  }
  std::vector<int32_t> order;
  for (size_t t = 0; t < vocab; ++t) {
    if (keep[t]) order.push_back(static_cast<int32_t>(t));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < order.size()) {
    const double kth = l[static_cast<size_t>(order[static_cast<size_t>(params.top_k - 1)])];
    std::erase_if(order, [&](int32_t t) { return l[size_t(t)] < kth; });
  }
  double total = 0;
  for (const int32_t t : order) total += std::exp(l[size_t(t)] - top);
  if (params.top_p < 1.0) {
    double mass = 0;
    size_t n = 0;
    while (n < order.size() && mass < params.top_p * total)
      mass += std::exp(l[size_t(order[n++])] - top);
    order.resize(std::max<size_t>(n, 1));
  }
  result.probs.assign(vocab, 0.0);
  double kept = 0;
  for (const int32_t t : order) kept += std::exp(l[size_t(t)] - top);
  for (const int32_t t : order) result.probs[size_t(t)] = std::exp(l[size_t(t)] - top) / kept;
  return result;
}

std::vector<float> random_logits(std::mt19937_64& rng, size_t vocab, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

SamplingParams random_params(std::mt19937_64& rng, int32_t vocab) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  SamplingParams params;
  params.temperature = pick(5) == 0 ? 0.0 : 0.3 + 0.4 * pick(4);
  if (pick(2)) params.top_k = 1 + pick(vocab);
  if (pick(2)) params.top_p = 0.2 + 0.2 * pick(5);
  if (pick(3) == 0) params.min_p = 0.02 * (1 + pick(10));
  if (pick(3) == 0) params.repetition_penalty = 0.7 + 0.3 * pick(4);
  if (pick(3) == 0) params.frequency_penalty = -1.0 + 0.5 * pick(5);
  if (pick(3) == 0) params.presence_penalty = -1.0 + 0.5 * pick(5);
  if (pick(3) == 0) params.logit_bias = {{pick(vocab), 2.5f}, {pick(vocab), -50.0f}};
  return params;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int32_t vocab, int n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  return tokens;
}

TEST(Sampler, ProcessedLogitsAndKeptSetsMatchFloat64Reference) {
  std::mt19937_64 rng(7);
  Sampler sampler;
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t vocab = 1 + static_cast<int32_t>(rng() % 300);
    const auto logits = random_logits(rng, static_cast<size_t>(vocab), 2.0f);
    const SamplingParams params = random_params(rng, vocab);
    const auto prompt = random_tokens(rng, vocab, 12);
    const auto output = random_tokens(rng, vocab, static_cast<int>(rng() % 20));
    const RefResult ref = reference(logits, params, prompt, output);
    const SampleContext context{prompt, output, 1, 0, 0};
    const std::vector<float> got = sampler.processed_logits(logits, params, context);
    SCOPED_TRACE("trial " + std::to_string(trial));
    for (size_t t = 0; t < got.size(); ++t) {
      const bool kept = ref.greedy >= 0 || ref.probs[t] > 0.0;
      ASSERT_EQ(std::isfinite(got[t]), kept) << "token " << t;
      if (kept) {
        ASSERT_NEAR(got[t], ref.logits[t], 1e-4 * (1 + std::abs(ref.logits[t])));
      }
    }
    const TokenLogprob sampled = sampler.sample(logits, params, context);
    if (ref.greedy >= 0) {
      EXPECT_EQ(sampled.token, ref.greedy);
    } else {
      EXPECT_GT(ref.probs[size_t(sampled.token)], 0.0) << "drew an excluded token";
    }
  }
}

struct StatCase {
  const char* name;
  SamplingParams params;
};

TEST(Sampler, FrequenciesMatchRenormalisedDistribution) {
  std::mt19937_64 rng(11);
  const int32_t vocab = 24;
  const auto logits = random_logits(rng, vocab, 1.5f);
  const std::vector<int32_t> prompt = {1, 2, 3, 3};
  const std::vector<int32_t> output = {3, 5, 5, 7};
  std::vector<StatCase> cases(6);
  cases[0] = {"temperature", {}};
  cases[0].params.temperature = 0.8;
  cases[1] = {"top_k", {}};
  cases[1].params.top_k = 5;
  cases[2] = {"top_p", {}};
  cases[2].params.top_p = 0.6;
  cases[3] = {"min_p", {}};
  cases[3].params.min_p = 0.1;
  cases[4] = {"all_filters", {}};
  cases[4].params.temperature = 1.3;
  cases[4].params.top_k = 9;
  cases[4].params.top_p = 0.8;
  cases[4].params.min_p = 0.05;
  cases[5] = {"penalties_bias", {}};
  cases[5].params.repetition_penalty = 1.5;
  cases[5].params.frequency_penalty = 0.4;
  cases[5].params.presence_penalty = 0.3;
  cases[5].params.logit_bias = {{0, 1.5f}};
  Sampler sampler;
  const int draws = 40000;
  for (const StatCase& c : cases) {
    SCOPED_TRACE(c.name);
    const RefResult ref = reference(logits, c.params, prompt, output);
    std::vector<int> counts(vocab, 0);
    for (int i = 0; i < draws; ++i) {
      const SampleContext context{prompt, output, 1234, 0, static_cast<uint64_t>(i)};
      ++counts[size_t(sampler.sample(logits, c.params, context).token)];
    }
    for (int32_t t = 0; t < vocab; ++t) {
      const double p = ref.probs[size_t(t)];
      const double freq = static_cast<double>(counts[size_t(t)]) / draws;
      if (p == 0.0) {
        EXPECT_EQ(counts[size_t(t)], 0) << "token " << t << " is excluded but was drawn";
      } else {
        EXPECT_NEAR(freq, p, 5.0 * std::sqrt(p * (1 - p) / draws) + 1e-4) << "token " << t;
      }
    }
  }
}

TEST(Sampler, SeedGivesSameTokensWhateverTheCallOrder) {
  std::mt19937_64 rng(3);
  const auto logits = random_logits(rng, 50, 1.0f);
  SamplingParams params;
  params.top_p = 0.9;
  Sampler a, b;
  std::vector<int32_t> forward_order, backward_order(100);
  for (uint64_t position = 0; position < 100; ++position) {
    forward_order.push_back(a.sample(logits, params, {{}, {}, 42, 1, position}).token);
  }
  for (uint64_t position = 100; position-- > 0;) {
    backward_order[position] = b.sample(logits, params, {{}, {}, 42, 1, position}).token;
  }
  EXPECT_EQ(forward_order, backward_order);
  EXPECT_GT(std::set<int32_t>(forward_order.begin(), forward_order.end()).size(), 5u);
  // Another seed or choice draws other numbers.
  EXPECT_NE(sampling_uniform(42, 1, 0), sampling_uniform(43, 1, 0));
  EXPECT_NE(sampling_uniform(42, 1, 0), sampling_uniform(42, 2, 0));
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = sampling_uniform(9, 0, i);
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithTopN) {
  std::mt19937_64 rng(5);
  Sampler sampler;
  for (int trial = 0; trial < 50; ++trial) {
    const size_t vocab = 2 + rng() % 200;
    const auto logits = random_logits(rng, vocab, 3.0f);
    SamplingParams params;
    params.temperature = 0.7;
    params.repetition_penalty = 1.2;  // logprobs stay those of the raw logits
    params.logprobs = static_cast<int32_t>(rng() % 6);
    const std::vector<int32_t> output = {0};
    const TokenLogprob result = sampler.sample(logits, params, {{}, output, 8, 0, 0});
    double max = -1e300, total = 0;
    for (float x : logits) max = std::max<double>(max, x);
    for (float x : logits) total += std::exp(x - max);
    auto ref = [&](int32_t t) { return logits[size_t(t)] - max - std::log(total); };
    EXPECT_NEAR(result.logprob, ref(result.token), 1e-5);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    ASSERT_EQ(result.top.size(), std::min<size_t>(vocab, size_t(*params.logprobs)));
    for (size_t i = 0; i < result.top.size(); ++i) {
      EXPECT_EQ(result.top[i].first, order[i]);
      EXPECT_NEAR(result.top[i].second, ref(order[i]), 1e-5);
    }
    // rank: the token's place in that order (ties: the lower id first), from 1.
    const auto place = std::find(order.begin(), order.end(), result.token) - order.begin();
    EXPECT_EQ(result.rank, place + 1);
  }
  // With ties: a row of equal logits ranks by id.
  const std::vector<float> flat(7, 0.5f);
  EXPECT_EQ(sampler.score(flat, 4, 2).rank, 5);
  EXPECT_EQ(sampler.score(flat, 0, 0).rank, 1);
}

TEST(Sampler, GreedyTiesTakeLowestIdAndBiasCanForceAToken) {
  Sampler sampler;
  SamplingParams params;
  params.temperature = 0.0;
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f};
  EXPECT_EQ(sampler.sample(logits, params, {}).token, 1);
  params.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(sampler.sample(logits, params, {}).token, 3);
  params.temperature = 1.0;
  params.logit_bias = {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}};
  for (uint64_t i = 0; i < 50; ++i)
    EXPECT_EQ(sampler.sample(logits, params, {{}, {}, 1, 0, i}).token, 3);
}

TEST(SamplingParams, ValidationNamesTheParameter) {
  const ModelLimits limits{100, 64};
  auto bad = [&](auto mutate, const char* message, int64_t prompt = 4) {
    SamplingParams params;
    mutate(params);
    expect_error([&] { validate(params, prompt, limits); }, message);
  };
  bad([](SamplingParams& p) { p.top_p = 0.0; }, "top_p: 0 (expected in (0, 1])");
  bad([](SamplingParams& p) { p.top_p = 1.5; }, "top_p: 1.5");
  bad([](SamplingParams& p) { p.temperature = -0.1; }, "temperature: -0.1");
  bad([](SamplingParams& p) { p.temperature = NAN; }, "temperature: nan");
  bad([](SamplingParams& p) { p.top_k = -2; }, "top_k: -2");
  bad([](SamplingParams& p) { p.min_p = 1.2; }, "min_p: 1.2");
  bad([](SamplingParams& p) { p.repetition_penalty = 0.0; }, "repetition_penalty: 0");
  bad([](SamplingParams& p) { p.presence_penalty = 3.0; }, "presence_penalty: 3");
  bad([](SamplingParams& p) { p.frequency_penalty = -2.5; }, "frequency_penalty: -2.5");
  bad([](SamplingParams& p) { p.max_tokens = -1; }, "max_tokens: -1 (expected >= 0)");
  bad([](SamplingParams& p) { p.max_tokens = 61; }, "max_tokens: 61 with a prompt of 4 tokens");
  bad([](SamplingParams& p) { p.n = 0; }, "n: 0");
  bad([](SamplingParams& p) { p.logprobs = 21; }, "logprobs: 21");
  bad([](SamplingParams& p) { p.prompt_logprobs = -1; }, "prompt_logprobs: -1 (expected 0 to 20)");
  bad([](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs: 21");
  bad([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }, "logit_bias: token 100");
  bad([](SamplingParams& p) { p.logit_bias = {{1, 200.0f}}; }, "logit_bias: token 1 has bias 200");
  bad([](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids: -1");
  bad([](SamplingParams& p) { p.stop = {""}; }, "stop: an empty stop string");
  bad([](SamplingParams&) {}, "prompt: 64 tokens, but the model length is 64", 64);
  bad([](SamplingParams&) {}, "prompt: 0 tokens", 0);
  SamplingParams fine;
  fine.max_tokens = 60;
  fine.top_k = 0;
  validate(fine, 4, limits);
  fine.max_tokens = 0;  // the prompt only (scoring it)
  fine.prompt_logprobs = 20;
  validate(fine, 4, limits);
  EXPECT_EQ(resolved_max_tokens(fine, 4, limits), 0);
  EXPECT_EQ(resolved_max_tokens(SamplingParams{}, 4, limits), 60);
}

}  // namespace
}  // namespace pagedattn::engine
