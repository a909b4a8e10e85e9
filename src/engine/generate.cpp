// Offline generation (see engine_generate.h): add every request, step until the engine is idle,
// fold each stream's events into completions.
#include "core/check.h"
#include "pagedattn/engine_generate.h"

namespace pagedattn::engine {

namespace {

void fold(const RequestEvent& event, Completion* completion) {
  if (completion->tokens.empty() && !event.token_ids.empty()) {
    completion->num_prompt_tokens = event.num_prompt_tokens;
    completion->num_cached_tokens = event.num_cached_tokens;
  }
  completion->tokens.insert(completion->tokens.end(), event.token_ids.begin(),
                            event.token_ids.end());
  completion->logprobs.insert(completion->logprobs.end(), event.logprobs.begin(),
                              event.logprobs.end());
  completion->text += event.text;
  if (event.finished()) {
    completion->finish_reason = event.finish_reason;
    completion->stop_string = event.stop_string;
    completion->stop_token = event.stop_token;
    completion->error = event.error;
  }
}

}  // namespace

std::vector<std::vector<Completion>> generate(Engine& engine,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              const SamplingParams& params,
                                              const EventCallback& on_event) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    try {
      validate(params, static_cast<int64_t>(prompts[i].size()), engine.limits());
    } catch (const Error& error) {
      PA_FAIL("request {}: {}", i, error.what());
    }
  }
  std::vector<Engine::Handle> handles;
  handles.reserve(prompts.size());
  for (const auto& prompt : prompts) handles.push_back(engine.add_request(prompt, params));
  std::vector<std::vector<Completion>> completions(
      prompts.size(), std::vector<Completion>(static_cast<size_t>(params.n)));
  auto drain = [&] {
    for (size_t i = 0; i < handles.size(); ++i) {
      while (auto event = handles[i].stream->try_pop()) {
        if (on_event) on_event(i, *event);
        fold(*event, &completions[i][static_cast<size_t>(event->index)]);
      }
    }
  };
  while (engine.has_work()) {
    engine.step();
    drain();
  }
  drain();
  return completions;
}

}  // namespace pagedattn::engine
