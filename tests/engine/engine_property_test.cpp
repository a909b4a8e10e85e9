// Engine property tests: random arrivals, aborts and completions (seeded; the seed is printed and
// PAGEDATTN_TEST_SEED overrides it) against the paged fake model, across token budgets 1, 4, 16,
// 64 and unbounded, prefix cache on and off, page sizes 1, 16 and 64, and a pool so small that
// preemption happens. Each run checks, after every step, the allocator / cache / sequence
// invariants, and at the end that no page leaked and every request finished exactly once. Every
// request's output (tokens, text, finish reason) must equal that request run alone in a plain
// engine (no cache, no budget, a large pool); greedy requests must also equal a direct argmax
// loop over the fake model with no engine, and every text must follow the stop-string rule
// computed from the tokens. Aborted requests must have produced a prefix of their alone output.
//
// The same again with overlap scheduling (the fake runs each launched step only when the engine
// collects it, after the next one was launched), over requests that the runner can sample (a few
// with penalties or top-n logprobs, which make the engine step one at a time while they live):
// the same outputs as each request alone in a plain engine without overlap.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "engine/harness.h"

namespace pagedattn::engine::testing {
namespace {

constexpr int32_t kVocab = 48;
constexpr int64_t kModelLength = 192;
const std::vector<int32_t> kEos = {kVocab - 1};

uint64_t test_seed() {
  const char* value = std::getenv("PAGEDATTN_TEST_SEED");
  return value != nullptr ? std::strtoull(value, nullptr, 10) : 20261204;
}

// Prompts share a few prefixes (so the cache hits, at page and non-page boundaries) and mix
// greedy and seeded sampling, penalties, stop tokens and strings, n > 1 and aborts. With
// `host_rows` false, penalties and top-n logprobs (rows the runner cannot sample) are rare.
std::vector<Spec> make_specs(uint64_t seed, size_t count, bool host_rows) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<std::vector<int32_t>> prefixes(4);
  for (auto& prefix : prefixes) {
    prefix.resize(static_cast<size_t>(uniform(0, 100)));
    for (auto& token : prefix) token = static_cast<int32_t>(uniform(0, kVocab - 2));
  }
  std::vector<Spec> specs(count);
  int64_t arrival = 0;
  for (Spec& spec : specs) {
    spec.prompt = prefixes[static_cast<size_t>(uniform(0, 3))];
    const int64_t suffix = uniform(spec.prompt.empty() ? 1 : 0, 40);
    for (int64_t i = 0; i < suffix; ++i)
      spec.prompt.push_back(static_cast<int32_t>(uniform(0, kVocab - 2)));
    SamplingParams& params = spec.params;
    const int64_t room = kModelLength - static_cast<int64_t>(spec.prompt.size());
    params.max_tokens = static_cast<int32_t>(std::min<int64_t>(room, uniform(1, 40)));
    if (uniform(0, 2) == 0) {
      params.temperature = 0.0;
    } else {
      params.temperature = 0.5 + 0.25 * static_cast<double>(uniform(0, 4));
      params.seed = static_cast<uint64_t>(uniform(0, 1000));
      if (uniform(0, 1)) params.top_k = static_cast<int32_t>(uniform(1, 20));
      if (uniform(0, 1)) params.top_p = 0.5 + 0.1 * static_cast<double>(uniform(0, 5));
      if (uniform(0, 3) == 0) params.min_p = 0.05;
    }
    const bool host = host_rows || uniform(0, 15) == 0;
    if (host && uniform(0, 3) == 0) params.repetition_penalty = 1.3;
    if (host && uniform(0, 3) == 0) params.frequency_penalty = 0.5;
    if (host && uniform(0, 3) == 0) params.presence_penalty = -0.5;
    if (uniform(0, 4) == 0) params.stop_token_ids = {static_cast<int32_t>(uniform(0, kVocab - 2))};
    if (uniform(0, 3) == 0) params.stop = {"cx", "dda"};
    params.ignore_eos = uniform(0, 3) == 0;
    if (uniform(0, 7) == 0) params.n = static_cast<int32_t>(uniform(2, 3));
    if (uniform(0, 5) == 0) params.logprobs = host ? 2 : 0;
    arrival += uniform(0, 3);
    spec.arrival_step = arrival;
    if (uniform(0, 7) == 0) spec.abort_step = arrival + uniform(0, 30);
  }
  return specs;
}

struct Reference {
  std::vector<Spec> specs;
  std::vector<Outcome> alone;
};

// Each request alone (no abort) in a plain engine, checked against the direct greedy loop and
// the text rule; computed once per spec set and shared by every configuration.
Reference build_reference(bool host_rows) {
  Reference built;
  Reference* ref = &built;
  {
    const uint64_t seed = test_seed() + (host_rows ? 0 : 1);
    std::cout << "engine property seed: " << seed << " (PAGEDATTN_TEST_SEED)\n";
    ref->specs = make_specs(seed, 96, host_rows);
    EngineConfig plain;
    plain.page_size = 16;
    plain.num_pages = 64;
    plain.max_tokens_per_step = 0;
    plain.max_model_length = kModelLength;
    plain.prefix_cache = false;
    plain.eos_token_ids = kEos;
    for (const Spec& spec : ref->specs) {
      Spec alone = spec;
      alone.arrival_step = 0;
      alone.abort_step = -1;
      RunSummary summary = run_specs(plain, {alone}, kVocab);
      const Outcome& outcome = summary.outcomes[0];
      for (const ChoiceOutcome& choice : outcome) {
        EXPECT_EQ(choice.num_finish_events, 1);
        expect_text_rule(spec, choice);
        if (spec.params.temperature == 0.0 && spec.params.stop.empty() &&
            spec.params.repetition_penalty == 1.0 && spec.params.frequency_penalty == 0.0 &&
            spec.params.presence_penalty == 0.0) {
          EXPECT_EQ(choice.tokens, direct_greedy(spec, kVocab, kEos, *spec.params.max_tokens));
        }
      }
      ref->alone.push_back(outcome);
    }
  }
  return built;
}

const Reference& reference(bool overlap) {
  static const Reference mixed = build_reference(true);
  static const Reference sampled = build_reference(false);
  return overlap ? sampled : mixed;
}

struct Config {
  int32_t page_size;
  int64_t budget;  // 0: unbounded
  bool prefix_cache;
  bool small_pool;
  bool overlap;
};

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return "P" + std::to_string(c.page_size) + "_budget" +
         (c.budget > 0 ? std::to_string(c.budget) : std::string("Unbounded")) +
         (c.prefix_cache ? "_cache" : "_nocache") + (c.small_pool ? "_smallpool" : "_bigpool") +
         (c.overlap ? "_overlap" : "");
}

class EngineProperty : public ::testing::TestWithParam<Config> {};

TEST_P(EngineProperty, SameOutputAsAloneNoLeaksEveryRequestAnsweredOnce) {
  const Config& c = GetParam();
  const Reference& ref = reference(c.overlap);
  EngineConfig config;
  config.page_size = c.page_size;
  const int32_t pages_for_one =
      static_cast<int32_t>((kModelLength + c.page_size - 1) / c.page_size);
  // Small: one longest request and a page more, so concurrent requests preempt each other.
  config.num_pages = c.small_pool ? pages_for_one + 1 : pages_for_one * 24;
  config.max_tokens_per_step = c.budget;
  config.max_running = 32;
  config.max_model_length = kModelLength;
  config.prefix_cache = c.prefix_cache;
  config.eos_token_ids = kEos;
  if (c.overlap) {
    config.model_sampling = true;
    config.overlap = true;
  }
  const RunSummary summary = run_specs(config, ref.specs, kVocab);
  if (c.overlap) {
    // Steps did overlap: two in flight at once, decode inputs pending at launch.
    EXPECT_GT(summary.num_overlapped_steps, summary.stats.num_steps / 2);
    EXPECT_GT(summary.num_pending_resolved, 0);
    EXPECT_EQ(summary.max_in_flight, 2);
    EXPECT_GT(summary.stats.num_overlapped_steps, summary.stats.num_steps / 2);
  }
  if (c.budget > 0) {
    EXPECT_LE(summary.max_step_tokens, c.budget);
  }
  if (c.small_pool && c.budget != 1) {  // budget 1 runs one request at a time
    EXPECT_GT(summary.stats.num_preemptions, 0) << "the small pool never preempted";
  }
  if (c.prefix_cache) {
    EXPECT_GT(summary.stats.prefix_hit_tokens, 0);
  }
  for (size_t i = 0; i < ref.specs.size(); ++i) {
    const Spec& spec = ref.specs[i];
    for (size_t k = 0; k < summary.outcomes[i].size(); ++k) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k));
      const ChoiceOutcome& got = summary.outcomes[i][k];
      const ChoiceOutcome& alone = ref.alone[i][k];
      EXPECT_EQ(got.num_finish_events, 1);
      EXPECT_FALSE(got.event_after_finish);
      expect_text_rule(spec, got);
      if (got.reason == FinishReason::kAbort) {
        ASSERT_NE(spec.abort_step, -1) << "aborted without being asked";
        ASSERT_LE(got.tokens.size(), alone.tokens.size());
        EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), alone.tokens.begin()));
        continue;
      }
      EXPECT_EQ(got.tokens, alone.tokens);
      EXPECT_EQ(got.text, alone.text);
      EXPECT_EQ(got.reason, alone.reason);
      EXPECT_EQ(got.stop_string, alone.stop_string);
      EXPECT_EQ(got.stop_token, alone.stop_token);
    }
  }
}

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (const int32_t page_size : {1, 16, 64}) {
    for (const int64_t budget : {1, 4, 16, 64, 0}) {
      for (const bool cache : {false, true}) {
        for (const bool small : {false, true}) {
          for (const bool overlap : {false, true})
            configs.push_back({page_size, budget, cache, small, overlap});
        }
      }
    }
  }
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Configs, EngineProperty, ::testing::ValuesIn(all_configs()), config_name);

}  // namespace
}  // namespace pagedattn::engine::testing
