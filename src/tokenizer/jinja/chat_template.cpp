// The public chat-template API (include/pagedattn/chat_template.h): compile = parse, render = run
// the interpreter over the context, render_chat = the context transformers' apply_chat_template
// builds (messages, tools, documents, add_generation_prompt, the special tokens, extra variables)
// and its continue_final_message cut.
#include <fmt/format.h>

#include "jinja/ast.h"
#include "jinja/errors.h"
#include "jinja/interpreter.h"
#include "pagedattn/chat_template.h"

namespace pagedattn {

ChatTemplateError::ChatTemplateError(int line, int column, std::string reason,
                                     bool raised_by_template)
    : Error(fmt::format("chat template: line {}, column {}: {}{}", line, column,
                        raised_by_template ? "raise_exception: " : "", reason)),
      line_(line),
      column_(column),
      reason_(std::move(reason)),
      raised_by_template_(raised_by_template) {}

namespace jinja {

void fail_at(Location location, const std::string& reason) {
  throw ChatTemplateError(location.line, location.column, reason, false);
}

void raise_from_template(Location location, const std::string& message) {
  throw ChatTemplateError(location.line, location.column, message, true);
}

}  // namespace jinja

ChatTemplate ChatTemplate::compile(std::string source) {
  ChatTemplate compiled;
  compiled.program_ = jinja::parse(std::move(source));
  return compiled;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    throw Error(fmt::format("ChatTemplate::render: the context must be a JSON object, got {}",
                            context.type_name()));
  }
  jinja::Interpreter interpreter(*program_);
  return interpreter.render(jinja::from_json(context));
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json::parse(context.dump()));
}

const std::string& ChatTemplate::source() const { return program_->source; }

ChatOptions chat_options_from_config(const nlohmann::json& tokenizer_config) {
  if (!tokenizer_config.is_object()) {
    throw Error("chat_options_from_config: tokenizer_config.json must hold a JSON object");
  }
  ChatOptions options;
  auto token_text = [](const nlohmann::json& token) -> std::optional<std::string> {
    if (token.is_string()) return token.get<std::string>();
    if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      return token["content"].get<std::string>();  // an AddedToken object
    }
    return std::nullopt;
  };
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    auto it = tokenizer_config.find(name);
    if (it == tokenizer_config.end()) continue;
    if (auto text = token_text(*it)) options.variables[name] = *text;
  }
  auto additional = tokenizer_config.find("additional_special_tokens");
  if (additional != tokenizer_config.end() && additional->is_array()) {
    auto tokens = nlohmann::ordered_json::array();
    for (const auto& token : *additional) {
      if (auto text = token_text(token)) tokens.push_back(*text);
    }
    options.variables["additional_special_tokens"] = tokens;
  }
  return options;
}

namespace {

// The text of the final message that continue_final_message continues: its content string, or
// the last text block of a list of content blocks.
std::string final_message_text(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty() || !messages.back().is_object()) {
    throw Error("render_chat: continue_final_message needs a final message");
  }
  const auto& content = messages.back().value("content", nlohmann::ordered_json());
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    for (auto it = content.rbegin(); it != content.rend(); ++it) {
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
        return (*it)["text"].get<std::string>();
      }
    }
  }
  throw Error("render_chat: continue_final_message is set but the final message has no text");
}

std::string strip_whitespace(const std::string& text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
  if (left) {
    while (begin < end && space(text[begin])) ++begin;
  }
  if (right) {
    while (end > begin && space(text[end - 1])) --end;
  }
  return text.substr(begin, end - begin);
}

}  // namespace

std::string render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const ChatOptions& options) {
  if (!messages.is_array()) {
    throw Error(fmt::format("render_chat: messages must be a JSON array, got {}",
                            messages.type_name()));
  }
  if (options.continue_final_message && options.add_generation_prompt) {
    throw Error("render_chat: continue_final_message and add_generation_prompt are not compatible");
  }
  if (!options.variables.is_object()) {
    throw Error("render_chat: ChatOptions::variables must be a JSON object");
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (const auto& [name, value] : options.variables.items()) context[name] = value;
  std::string rendered = chat_template.render(context);
  if (!options.continue_final_message) return rendered;

  // As transformers: cut after the last occurrence of the final message, keeping its trailing
  // whitespace only where the template kept it.
  const std::string final_message = final_message_text(messages);
  const std::string stripped = strip_whitespace(final_message, true, true);
  if (stripped.empty()) return rendered;  // Python finds "" at the end: nothing is cut
  size_t at = rendered.rfind(stripped);
  if (at == std::string::npos) {
    throw Error("render_chat: continue_final_message is set but the final message does not "
                "appear in the rendered chat (the template changed it)");
  }
  const std::string left_stripped = strip_whitespace(final_message, true, false);
  if (rendered.compare(at, left_stripped.size(), final_message) == 0) {
    return rendered.substr(0, at + left_stripped.size());
  }
  return rendered.substr(0, at + stripped.size());
}

}  // namespace pagedattn
