// The OpenAI request side of the server, without any HTTP: what a text front must provide
// (tokenize, render a chat, spell a token), the parsed and validated request, and the errors in
// OpenAI's shape. Everything here is pure functions over a body string, so the parser can be
// fuzzed in-process and the server's HTTP threads only call prepare_request().
//
// Validation order (the first failure is the answer): JSON syntax (and UTF-8, which the JSON
// parser checks) -> top-level object -> unknown fields (OpenAI rejects an unrecognized argument
// with 400; the extensions vLLM accepts are known here) -> each field's type and range -> the
// model name (404) -> tools, tool_choice, messages / prompt -> tokenization -> context length ->
// the engine's own validate(). Every ApiError names the parameter in `param` and says what was
// expected (an element of a batch by its index: `prompt[3]`). A batch is refused whole when any
// prompt is bad, before anything is queued.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pagedattn/engine_request.h"
#include "pagedattn/engine_stop.h"
#include "pagedattn/server_tool_calls.h"

namespace pagedattn::server {

// A call an assistant message made, as the client sends it back in the conversation.
struct ChatToolCall {
  std::string id;  // may be empty
  std::string name;
  std::string arguments;  // a JSON object as text (OpenAI's `function.arguments`)
};

struct ChatMessage {
  std::string role;     // system | developer | user | assistant | tool
  std::string content;  // text parts joined
  // content was null or absent (allowed for an assistant message with tool_calls).
  bool content_null = false;
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call it answers (may be empty)
  std::string name;                      // optional participant name
};

// What the server needs of a tokenizer and its chat template. The engine is built with the
// detokenizer of the same tokenizer; the server never detokenizes itself except single tokens
// for logprobs. Methods may throw pagedattn::Error (answered as 400 naming the input).
class TextFront {
 public:
  virtual ~TextFront() = default;
  // Token ids of `text` (special tokens spelled in the text are recognized, as a chat template's
  // output needs).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The model's chat template applied to `messages`, with the generation prompt appended.
  // `tools`: the request's tool list in OpenAI's shape ([{"type": "function", "function":
  // {name, description, parameters}}], validated), or null, passed to the template as
  // apply_chat_template's `tools`.
  virtual std::string render_chat(std::span<const ChatMessage> messages,
                                  const nlohmann::ordered_json& tools) const = 0;
  // The raw bytes of one token as it stands in a text (not necessarily valid UTF-8: a token
  // that is part of a multi-byte character gives those bytes), for logprobs' `bytes`; the
  // server spells `token` from them. Empty for an id the front does not know.
  virtual std::string token_bytes(int32_t token) const = 0;
};

enum class Endpoint { kChat, kCompletions };

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// {"error": {"message", "type", "param", "code"}} as OpenAI sends it.
std::string error_body(const ApiError& error);

struct PreparedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  // Token ids, one list per prompt: chat has one; a completions request one per prompt of its
  // batch, in order (each is its own engine request; choice j of prompt i is index i * n + j).
  std::vector<std::vector<int32_t>> prompts;
  // Completions echo: each answer starts with its prompt (the text, and with logprobs the prompt
  // tokens' entries: params.prompt_logprobs = logprobs). prompt_texts[i] is prompt i's text: a
  // string prompt as given, a token-id prompt its tokens' bytes (TextFront::token_bytes).
  bool echo = false;
  std::vector<std::string> prompt_texts;
  engine::SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat: logprobs true (top_logprobs in params.logprobs); completions: logprobs = k.
  bool logprobs = false;
  // vLLM's prompt_logprobs = n: the answer carries "prompt_logprobs", null for the first prompt
  // token then one {token id: {logprob, rank, decoded_token}} per token (the token and the top
  // n): on each completions choice, at the top of a chat completion; in a stream, on the first
  // chunk of each choice (completions) or of the answer (chat).
  std::optional<int32_t> prompt_logprobs;
  // Chat with tools and tool_choice "auto": the output is parsed into tool calls in this format
  // (kNone: not parsed). parallel_tool_calls false keeps the first call only.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  bool parallel_tool_calls = true;
};

struct ParseContext {
  std::string model_name;  // the one model served
  engine::ModelLimits limits;
  const TextFront* front = nullptr;
  // How the served model writes tool calls (ServerConfig::tool_call_format); kNone: a request
  // with tools and tool_choice "auto" is refused (400), as vLLM does without a parser.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
};

// Parses and validates a request body; never throws (any failure is an ApiError).
std::variant<PreparedRequest, ApiError> prepare_request(std::string_view body, Endpoint endpoint,
                                                        const ParseContext& context);

// Nesting deeper than this is refused (400) while parsing, before any tree is built.
inline constexpr int kMaxJsonDepth = 64;
// A completions request's batch: at most this many prompts, and prompts x n choices.
inline constexpr size_t kMaxPrompts = 256;
inline constexpr int64_t kMaxBatchChoices = 1024;

}  // namespace pagedattn::server
