// OpenAI response bodies: the non-streaming chat.completion / text_completion objects and the
// streaming chunks (chat.completion.chunk with a delta; text_completion pieces), logprobs in
// each endpoint's shape, and usage. Strings go through JSON with invalid UTF-8 replaced by
// U+FFFD (a token's bytes need not be valid UTF-8). Internal to the server layer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pagedattn/engine_request.h"
#include "pagedattn/server_protocol.h"

namespace pagedattn::server::detail {

using Json = nlohmann::json;

struct ResponseHead {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

// One choice's output so far (non-streaming) or of one event (streaming).
struct ChoiceOutput {
  int32_t index = 0;
  std::string text;
  std::vector<engine::TokenLogprob> logprobs;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
};

std::string dump(const nlohmann::json& value);
const char* finish_reason_name(engine::FinishReason reason);  // null for kNone

// The full non-streaming body.
std::string completion_body(const ResponseHead& head, const std::vector<ChoiceOutput>& choices,
                            bool logprobs, const Usage& usage, const TextFront& front);

// One SSE event line "data: {...}\n\n". first: the chat delta carries the role.
std::string chunk_event(const ResponseHead& head, const ChoiceOutput& choice, bool first,
                        bool logprobs, bool include_usage, const TextFront& front);
// The usage chunk (choices: []) sent last when stream_options.include_usage.
std::string usage_event(const ResponseHead& head, const Usage& usage);
// An error inside a stream: "data: {"error": ...}\n\n".
std::string error_event(const ApiError& error);
inline constexpr const char* kDoneEvent = "data: [DONE]\n\n";

}  // namespace pagedattn::server::detail
