// prepare_request (server_protocol.h): body -> JSON (depth-limited, UTF-8 checked by the
// parser) -> known-field check -> typed fields -> model -> messages / prompts (completions: a
// string, token ids, or a batch of either, each element checked by its index) -> tokens ->
// context length and the engine's validate() for every prompt, before any is queued. The field
// lists say which names OpenAI accepts per endpoint plus the extensions vLLM accepts (top_k,
// min_p, repetition_penalty, ignore_eos, stop_token_ids); fields accepted but without effect
// here are listed apart (read_unsupported; `suffix` is refused, as vLLM does).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>

#include "chat_request.h"
#include "fields.h"
#include "pagedattn/error.h"

namespace pagedattn::server {

using detail::fail;
using detail::FieldError;
using detail::find;
using detail::Json;
using detail::read_bool;
using detail::read_integer;
using detail::read_number;
using detail::read_string;
using detail::type_name;

std::string error_body(const ApiError& error) {
  Json body;
  body["error"]["message"] = error.message;
  body["error"]["type"] = error.type;
  body["error"]["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  body["error"]["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

constexpr std::array kCommonFields = {
    "model", "stream", "stream_options", "temperature", "top_p", "n", "stop", "max_tokens",
    "presence_penalty", "frequency_penalty", "logit_bias", "seed", "user", "logprobs",
    // vLLM's extensions.
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "prompt_logprobs"};
constexpr std::array kChatFields = {
    "messages", "max_completion_tokens", "top_logprobs",        "response_format", "store",
    "metadata", "service_tier",          "parallel_tool_calls", "tools",           "tool_choice"};
constexpr std::array kCompletionFields = {"prompt", "echo", "best_of", "suffix"};

bool known(const std::string& name, Endpoint endpoint) {
  const auto in = [&](const auto& list) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  return in(kCommonFields) ||
         (endpoint == Endpoint::kChat ? in(kChatFields) : in(kCompletionFields));
}

Json parse_body(std::string_view body) {
  // The callback sees each value's depth as it is parsed; refusing a deep one keeps a hostile
  // body from building a deep tree at all.
  const Json::parser_callback_t depth_guard = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) {
      fail("", fmt::format("malformed JSON: nesting deeper than {} levels", kMaxJsonDepth),
           "invalid_json");
    }
    return true;
  };
  try {
    return Json::parse(body.begin(), body.end(), depth_guard);
  } catch (const Json::parse_error& error) {
    fail("", fmt::format("malformed JSON body: {}", error.what()), "invalid_json");
  }
}

constexpr const char* kPromptForms =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

// One prompt of a completions request, `param` naming it ("prompt" or "prompt[i]").
struct PromptInput {
  std::vector<int32_t> tokens;
  std::string text;  // the string as given, or the tokens' bytes (echo)
};

PromptInput read_token_ids(const Json& ids, const std::string& param, const ParseContext& context) {
  if (ids.empty()) fail(param, fmt::format("'{}': must not be empty", param));
  PromptInput prompt;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& token = ids[i];
    if (!token.is_number_integer() || token.get<int64_t>() < 0 ||
        token.get<int64_t>() >= context.limits.vocab_size) {
      fail(param, fmt::format("'{}[{}]': {} is not a token id in [0, {})", param, i,
                              token.dump(-1, ' ', false, Json::error_handler_t::replace),
                              context.limits.vocab_size));
    }
    prompt.tokens.push_back(token.get<int32_t>());
    prompt.text += context.front->token_bytes(prompt.tokens.back());
  }
  return prompt;
}

PromptInput read_text(const Json& text, const std::string& param, const ParseContext& context) {
  PromptInput prompt;
  prompt.text = text.get<std::string>();
  if (prompt.text.empty()) fail(param, fmt::format("'{}': must not be empty", param));
  try {
    prompt.tokens = context.front->encode(prompt.text);
  } catch (const Error& error) {
    fail(param, fmt::format("'{}': cannot be tokenized: {}", param, error.what()));
  }
  return prompt;
}

// The prompt forms of OpenAI's API: a string, an array of strings, an array of token ids, an
// array of arrays of token ids; a batch is all strings or all arrays. Returns (param, prompt).
std::vector<std::pair<std::string, PromptInput>> read_prompts(const Json& request,
                                                              const ParseContext& context) {
  const Json* prompt = find(request, "prompt");
  if (prompt == nullptr) fail("prompt", "'prompt': required", "missing_required_parameter");
  std::vector<std::pair<std::string, PromptInput>> prompts;
  if (prompt->is_string()) {
    prompts.emplace_back("prompt", read_text(*prompt, "prompt", context));
    return prompts;
  }
  if (!prompt->is_array()) {
    fail("prompt", fmt::format("'prompt': expected {}, got {}", kPromptForms, type_name(*prompt)),
         "invalid_type");
  }
  if (prompt->empty()) fail("prompt", "'prompt': must not be empty");
  if ((*prompt)[0].is_number()) {
    prompts.emplace_back("prompt", read_token_ids(*prompt, "prompt", context));
    return prompts;
  }
  if (prompt->size() > kMaxPrompts) {
    fail("prompt", fmt::format("'prompt': a batch of {} prompts (at most {} per request)",
                               prompt->size(), kMaxPrompts));
  }
  const bool strings = (*prompt)[0].is_string();
  for (size_t i = 0; i < prompt->size(); ++i) {
    const Json& item = (*prompt)[i];
    const std::string param = fmt::format("prompt[{}]", i);
    if (strings && item.is_string()) {
      prompts.emplace_back(param, read_text(item, param, context));
    } else if (!strings && item.is_array()) {
      prompts.emplace_back(param, read_token_ids(item, param, context));
    } else {
      fail(param,
           fmt::format("'{}': expected {} like prompt[0] (a batch is all strings or all arrays of "
                       "token ids), got {}",
                       param, strings ? "a string" : "an array of token ids", type_name(item)),
           "invalid_type");
    }
  }
  return prompts;
}

void read_stop(const Json& request, engine::SamplingParams& params) {
  const Json* stop = find(request, "stop");
  if (stop == nullptr) return;
  const auto add = [&](const Json& value) {
    if (!value.is_string()) {
      fail(
          "stop",
          fmt::format("'stop': expected a string or an array of strings, got {}", type_name(value)),
          "invalid_type");
    }
    if (value.get<std::string>().empty()) fail("stop", "'stop': stop strings must not be empty");
    params.stop.push_back(value.get<std::string>());
  };
  if (stop->is_array()) {
    if (stop->size() > engine::kMaxStopStrings) {
      fail("stop", fmt::format("'stop': {} stop strings (at most {})", stop->size(),
                               engine::kMaxStopStrings));
    }
    for (const Json& item : *stop) add(item);
  } else {
    add(*stop);
  }
}

void read_logit_bias(const Json& request, int32_t vocab, engine::SamplingParams& params) {
  const Json* bias = find(request, "logit_bias");
  if (bias == nullptr) return;
  if (!bias->is_object()) {
    fail("logit_bias", fmt::format("'logit_bias': expected an object, got {}", type_name(*bias)),
         "invalid_type");
  }
  for (const auto& [key, value] : bias->items()) {
    int64_t token = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) token = std::stoll(key);
    if (token < 0 || token >= vocab) {
      fail("logit_bias",
           fmt::format("'logit_bias': key '{}' is not a token id in [0, {})", key, vocab));
    }
    if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0) {
      fail("logit_bias", fmt::format("'logit_bias': the bias of token {} must be a number in "
                                     "[-100, 100]",
                                     token));
    }
    params.logit_bias.emplace_back(static_cast<int32_t>(token), value.get<float>());
  }
}

// Fields OpenAI accepts that this server takes without effect, or refuses when they ask for
// what it does not do.
void read_unsupported(const Json& request, Endpoint endpoint) {
  if (endpoint == Endpoint::kChat) {
    if (const Json* format = find(request, "response_format")) {
      if (!format->is_object() || find(*format, "type") == nullptr ||
          *find(*format, "type") != "text") {
        fail("response_format", "'response_format': only {\"type\": \"text\"} is supported");
      }
    }
    read_bool(request, "store");
    read_string(request, "service_tier");
  } else {
    // As vLLM: no model served here is trained to fill in the middle.
    if (const auto suffix = read_string(request, "suffix"); suffix && !suffix->empty()) {
      fail("suffix", "'suffix': not supported by this server (no fill-in-the-middle)");
    }
  }
  read_string(request, "user");
}

PreparedRequest parse(std::string_view body, Endpoint endpoint, const ParseContext& context) {
  const Json request = parse_body(body);
  if (!request.is_object()) {
    fail("", fmt::format("the request body must be a JSON object, got {}", type_name(request)),
         "invalid_type");
  }
  for (const auto& [key, value] : request.items()) {
    if (!known(key, endpoint)) {
      fail(key, fmt::format("Unrecognized request argument supplied: {}", key),
           "unknown_parameter");
    }
  }
  PreparedRequest prepared;
  prepared.endpoint = endpoint;
  engine::SamplingParams& params = prepared.params;
  prepared.stream = read_bool(request, "stream").value_or(false);
  if (const Json* options = find(request, "stream_options")) {
    if (!options->is_object()) {
      fail("stream_options", "'stream_options': expected an object", "invalid_type");
    }
    if (!prepared.stream) fail("stream_options", "'stream_options': only allowed with stream true");
    prepared.include_usage = read_bool(*options, "include_usage").value_or(false);
  }
  params.temperature = read_number(request, "temperature", 0.0, 2.0).value_or(1.0);
  params.top_p = read_number(request, "top_p", 0.0, 1.0).value_or(1.0);
  if (params.top_p <= 0.0) fail("top_p", "'top_p': must be in (0, 1]");
  params.n = static_cast<int32_t>(read_integer(request, "n", 1, engine::kMaxChoices).value_or(1));
  params.presence_penalty = read_number(request, "presence_penalty", -2.0, 2.0).value_or(0.0);
  params.frequency_penalty = read_number(request, "frequency_penalty", -2.0, 2.0).value_or(0.0);
  params.repetition_penalty = read_number(request, "repetition_penalty", 1e-6, 1e6).value_or(1.0);
  params.top_k = static_cast<int32_t>(read_integer(request, "top_k", -1, INT32_MAX).value_or(-1));
  params.min_p = read_number(request, "min_p", 0.0, 1.0).value_or(0.0);
  if (const auto seed = read_integer(request, "seed", INT64_MIN, INT64_MAX)) {
    params.seed = static_cast<uint64_t>(*seed);
  }
  params.ignore_eos = read_bool(request, "ignore_eos").value_or(false);
  if (const Json* ids = find(request, "stop_token_ids")) {
    if (!ids->is_array())
      fail("stop_token_ids", "'stop_token_ids': expected an array", "invalid_type");
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= context.limits.vocab_size) {
        fail("stop_token_ids", fmt::format("'stop_token_ids': expected token ids in [0, {})",
                                           context.limits.vocab_size));
      }
      params.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  read_stop(request, params);
  read_logit_bias(request, context.limits.vocab_size, params);
  read_unsupported(request, endpoint);
  const int64_t length = context.limits.max_model_length;
  // max_tokens 0 is for echo alone (completions; see below).
  std::optional<int64_t> max_tokens =
      read_integer(request, "max_tokens", endpoint == Endpoint::kChat ? 1 : 0, INT32_MAX);
  if (endpoint == Endpoint::kChat) {
    if (const auto completion = read_integer(request, "max_completion_tokens", 1, INT32_MAX)) {
      max_tokens = completion;
    }
    const bool logprobs = read_bool(request, "logprobs").value_or(false);
    const auto top = read_integer(request, "top_logprobs", 0, engine::kMaxLogprobs);
    if (top && !logprobs) fail("top_logprobs", "'top_logprobs': requires 'logprobs': true");
    prepared.logprobs = logprobs;
    if (logprobs) params.logprobs = static_cast<int32_t>(top.value_or(0));
  } else {
    if (const auto k = read_integer(request, "logprobs", 0, engine::kMaxLogprobs)) {
      prepared.logprobs = true;
      params.logprobs = static_cast<int32_t>(*k);
    }
    prepared.echo = read_bool(request, "echo").value_or(false);
    // With echo the prompt tokens get their logprobs too, with the same number of alternatives.
    if (prepared.echo && prepared.logprobs) params.prompt_logprobs = params.logprobs;
    // OpenAI and vLLM take max_tokens 0 with echo: the prompt (and its logprobs) with nothing
    // generated, how a client scores a text (lm-evaluation-harness' loglikelihood requests).
    if (max_tokens == 0 && !prepared.echo) {
      fail("max_tokens",
           "'max_tokens': 0 is allowed only with 'echo': true (to return the prompt "
           "and its logprobs without generating); expected >= 1");
    }
    if (const auto best_of = read_integer(request, "best_of", 1, engine::kMaxChoices);
        best_of && *best_of != params.n) {
      fail("best_of", fmt::format("'best_of': {} differs from n = {}; only best_of = n is "
                                  "supported",
                                  *best_of, params.n));
    }
  }
  if (max_tokens)
    params.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
  // vLLM's prompt_logprobs: each prompt token's logprob under the tokens before it, with the top
  // n alternatives (the engine scores max(n, echo's logprobs) and each output keeps its own n).
  if (const auto k = read_integer(request, "prompt_logprobs", 0, engine::kMaxLogprobs)) {
    prepared.prompt_logprobs = static_cast<int32_t>(*k);
    params.prompt_logprobs = std::max(params.prompt_logprobs.value_or(0), *prepared.prompt_logprobs);
  }

  // The model comes after the fields: a request malformed in any way is a 400 whatever it names.
  const Json* model = find(request, "model");
  if (model == nullptr) fail("model", "'model': required", "missing_required_parameter");
  if (!model->is_string()) {
    fail("model", fmt::format("'model': expected a string, got {}", type_name(*model)),
         "invalid_type");
  }
  prepared.model = model->get<std::string>();
  if (prepared.model != context.model_name) {
    fail("model",
         fmt::format("The model `{}` does not exist (this server serves `{}`)", prepared.model,
                     context.model_name),
         "model_not_found", 404);
  }

  // (param, tokens) of each prompt.
  std::vector<std::pair<std::string, std::vector<int32_t>>> prompts;
  if (endpoint == Endpoint::kChat) {
    const detail::ChatInput chat = detail::read_chat_input(request, body, context);
    prepared.tool_call_format = chat.tool_call_format;
    prepared.parallel_tool_calls = chat.parallel_tool_calls;
    try {
      prompts.emplace_back(
          "messages", context.front->encode(context.front->render_chat(chat.messages, chat.tools)));
    } catch (const Error& error) {
      fail("messages",
           fmt::format("'messages': cannot be rendered or tokenized: {}", error.what()));
    }
  } else {
    for (auto& [param, prompt] : read_prompts(request, context)) {
      prompts.emplace_back(param, std::move(prompt.tokens));
      if (prepared.echo) prepared.prompt_texts.push_back(std::move(prompt.text));
    }
    const int64_t choices = static_cast<int64_t>(prompts.size()) * params.n;
    if (choices > kMaxBatchChoices) {
      fail("prompt", fmt::format("'prompt': {} prompts x n = {} make {} choices (at most {} per "
                                 "request)",
                                 prompts.size(), params.n, choices, kMaxBatchChoices));
    }
  }
  // Every prompt is checked before any is queued: one bad prompt refuses the whole batch.
  for (auto& [prompt_param, tokens] : prompts) {
    const int64_t prompt_length = static_cast<int64_t>(tokens.size());
    if (prompt_length == 0)
      fail(prompt_param, fmt::format("'{}': renders to no tokens", prompt_param));
    if (prompt_length >= length || (max_tokens && prompt_length + *max_tokens > length)) {
      fail(prompt_param,
           fmt::format("This model's maximum context length is {} tokens. However, you requested "
                       "{} tokens ({} in the {}, {} for the completion).",
                       length, prompt_length + std::max<int64_t>(max_tokens.value_or(1), 1),
                       prompt_length, prompt_param,
                       max_tokens ? fmt::format("{}", *max_tokens) : std::string("at least 1")),
           "context_length_exceeded");
    }
    try {
      engine::validate(params, prompt_length, context.limits);
    } catch (const Error& error) {
      fail("", error.what());
    }
    prepared.prompts.push_back(std::move(tokens));
  }
  return prepared;
}

}  // namespace

std::variant<PreparedRequest, ApiError> prepare_request(std::string_view body, Endpoint endpoint,
                                                        const ParseContext& context) {
  try {
    return parse(body, endpoint, context);
  } catch (const FieldError& error) {
    return error.error;
  } catch (const std::exception& error) {
    // Anything else a malformed body provokes (a JSON type error in a path not checked above) is
    // still the client's: 400, never a crash.
    ApiError api;
    api.message = fmt::format("invalid request: {}", error.what());
    return api;
  }
}

}  // namespace pagedattn::server
