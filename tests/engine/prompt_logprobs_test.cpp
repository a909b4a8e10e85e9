// SamplingParams::prompt_logprobs through the engine with the paged fake model, whose logits row
// at position p is a function of the tokens [0, p] read back through the pages. The oracle is that
// function applied to the prompt directly, with a float64 log-softmax and a full sort for the
// top-n here in the test (never the engine's Sampler::score). Checked in every configuration
// (token budgets 1 / 4 / 16 / unbounded: chunked prefill; page sizes 1 / 4 / 16; prefix cache on
// and off; pools small enough to preempt and recompute; a bound on the scored rows per step):
//  - each choice's first event carries prompt_length - 1 entries, the logprob of prompt token
//    p + 1 under row p with its top-n, every entry equal to the reference; no other event
//    carries any (a recompute after preemption neither repeats nor loses them);
//  - a scoring request takes no prefix-cache hit while the same prompt without scoring does;
//  - the generated tokens are still the direct greedy ones (the sampling row is the last row);
//  - requests that do not score never get more than one logit row per step (the fast path);
//  - max_tokens 0 computes the prompt (its logprobs) and finishes with reason length, no token;
//  - no page leaked (run_specs checks the allocator after every step and at the end).
// Also: several requests sharing one stream (Engine::add_request with first_index), as a server
// answers a batch of prompts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/expect_error.h"
#include "engine/harness.h"

namespace pagedattn::engine::testing {
namespace {

constexpr int32_t kVocab = 48;

// The reference for prompt token p + 1: float64 log-softmax of the fake row at position p.
TokenLogprob reference_entry(const std::vector<int32_t>& prompt, size_t p, int32_t top_n) {
  std::vector<float> logits(kVocab);
  reference_logits(std::span<const int32_t>(prompt).first(p + 1), logits);
  double max_logit = -INFINITY;
  for (const float v : logits) max_logit = std::max<double>(max_logit, v);
  double total = 0.0;
  for (const float v : logits) total += std::exp(double{v} - max_logit);
  const double log_total = max_logit + std::log(total);
  TokenLogprob entry;
  entry.token = prompt[p + 1];
  entry.logprob = static_cast<float>(logits[static_cast<size_t>(entry.token)] - log_total);
  std::vector<int32_t> order(kVocab);
  for (int32_t t = 0; t < kVocab; ++t) order[static_cast<size_t>(t)] = t;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  for (int32_t i = 0; i < top_n; ++i) {
    const int32_t t = order[static_cast<size_t>(i)];
    entry.top.emplace_back(t, static_cast<float>(logits[static_cast<size_t>(t)] - log_total));
  }
  return entry;
}

void expect_prompt_logprobs(const Spec& spec, const ChoiceOutcome& choice,
                            const std::string& what) {
  const size_t expected = spec.prompt.size() - 1;
  ASSERT_EQ(choice.prompt_logprobs.size(), expected) << what;
  if (expected > 0) {
    EXPECT_EQ(choice.num_prompt_logprob_events, 1) << what;
    EXPECT_TRUE(choice.prompt_logprobs_on_first_event) << what;
  }
  for (size_t p = 0; p < expected; ++p) {
    const TokenLogprob want = reference_entry(spec.prompt, p, *spec.params.prompt_logprobs);
    const TokenLogprob& got = choice.prompt_logprobs[p];
    EXPECT_EQ(got.token, want.token) << what << " position " << p;
    EXPECT_NEAR(got.logprob, want.logprob, 1e-5) << what << " position " << p;
    ASSERT_EQ(got.top.size(), want.top.size()) << what << " position " << p;
    for (size_t i = 0; i < want.top.size(); ++i) {
      EXPECT_EQ(got.top[i].first, want.top[i].first) << what << " position " << p << " top " << i;
      EXPECT_NEAR(got.top[i].second, want.top[i].second, 1e-5) << what << " position " << p;
    }
  }
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < length; ++i) prompt.push_back((salt * 7 + i * 5 + i * i) % kVocab);
  return prompt;
}

struct Configuration {
  int32_t page_size;
  int64_t budget;
  bool prefix_cache;
  int32_t num_pages;
  int64_t scoring_rows = 0;  // EngineConfig::max_scoring_rows
};

TEST(PromptLogprobs, EqualTheReferenceInEveryConfiguration) {
  // A shared 24-token prefix: a plain request caches it, the scoring ones must not hit it.
  const std::vector<int32_t> shared = prompt_of(24, 1);
  std::vector<int32_t> shared_long = shared;
  for (int32_t t : prompt_of(9, 2)) shared_long.push_back(t);
  std::vector<Spec> specs;
  const auto add = [&](std::vector<int32_t> prompt, std::optional<int32_t> scoring, int32_t n,
                       int32_t max_tokens, int64_t arrival) {
    Spec spec;
    spec.prompt = std::move(prompt);
    spec.params.temperature = 0.0;
    spec.params.ignore_eos = true;
    spec.params.n = n;
    spec.params.max_tokens = max_tokens;
    spec.params.prompt_logprobs = scoring;
    spec.arrival_step = arrival;
    specs.push_back(std::move(spec));
  };
  add(shared, std::nullopt, 1, 4, 0);  // caches the prefix
  add(shared_long, 3, 1, 1, 40);       // arrives after: the cache holds its prefix
  add(shared_long, std::nullopt, 1, 2, 40);
  add(prompt_of(37, 3), 0, 2, 5, 0);  // n = 2: the second choice shares the first one's pages
  add(prompt_of(19, 4), 5, 1, 0, 2);  // max_tokens 0: scoring only
  add(prompt_of(1, 5), 2, 1, 3, 3);   // nothing to score
  add(prompt_of(30, 6), 20, 3, 6, 5);

  const std::vector<Configuration> setups = {
      {1, 1, true, 0},     {4, 1, true, 0},     {4, 4, true, 0},      {16, 4, false, 0},
      {4, 16, true, 0},    {16, 16, true, 0},   {1, 0, false, 0},     {4, 0, true, 0},
      {16, 0, true, 0},    {4, 16, true, 12},   {1, 8, false, 44},    {4, 4, true, 13},
      {4, 16, true, 0, 3}, {16, 0, true, 0, 5}, {4, 16, true, 12, 2},
  };
  int64_t preemptions = 0;
  for (const Configuration& setup : setups) {
    const std::string label =
        fmt::format("page {} budget {} cache {} pages {} scoring rows {}", setup.page_size,
                    setup.budget, setup.prefix_cache, setup.num_pages, setup.scoring_rows);
    SCOPED_TRACE(label);
    EngineConfig config;
    config.page_size = setup.page_size;
    config.num_pages = setup.num_pages ? setup.num_pages : 4096 / setup.page_size;
    config.max_tokens_per_step = setup.budget;
    config.max_model_length = 128;
    config.prefix_cache = setup.prefix_cache;
    config.max_scoring_rows = setup.scoring_rows;
    const RunSummary run = run_specs(config, specs, kVocab);
    if (setup.scoring_rows > 0) EXPECT_LE(run.max_rows_per_sequence, setup.scoring_rows);
    preemptions += run.stats.num_preemptions;
    for (size_t r = 0; r < specs.size(); ++r) {
      const Spec& spec = specs[r];
      const int64_t max_tokens = *spec.params.max_tokens;
      const std::vector<int32_t> greedy = direct_greedy(spec, kVocab, {}, max_tokens);
      for (size_t c = 0; c < run.outcomes[r].size(); ++c) {
        const ChoiceOutcome& choice = run.outcomes[r][c];
        const std::string what = fmt::format("request {} choice {}", r, c);
        EXPECT_EQ(choice.num_finish_events, 1) << what;
        EXPECT_EQ(choice.reason, FinishReason::kLength) << what;
        EXPECT_EQ(choice.tokens, greedy) << what;
        if (spec.params.prompt_logprobs) {
          expect_prompt_logprobs(spec, choice, what);
          // The first choice takes no cache hit (the later ones share its computed pages).
          if (c == 0 && spec.prompt.size() > 1) EXPECT_EQ(choice.num_cached_tokens, 0) << what;
        } else {
          EXPECT_TRUE(choice.prompt_logprobs.empty()) << what;
        }
      }
    }
    // The plain request with the cached prefix did hit it (when the pool kept it).
    if (setup.prefix_cache && setup.num_pages == 0) {
      EXPECT_GT(run.outcomes[2][0].num_cached_tokens, 0);
    }
  }
  EXPECT_GT(preemptions, 0) << "the small pools never preempted: the test does not cover it";
}

TEST(PromptLogprobs, APromptPreemptedMidwayIsScoredOnceWhole) {
  // 10 pages of 4 tokens. A decodes (one token a step); B's 28-token prompt comes in chunks of 3
  // beside it until A and B together need more than 10 pages (about A 13 tokens + B 27): B, the
  // newest, is preempted with most of its prompt scored; it recomputes from the start once A is
  // done, with no cache hit although its full pages were cached.
  EngineConfig config;
  config.page_size = 4;
  config.num_pages = 10;
  config.max_tokens_per_step = 4;
  config.max_model_length = 64;
  std::vector<Spec> specs(2);
  specs[0].prompt = prompt_of(4, 30);
  specs[0].params.max_tokens = 30;
  specs[0].params.ignore_eos = true;
  specs[0].params.temperature = 0.0;
  specs[1].prompt = prompt_of(28, 31);
  specs[1].params.max_tokens = 2;
  specs[1].params.ignore_eos = true;
  specs[1].params.temperature = 0.0;
  specs[1].params.prompt_logprobs = 2;
  specs[1].arrival_step = 1;
  const RunSummary run = run_specs(config, specs, kVocab);
  EXPECT_GE(run.stats.num_preemptions, 1);
  const ChoiceOutcome& scored = run.outcomes[1][0];
  expect_prompt_logprobs(specs[1], scored, "preempted request");
  EXPECT_EQ(scored.num_cached_tokens, 0);
  EXPECT_EQ(scored.tokens, direct_greedy(specs[1], kVocab, {}, 2));
  EXPECT_EQ(run.outcomes[0][0].tokens, direct_greedy(specs[0], kVocab, {}, 30));
}

TEST(PromptLogprobs, RequestsThatDoNotScoreKeepOneRowPerSequence) {
  std::vector<Spec> specs;
  for (int32_t i = 0; i < 6; ++i) {
    Spec spec;
    spec.prompt = prompt_of(10 + 7 * i, i);
    spec.params.max_tokens = 4;
    spec.params.ignore_eos = true;
    spec.params.logprobs = 2;  // sampled-token logprobs do not need prompt rows
    spec.arrival_step = i;
    specs.push_back(std::move(spec));
  }
  EngineConfig config;
  config.page_size = 4;
  config.num_pages = 256;
  config.max_tokens_per_step = 8;
  config.max_model_length = 128;
  const RunSummary run = run_specs(config, specs, kVocab);
  EXPECT_EQ(run.max_rows_per_sequence, 1);
  // And a scoring request does make its chunks' rows (the counter sees it).
  specs[0].params.prompt_logprobs = 1;
  EXPECT_EQ(run_specs(config, specs, kVocab).max_rows_per_sequence, 8);
}

TEST(PromptLogprobs, MaxTokensZeroScoresThePromptAndSamplesNothing) {
  EngineConfig config;
  config.page_size = 4;
  config.num_pages = 64;
  config.max_tokens_per_step = 5;
  config.max_model_length = 64;
  std::vector<Spec> specs(2);
  specs[0].prompt = prompt_of(13, 9);
  specs[0].params.max_tokens = 0;
  specs[0].params.prompt_logprobs = 4;
  specs[0].params.n = 2;
  specs[1].prompt = prompt_of(6, 10);
  specs[1].params.max_tokens = 0;  // echo without scoring: the prompt runs, nothing else
  const RunSummary run = run_specs(config, specs, kVocab);
  for (size_t r = 0; r < specs.size(); ++r) {
    for (const ChoiceOutcome& choice : run.outcomes[r]) {
      EXPECT_TRUE(choice.tokens.empty());
      EXPECT_EQ(choice.text, "");
      EXPECT_EQ(choice.reason, FinishReason::kLength);
      EXPECT_EQ(choice.num_finish_events, 1);
    }
  }
  expect_prompt_logprobs(specs[0], run.outcomes[0][0], "choice 0");
  expect_prompt_logprobs(specs[0], run.outcomes[0][1], "choice 1");
  EXPECT_TRUE(run.outcomes[1][0].prompt_logprobs.empty());
  EXPECT_EQ(run.stats.num_generated_tokens, 0);
}

TEST(PromptLogprobs, RequestsShareOneStreamWithTheirIndexOffsets) {
  EngineConfig config;
  config.page_size = 4;
  config.num_pages = 64;
  config.max_tokens_per_step = 16;
  config.max_model_length = 64;
  FakeModel model(kVocab, config.num_pages, config.page_size);
  Engine engine(config, model);
  SamplingParams params;
  params.temperature = 0.0;
  params.ignore_eos = true;
  params.n = 2;
  params.max_tokens = 3;
  params.prompt_logprobs = 1;
  // Three prompts x n = 2 on one stream: choice j of prompt i is index i * 2 + j.
  auto stream = std::make_shared<RequestStream>(6);
  std::vector<Spec> specs(3);
  for (int32_t i = 0; i < 3; ++i) {
    specs[static_cast<size_t>(i)].prompt = prompt_of(5 + 4 * i, 20 + i);
    specs[static_cast<size_t>(i)].params = params;
    const Engine::Handle handle =
        engine.add_request(specs[static_cast<size_t>(i)].prompt, params, stream, i * 2);
    EXPECT_EQ(handle.stream, stream);
  }
  expect_error([&] { engine.add_request(prompt_of(3, 1), params, nullptr, 0); }, "no stream");
  expect_error([&] { engine.add_request(prompt_of(3, 1), params, stream, -1); }, "first_index -1");
  Outcome outcome(6);
  while (engine.has_work()) {
    engine.step();
    engine.check_consistency();
    collect(*stream, &outcome);
  }
  EXPECT_TRUE(stream->done());
  for (size_t index = 0; index < 6; ++index) {
    const Spec& spec = specs[index / 2];
    const std::string what = fmt::format("index {}", index);
    EXPECT_EQ(outcome[index].num_finish_events, 1) << what;
    EXPECT_EQ(outcome[index].tokens, direct_greedy(spec, kVocab, {}, 3)) << what;
    expect_prompt_logprobs(spec, outcome[index], what);
  }
  engine.clear_prefix_cache();
  EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages);
}

}  // namespace
}  // namespace pagedattn::engine::testing
