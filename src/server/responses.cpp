// Response bodies and SSE chunks (responses.h), field by field as OpenAI's API reference gives
// them. Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}; completion
// logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset} (with echo, the
// prompt's tokens first, the first one's logprob and top_logprobs null; each top_logprobs holds
// the token itself besides the top n, as OpenAI's do). `bytes`
// are the token's raw bytes (TextFront::token_bytes); `token` is spelled by token_string().
// vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}, ...}, ...].
#include "responses.h"

#include <fmt/format.h>

#include "tokenizer/unicode.h"

namespace pagedattn::server::detail {

using Json = nlohmann::json;

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

const char* finish_reason_name(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kAbort:
      return "abort";
    case engine::FinishReason::kError:
      return "error";
    case engine::FinishReason::kNone:
      break;
  }
  return nullptr;
}

std::string token_string(std::string_view bytes) {
  // Well-formed UTF-8 (shortest forms, no surrogates, at most U+10FFFF), as JSON strings need.
  if (tokenizer::is_valid_utf8(bytes)) return std::string(bytes);
  std::string text = "bytes:";
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && byte != '\\') {
      text += c;
    } else {
      text += fmt::format("\\x{:02x}", byte);
    }
  }
  return text;
}

int64_t TextOffset::next(std::string_view bytes) {
  const auto continues = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; };
  const int64_t offset =
      !bytes.empty() && continues(bytes[0]) && characters_ > 0 ? characters_ - 1 : characters_;
  for (const char c : bytes) characters_ += continues(c) ? 0 : 1;
  return offset;
}

namespace {

Json bytes_array(const std::string& bytes) {
  Json array = Json::array();
  for (const char c : bytes) array.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return array;
}

Json chat_logprobs(const std::vector<engine::TokenLogprob>& logprobs, const TextFront& front) {
  Json content = Json::array();
  for (const engine::TokenLogprob& entry : logprobs) {
    const std::string bytes = front.token_bytes(entry.token);
    Json item = {
        {"token", token_string(bytes)}, {"logprob", entry.logprob}, {"bytes", bytes_array(bytes)}};
    Json top = Json::array();
    for (const auto& [token, logprob] : entry.top) {
      const std::string top_bytes = front.token_bytes(token);
      top.push_back({{"token", token_string(top_bytes)},
                     {"logprob", logprob},
                     {"bytes", bytes_array(top_bytes)}});
    }
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}};
}

// vLLM's prompt_logprobs: null for the prompt's first token, then per token an object keyed by
// token id (as a string) holding the token itself and its top alternatives, each
// {logprob, rank, decoded_token}.
Json vllm_prompt_logprobs(const ChoiceOutput& choice, const TextFront& front) {
  Json list = Json::array({nullptr});
  for (const engine::TokenLogprob& entry : choice.prompt_logprobs) {
    Json item = Json::object();
    const auto add = [&](int32_t token, float logprob, int32_t rank) {
      item[std::to_string(token)] = {{"logprob", logprob},
                                     {"rank", rank},
                                     {"decoded_token", token_string(front.token_bytes(token))}};
    };
    const size_t top = std::min(entry.top.size(), static_cast<size_t>(choice.prompt_top));
    for (size_t i = 0; i < top; ++i) {
      add(entry.top[i].first, entry.top[i].second, static_cast<int32_t>(i) + 1);
    }
    add(entry.token, entry.logprob, entry.rank);
    list.push_back(std::move(item));
  }
  return list;
}

Json completion_logprobs(const std::vector<engine::TokenLogprob>& logprobs, bool first_null,
                         const TextFront& front, TextOffset& text_offset) {
  Json tokens = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json offsets = Json::array();
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const engine::TokenLogprob& entry = logprobs[i];
    const std::string bytes = front.token_bytes(entry.token);
    tokens.push_back(token_string(bytes));
    offsets.push_back(text_offset.next(bytes));
    if (i == 0 && first_null) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(entry.logprob);
    Json top = Json::object();
    for (const auto& [token, logprob] : entry.top) {
      top[token_string(front.token_bytes(token))] = logprob;
    }
    // As OpenAI's legacy completions (and vLLM) send it: the token itself is always among its
    // alternatives, so there may be logprobs + 1 of them.
    top.emplace(tokens.back().get<std::string>(), entry.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

Json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

Json finish_json(const ChoiceOutput& choice) {
  if (choice.called_tools && choice.finish_reason == engine::FinishReason::kStop) {
    return "tool_calls";
  }
  const char* name = finish_reason_name(choice.finish_reason);
  return name == nullptr ? Json(nullptr) : Json(name);
}

Json head_json(const ResponseHead& head, bool chunk) {
  const char* object = head.endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

}  // namespace

std::string completion_body(const ResponseHead& head, const std::vector<ChoiceOutput>& choices,
                            bool logprobs, const Usage& usage, const TextFront& front) {
  Json body = head_json(head, false);
  Json list = Json::array();
  for (const ChoiceOutput& choice : choices) {
    Json item = {{"index", choice.index}, {"finish_reason", finish_json(choice)}};
    if (head.endpoint == Endpoint::kChat) {
      item["message"] = {{"role", "assistant"}, {"content", choice.text}};
      if (choice.parsed_tools && choice.text.empty()) item["message"]["content"] = nullptr;
      if (!choice.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ToolCallOutput& call : choice.tool_calls) {
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        item["message"]["tool_calls"] = std::move(calls);
      }
      item["logprobs"] = logprobs ? chat_logprobs(choice.logprobs, front) : Json(nullptr);
    } else {
      item["text"] = choice.text;
      TextOffset offset;
      item["logprobs"] =
          logprobs ? completion_logprobs(choice.logprobs, choice.first_logprob_null, front, offset)
                   : Json(nullptr);
      if (choice.has_prompt_logprobs) item["prompt_logprobs"] = vllm_prompt_logprobs(choice, front);
    }
    list.push_back(std::move(item));
  }
  body["choices"] = std::move(list);
  // Chat: one prompt, its entries at the top of the answer (as vLLM puts them).
  if (head.endpoint == Endpoint::kChat && !choices.empty() && choices[0].has_prompt_logprobs) {
    body["prompt_logprobs"] = vllm_prompt_logprobs(choices[0], front);
  }
  body["usage"] = usage_json(usage);
  if (head.endpoint == Endpoint::kChat) body["system_fingerprint"] = nullptr;
  return dump(body);
}

std::string chunk_event(const ResponseHead& head, const ChoiceOutput& choice, bool first,
                        bool logprobs, bool include_usage, const TextFront& front,
                        TextOffset& offset) {
  Json body = head_json(head, true);
  Json item = {{"index", choice.index}, {"finish_reason", finish_json(choice)}};
  if (head.endpoint == Endpoint::kChat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!choice.text.empty() || first) delta["content"] = choice.text;
    item["delta"] = std::move(delta);
    item["logprobs"] = logprobs && !choice.logprobs.empty() ? chat_logprobs(choice.logprobs, front)
                                                            : Json(nullptr);
  } else {
    item["text"] = choice.text;
    item["logprobs"] =
        logprobs && !choice.logprobs.empty()
            ? completion_logprobs(choice.logprobs, choice.first_logprob_null, front, offset)
            : Json(nullptr);
    if (choice.has_prompt_logprobs) item["prompt_logprobs"] = vllm_prompt_logprobs(choice, front);
  }
  body["choices"] = Json::array({std::move(item)});
  if (head.endpoint == Endpoint::kChat && choice.has_prompt_logprobs) {
    body["prompt_logprobs"] = vllm_prompt_logprobs(choice, front);
  }
  if (include_usage) body["usage"] = nullptr;
  return "data: " + dump(body) + "\n\n";
}

std::string usage_event(const ResponseHead& head, const Usage& usage) {
  Json body = head_json(head, true);
  body["choices"] = Json::array();
  body["usage"] = usage_json(usage);
  return "data: " + dump(body) + "\n\n";
}

std::string error_event(const ApiError& error) { return "data: " + error_body(error) + "\n\n"; }

std::string tool_call_events(const ResponseHead& head, int32_t choice_index, int32_t call_index,
                             const ToolCallOutput& call, bool include_usage) {
  std::string text;
  const auto event = [&](Json entry) {
    Json body = head_json(head, true);
    body["choices"] = Json::array({{{"index", choice_index},
                                    {"delta", {{"tool_calls", Json::array({std::move(entry)})}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", nullptr}}});
    if (include_usage) body["usage"] = nullptr;
    text += "data: " + dump(body) + "\n\n";
  };
  event({{"index", call_index},
         {"id", call.id},
         {"type", "function"},
         {"function", {{"name", call.name}, {"arguments", ""}}}});
  event({{"index", call_index}, {"function", {{"arguments", call.arguments}}}});
  return text;
}

}  // namespace pagedattn::server::detail
