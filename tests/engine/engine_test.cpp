// Engine unit tests with the paged fake model: abort (waiting and running; pages back at the
// next step), add/abort from other threads while one thread steps, n > 1 choices sharing the
// prompt's pages, clear errors (invalid parameters throw; a prompt the pool can never hold and a
// request that outgrows the pool finish with a reason), a failing forward, prefix-cache hits in
// the events and stats, logprobs in the events.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "engine/expect_error.h"
#include "engine/harness.h"
#include "pagedattn/engine_generate.h"

namespace pagedattn::engine::testing {
namespace {

constexpr int32_t kVocab = 32;

EngineConfig small_config(int32_t num_pages = 64, int32_t page_size = 4) {
  EngineConfig config;
  config.num_pages = num_pages;
  config.page_size = page_size;
  config.max_tokens_per_step = 16;
  config.max_model_length = 128;
  return config;
}

std::vector<int32_t> prompt_of(int32_t length, int32_t first = 1) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < length; ++i) prompt.push_back((first + i) % (kVocab - 1));
  return prompt;
}

Outcome drain(Engine& engine, const Engine::Handle& handle, int32_t n = 1) {
  Outcome outcome(static_cast<size_t>(n));
  while (engine.has_work()) {
    engine.step();
    engine.check_consistency();
    collect(*handle.stream, &outcome);
  }
  collect(*handle.stream, &outcome);
  return outcome;
}

TEST(Engine, AbortFreesPagesAtTheNextStep) {
  FakeModel model(kVocab, 64, 4);
  Engine engine(small_config(), model);
  SamplingParams params;
  params.max_tokens = 50;
  params.ignore_eos = true;
  const auto running = engine.add_request(prompt_of(10), params);
  const auto waiting = engine.add_request(prompt_of(10, 3), params);
  engine.step();  // budget 16: the first prompt and part of the second
  engine.step();
  EXPECT_GT(engine.allocator().num_used_pages(), 0);
  engine.abort(running.id);
  engine.abort(waiting.id);
  engine.abort(12345);  // unknown: ignored
  EXPECT_TRUE(engine.has_work());
  engine.step();
  EXPECT_FALSE(engine.has_work());
  engine.clear_prefix_cache();
  EXPECT_EQ(engine.allocator().num_free_pages(), 64);
  for (const auto* handle : {&running, &waiting}) {
    Outcome outcome(1);
    collect(*handle->stream, &outcome);
    EXPECT_EQ(outcome[0].reason, FinishReason::kAbort);
    EXPECT_EQ(outcome[0].num_finish_events, 1);
    EXPECT_TRUE(handle->stream->done());
  }
}

TEST(Engine, ThreadsAddAndAbortWhileOneThreadSteps) {
  EngineConfig config = small_config(24, 4);  // small: preemption under load
  FakeModel model(kVocab, config.num_pages, config.page_size);
  Engine engine(config, model);
  std::atomic<bool> stop{false};
  std::thread stepper([&] {
    while (!stop.load()) {
      if (!engine.step()) engine.wait_for_work(std::chrono::milliseconds(5));
    }
  });
  std::atomic<int> completed{0}, aborted{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        SamplingParams params;
        const int32_t prompt_length = 3 + (i * 5 + t) % 30;
        const bool cancel = (i + t) % 4 == 0;
        // A cancelled request asks for all the model length allows, so the abort lands first.
        params.max_tokens = cancel ? 60 : 5 + (i * 7 + t) % 20;  // the pool holds 96 tokens
        params.ignore_eos = true;
        params.temperature = 0.0;
        const auto handle = engine.add_request(prompt_of(prompt_length, t + i), params);
        if (cancel && i % 2 == 0) engine.abort(handle.id);  // before it even starts
        int tokens = 0;
        while (true) {
          auto event = handle.stream->pop(std::chrono::milliseconds(1000));
          ASSERT_TRUE(event.has_value()) << "a stream went quiet";
          tokens += static_cast<int>(event->token_ids.size());
          if (cancel && tokens >= 2) engine.abort(handle.id);
          if (event->finished()) {
            if (event->finish_reason == FinishReason::kAbort) {
              ++aborted;
            } else {
              EXPECT_EQ(event->finish_reason, FinishReason::kLength);
              EXPECT_EQ(tokens, *params.max_tokens);
              ++completed;
            }
            break;
          }
        }
        EXPECT_TRUE(handle.stream->done());
      }
    });
  }
  for (auto& client : clients) client.join();
  stop = true;
  stepper.join();
  EXPECT_EQ(completed + aborted, 100);
  EXPECT_GT(aborted.load(), 0);
  EXPECT_FALSE(engine.has_work());
  engine.check_consistency();
  engine.clear_prefix_cache();
  EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages);
}

TEST(Engine, ChoicesShareThePromptPages) {
  FakeModel model(kVocab, 64, 4);
  EngineConfig config = small_config();
  config.prefix_cache = false;  // sharing comes from n, not the cache
  config.max_tokens_per_step = 0;
  Engine engine(config, model);
  model.watch(&engine.allocator());
  SamplingParams params;
  params.n = 3;
  params.max_tokens = 6;
  params.ignore_eos = true;
  params.seed = 5;
  const auto handle = engine.add_request(prompt_of(21), params);
  engine.step();  // the first choice's prompt
  engine.step();  // the others join with 5 shared pages (20 tokens) each
  const auto stats = engine.stats();
  // 21 + 2 x 1 prompt tokens computed + the first choice's decode: pages were shared.
  EXPECT_EQ(stats.num_computed_tokens, 21 + 1 + 2 * 1);
  Outcome outcome = drain(engine, handle, 3);
  for (const auto& choice : outcome) {
    EXPECT_EQ(choice.tokens.size(), 6u);
    EXPECT_EQ(choice.reason, FinishReason::kLength);
  }
  EXPECT_EQ(outcome[1].num_cached_tokens, 20);
  EXPECT_NE(outcome[0].tokens, outcome[1].tokens);  // seeded choices draw different numbers
  EXPECT_EQ(engine.allocator().num_free_pages(), 64);
}

TEST(Engine, InvalidRequestsThrowAndUnservableOnesFinishWithAReason) {
  FakeModel model(kVocab, 4, 4);  // 16 token slots
  EngineConfig config = small_config(4, 4);
  config.max_model_length = 40;
  Engine engine(config, model);
  SamplingParams params;
  params.top_p = 0.0;
  expect_error([&] { engine.add_request(prompt_of(3), params); }, "top_p: 0");
  expect_error([&] { engine.add_request({1, 99}, {}); }, "prompt: token 99 is outside");
  SamplingParams stops;
  stops.stop = {"x"};
  expect_error([&] { engine.add_request(prompt_of(3), stops); }, "need a detokenizer");
  expect_error([&] { engine.add_request(prompt_of(40), {}); }, "model length is 40");
  EXPECT_FALSE(engine.has_work());

  const auto too_long = engine.add_request(prompt_of(17), {});
  Outcome outcome = drain(engine, too_long);
  EXPECT_EQ(outcome[0].reason, FinishReason::kError);
  SamplingParams grows;
  grows.ignore_eos = true;
  grows.temperature = 0.0;
  const auto outgrows = engine.add_request(prompt_of(10), grows);
  outcome = drain(engine, outgrows);
  EXPECT_EQ(outcome[0].reason, FinishReason::kLength);
  // 16 slots hold the KV of 10 + 6 tokens, enough to sample a 7th output token.
  EXPECT_EQ(outcome[0].tokens.size(), 7u);
  EXPECT_EQ(engine.allocator().num_free_pages() + engine.stats().num_cached_pages, 4);
}

TEST(Engine, ErrorEventsCarryTheMessage) {
  FakeModel model(kVocab, 4, 4);
  Engine engine(small_config(4, 4), model);
  const auto handle = engine.add_request(prompt_of(20), {});
  engine.step();
  const auto event = handle.stream->try_pop();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->finish_reason, FinishReason::kError);
  EXPECT_NE(event->error.find("prompt: 20 tokens need 5 KV pages of 4 tokens; the pool has 4"),
            std::string::npos)
      << event->error;
}

class ThrowingModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  void forward(const StepPlan& plan, std::span<float> logits) override {
    if (fail_next) {
      fail_next = false;
      throw Error("device lost");
    }
    FakeModel::forward(plan, logits);
  }
  bool fail_next = false;
};

TEST(Engine, FailedForwardFinishesTheStepsRequestsAndKeepsServing) {
  ThrowingModel model(kVocab, 64, 4);
  Engine engine(small_config(), model);
  SamplingParams params;
  params.max_tokens = 3;
  const auto first = engine.add_request(prompt_of(5), params);
  model.fail_next = true;
  engine.step();
  Outcome outcome(1);
  collect(*first.stream, &outcome);
  EXPECT_EQ(outcome[0].reason, FinishReason::kError);
  const auto second = engine.add_request(prompt_of(5), params);
  outcome = drain(engine, second);
  EXPECT_EQ(outcome[0].tokens.size(), 3u);
  engine.clear_prefix_cache();
  EXPECT_EQ(engine.allocator().num_free_pages(), 64);
}

TEST(Engine, PrefixHitsAndLogprobsReachTheEvents) {
  FakeModel model(kVocab, 64, 4);
  Engine engine(small_config(), model);
  SamplingParams params;
  params.max_tokens = 2;
  params.logprobs = 3;
  params.temperature = 0.0;
  const auto first = engine.add_request(prompt_of(18), params);
  const Outcome a = drain(engine, first);
  const auto second = engine.add_request(prompt_of(18), params);
  Outcome b(1);
  std::vector<TokenLogprob> logprobs;
  while (engine.has_work()) {
    engine.step();
    while (auto event = second.stream->try_pop()) {
      if (b[0].tokens.empty() && !event->token_ids.empty()) {
        b[0].num_cached_tokens = event->num_cached_tokens;
        EXPECT_EQ(event->num_prompt_tokens, 18);
      }
      b[0].tokens.insert(b[0].tokens.end(), event->token_ids.begin(), event->token_ids.end());
      logprobs.insert(logprobs.end(), event->logprobs.begin(), event->logprobs.end());
    }
  }
  EXPECT_EQ(a[0].num_cached_tokens, 0);
  EXPECT_EQ(b[0].num_cached_tokens, 16);
  EXPECT_EQ(b[0].tokens, a[0].tokens);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 16);
  ASSERT_EQ(logprobs.size(), 2u);
  std::vector<int32_t> context = prompt_of(18);
  for (size_t i = 0; i < 2; ++i) {
    std::vector<float> logits(kVocab);
    reference_logits(context, logits);
    double max = -1e300, total = 0;
    for (float x : logits) max = std::max<double>(max, x);
    for (float x : logits) total += std::exp(x - max);
    const int32_t token = b[0].tokens[i];
    EXPECT_EQ(logprobs[i].token, token);
    EXPECT_NEAR(logprobs[i].logprob, logits[size_t(token)] - max - std::log(total), 1e-5);
    ASSERT_EQ(logprobs[i].top.size(), 3u);
    EXPECT_EQ(logprobs[i].top[0].first, token);  // greedy: the top token
    context.push_back(token);
  }
}

}  // namespace
}  // namespace pagedattn::engine::testing

namespace pagedattn::engine::testing {
namespace {

TEST(Generate, BatchEqualsDirectGreedyAndStreamsEvents) {
  FakeModel model(kVocab, 64, 4);
  Engine engine(small_config(), model, fake_detokenizer());
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 9;
  params.ignore_eos = true;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(5), prompt_of(30, 2),
                                                     prompt_of(1, 9)};
  size_t events = 0;
  const auto completions =
      generate(engine, prompts, params, [&](size_t, const RequestEvent&) { ++events; });
  ASSERT_EQ(completions.size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Spec spec;
    spec.prompt = prompts[i];
    spec.params = params;
    const Completion& completion = completions[i][0];
    EXPECT_EQ(completion.tokens, direct_greedy(spec, kVocab, {}, 9));
    EXPECT_EQ(completion.finish_reason, FinishReason::kLength);
    std::string text;
    for (const int32_t token : completion.tokens) text += token_text(token);
    EXPECT_EQ(completion.text, text);
    EXPECT_EQ(completion.num_prompt_tokens, static_cast<int64_t>(prompts[i].size()));
  }
  EXPECT_GE(events, 3u * 9u / 2u);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.num_finished, 3);
  EXPECT_EQ(stats.num_generated_tokens, 27);
  EXPECT_GT(stats.forward_seconds, 0.0);
  params.top_p = 2.0;
  expect_error([&] { generate(engine, prompts, params); }, "request 0: top_p: 2");
}

}  // namespace
}  // namespace pagedattn::engine::testing
