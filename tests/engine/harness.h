// A driver for engine property tests: request specs with arrival and abort steps, an engine run
// that collects every stream and checks the invariants after every step, and the references a
// run is compared with (the same request alone in a plain engine; a direct greedy loop over the
// fake model with no engine at all; the stop-string rule applied to the full text).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/fake_model.h"
#include "pagedattn/engine.h"

namespace pagedattn::engine::testing {

struct Spec {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int64_t arrival_step = 0;
  int64_t abort_step = -1;  // -1: never
};

struct ChoiceOutcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  std::string stop_string;
  std::optional<int32_t> stop_token;
  int32_t num_finish_events = 0;
  bool event_after_finish = false;
  int64_t num_cached_tokens = 0;
  std::vector<TokenLogprob> prompt_logprobs;  // as the events carried them
  int32_t num_prompt_logprob_events = 0;      // events that carried some
  bool prompt_logprobs_on_first_event = false;
  int32_t num_events = 0;
};

using Outcome = std::vector<ChoiceOutcome>;  // by choice index

struct RunSummary {
  std::vector<Outcome> outcomes;  // by spec
  EngineStats stats;
  int64_t max_step_tokens = 0;
  int32_t max_rows_per_sequence = 0;  // the most logit rows one sequence had in one step
  int64_t num_overlapped_steps = 0;   // steps the fake ran through launch / collect
  int64_t num_pending_resolved = 0;   // input tokens that were pending at launch
  int32_t max_in_flight = 0;          // the most steps launched and not collected at once
};

inline void collect(RequestStream& stream, Outcome* outcome) {
  while (auto event = stream.try_pop()) {
    ChoiceOutcome& choice = outcome->at(static_cast<size_t>(event->index));
    if (choice.num_finish_events > 0) choice.event_after_finish = true;
    if (!event->prompt_logprobs.empty()) {
      if (choice.num_events == 0) choice.prompt_logprobs_on_first_event = true;
      ++choice.num_prompt_logprob_events;
      choice.prompt_logprobs.insert(choice.prompt_logprobs.end(), event->prompt_logprobs.begin(),
                                    event->prompt_logprobs.end());
    }
    ++choice.num_events;
    if (choice.tokens.empty() && !event->token_ids.empty()) {
      choice.num_cached_tokens = event->num_cached_tokens;
    }
    choice.tokens.insert(choice.tokens.end(), event->token_ids.begin(), event->token_ids.end());
    choice.text += event->text;
    if (event->finished()) {
      ++choice.num_finish_events;
      choice.reason = event->finish_reason;
      choice.stop_string = event->stop_string;
      choice.stop_token = event->stop_token;
    }
  }
}

// Runs `specs` through an engine made from `config`, stepping until everything has finished.
// After every step (every 8th on large pools): the engine's consistency check (allocator,
// cache, sequences). At the end:
// no request left, every page free or held by the prefix cache, and all free after clearing it.
inline RunSummary run_specs(const EngineConfig& config, const std::vector<Spec>& specs,
                            int32_t vocab, bool with_detokenizer = true) {
  FakeModel model(vocab, config.num_pages, config.page_size);
  if (config.overlap.value_or(false)) model.enable_overlap();
  Engine engine(config, model, with_detokenizer ? fake_detokenizer() : DetokenizerFactory{});
  model.watch(&engine.allocator());
  const int32_t start_free = engine.allocator().num_free_pages();
  RunSummary summary;
  summary.outcomes.resize(specs.size());
  std::vector<Engine::Handle> handles(specs.size());
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return specs[a].arrival_step < specs[b].arrival_step;
  });
  size_t next = 0;
  int64_t step = 0;
  const int64_t step_limit = 2'000'000;
  while (next < order.size() || engine.has_work()) {
    while (next < order.size() && specs[order[next]].arrival_step <= step) {
      const size_t i = order[next++];
      summary.outcomes[i].resize(static_cast<size_t>(specs[i].params.n));
      handles[i] = engine.add_request(specs[i].prompt, specs[i].params);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].abort_step == step && handles[i].stream) engine.abort(handles[i].id);
    }
    engine.step();
    // O(pool) checks: every step on pools of up to 512 pages, every 8th on larger ones.
    if (config.num_pages <= 512 || step % 8 == 0) engine.check_consistency();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (handles[i].stream) collect(*handles[i].stream, &summary.outcomes[i]);
    }
    if (++step > step_limit) {
      ADD_FAILURE() << "the engine did not finish within " << step_limit << " steps";
      break;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(handles[i].stream && handles[i].stream->done()) << "request " << i << " lost";
  }
  summary.stats = engine.stats();
  summary.max_step_tokens = model.max_step_tokens();
  summary.max_rows_per_sequence = model.max_rows_per_sequence();
  summary.num_overlapped_steps = model.num_overlapped_steps();
  summary.num_pending_resolved = model.num_pending_resolved();
  summary.max_in_flight = model.max_in_flight();
  const int32_t cached = summary.stats.num_cached_pages;
  EXPECT_EQ(engine.allocator().num_free_pages() + cached, start_free) << "leaked pages";
  engine.clear_prefix_cache();
  EXPECT_EQ(engine.allocator().num_free_pages(), start_free) << "pages not returned";
  engine.check_consistency();
  return summary;
}

// The greedy tokens of `spec` computed with no engine: argmax of the fake model's logits over
// the growing token list, stopping at a stop token, EOS (unless ignored) or max_tokens.
inline std::vector<int32_t> direct_greedy(const Spec& spec, int32_t vocab,
                                          const std::vector<int32_t>& eos, int64_t max_tokens) {
  std::vector<int32_t> tokens = spec.prompt;
  std::vector<int32_t> output;
  std::vector<float> logits(static_cast<size_t>(vocab));
  while (static_cast<int64_t>(output.size()) < max_tokens) {
    reference_logits(tokens, logits);
    const int32_t token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens.push_back(token);
    output.push_back(token);
    const auto& stops = spec.params.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) break;
    if (!spec.params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) break;
  }
  return output;
}

// The text rule, from the tokens alone: the full text of the output (a final stop / EOS token
// contributes none) cut before the first stop string, if any.
inline void expect_text_rule(const Spec& spec, const ChoiceOutcome& choice) {
  std::string full;
  size_t count = choice.tokens.size();
  if (choice.stop_token) --count;
  for (size_t i = 0; i < count; ++i) full += token_text(choice.tokens[i]);
  size_t first = std::string::npos;
  std::string first_stop;
  for (const std::string& stop : spec.params.stop) {
    const size_t at = full.find(stop);
    if (at != std::string::npos && (at < first || first == std::string::npos)) {
      first = at;
      first_stop = stop;
    }
  }
  if (choice.reason == FinishReason::kAbort) {
    EXPECT_EQ(full.compare(0, choice.text.size(), choice.text), 0) << "aborted text not a prefix";
    return;
  }
  if (!choice.stop_string.empty()) {
    ASSERT_NE(first, std::string::npos) << "stop string reported but not in the text";
    EXPECT_EQ(choice.text, full.substr(0, first));
    EXPECT_EQ(full.compare(first, choice.stop_string.size(), choice.stop_string), 0);
  } else {
    EXPECT_EQ(first, std::string::npos) << "a stop string in the text was missed: " << full;
    EXPECT_EQ(choice.text, full);
  }
}

}  // namespace pagedattn::engine::testing
