// Offline generation on top of Engine: submit a batch of prompts, step until every request has
// finished, return each choice's completion (what `pagedattn generate` and the offline
// throughput benchmark need). on_event sees every event as it arrives (for streaming to a
// terminal). Runs on the calling thread, which is then the engine thread.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::engine {

struct Completion {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;
  std::optional<int32_t> stop_token;
  std::string error;
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;
};

using EventCallback = std::function<void(size_t request, const RequestEvent& event)>;

// completions[request][choice]. Parameters are validated first (Error names the request).
std::vector<std::vector<Completion>> generate(Engine& engine,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              const SamplingParams& params,
                                              const EventCallback& on_event = {});

}  // namespace pagedattn::engine
