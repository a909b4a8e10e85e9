// OpenAI response bodies: the non-streaming chat.completion / text_completion objects and the
// streaming chunks (chat.completion.chunk with a delta; text_completion pieces), logprobs in
// each endpoint's shape, and usage. Strings go through JSON with invalid UTF-8 replaced by
// U+FFFD (a token's bytes need not be valid UTF-8). Internal to the server layer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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

// A tool call as the response carries it.
struct ToolCallOutput {
  std::string id;  // call_...
  std::string name;
  std::string arguments;  // a JSON object as text
};

// One choice's output so far (non-streaming) or of one event (streaming).
struct ChoiceOutput {
  int32_t index = 0;
  std::string text;
  std::vector<engine::TokenLogprob> logprobs;
  // Completions echo: logprobs[0] is the prompt's first token, which has no logprob (nothing
  // before it): token_logprobs[0] and top_logprobs[0] are null, as OpenAI and vLLM send them.
  bool first_logprob_null = false;
  // PreparedRequest::prompt_logprobs: the prompt's entries from its second token (the engine's
  // RequestEvent::prompt_logprobs), the alternatives kept to prompt_top of them; sent when
  // has_prompt_logprobs.
  bool has_prompt_logprobs = false;
  int32_t prompt_top = 0;
  std::vector<engine::TokenLogprob> prompt_logprobs;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  // Chat whose output was parsed for tool calls: the message's content is null when empty, and
  // a choice that called tools and stopped finishes with "tool_calls".
  bool parsed_tools = false;
  bool called_tools = false;
  std::vector<ToolCallOutput> tool_calls;  // non-streaming: every call of the choice
};

std::string dump(const nlohmann::json& value);
const char* finish_reason_name(engine::FinishReason reason);  // null for kNone

// A token's string in logprobs: its bytes when they are valid UTF-8; otherwise (a token holding
// part of a multi-byte character) OpenAI's spelling for such a token, "bytes:" then every byte
// as \xNN except printable ASCII, which stands for itself (b" \xf0\x9f" -> "bytes: \xf0\x9f").
// vLLM sends U+FFFD instead, which loses the bytes; `bytes` carries them either way.
std::string token_string(std::string_view bytes);

// The completions endpoint's text_offset: where each token starts in the choice's text, in
// characters (code points, as a client indexes a string), continued from one streamed chunk to
// the next. A token that begins inside a character (its first byte continues one) starts at
// that character.
class TextOffset {
 public:
  // The offset of a token with these bytes, then moves past them.
  int64_t next(std::string_view bytes);

 private:
  int64_t characters_ = 0;  // characters begun so far
};

// The full non-streaming body.
std::string completion_body(const ResponseHead& head, const std::vector<ChoiceOutput>& choices,
                            bool logprobs, const Usage& usage, const TextFront& front);

// One SSE event line "data: {...}\n\n". first: the chat delta carries the role. `offset`: the
// choice's text offset so far (completions logprobs).
std::string chunk_event(const ResponseHead& head, const ChoiceOutput& choice, bool first,
                        bool logprobs, bool include_usage, const TextFront& front,
                        TextOffset& offset);
// The chat chunks of one tool call, as OpenAI streams one: the first delta carries index, id,
// type and function.name with empty arguments, the next appends function.arguments.
std::string tool_call_events(const ResponseHead& head, int32_t choice_index, int32_t call_index,
                             const ToolCallOutput& call, bool include_usage);
// The usage chunk (choices: []) sent last when stream_options.include_usage.
std::string usage_event(const ResponseHead& head, const Usage& usage);
// An error inside a stream: "data: {"error": ...}\n\n".
std::string error_event(const ApiError& error);
inline constexpr const char* kDoneEvent = "data: [DONE]\n\n";

}  // namespace pagedattn::server::detail
