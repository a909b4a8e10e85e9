// The public chat-template API (include/pagedattn/chat_template.h): compile = parse, render = run
// the interpreter over the context, render_chat = the context transformers' apply_chat_template
// builds (messages, tools, documents, add_generation_prompt, the special tokens, extra variables)
// and its continue_final_message cut.
#include "pagedattn/chat_template.h"

#include <fmt/format.h>

#include "jinja/ast.h"
#include "jinja/errors.h"
#include "jinja/interpreter.h"

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
  return options;
}

namespace {

// continue_final_message as transformers 5 does it: a sentinel appended to the final message's
// content (to its last text block when the content is a list of blocks), the chat rendered, and
// the text cut where the sentinel comes out.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

bool is_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

std::string strip_whitespace(const std::string& text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end && is_space(text[begin])) ++begin;
  }
  if (right) {
    while (end > begin && is_space(text[end - 1])) --end;
  }
  return text.substr(begin, end - begin);
}

// Appends the sentinel to the final message; returns that message's text as it was.
std::string tag_final_message(nlohmann::ordered_json& messages) {
  if (messages.empty() || !messages.back().is_object()) {
    throw Error("render_chat: continue_final_message needs a final message (a JSON object)");
  }
  auto& content = messages.back()["content"];
  if (content.is_string()) {
    std::string text = content.get<std::string>();
    content = text + std::string(kContinueTag);
    return text;
  }
  if (content.is_array()) {
    for (auto it = content.rbegin(); it != content.rend(); ++it) {
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
        std::string text = (*it)["text"].get<std::string>();
        (*it)["text"] = text + std::string(kContinueTag);
        return text;
      }
    }
    throw Error(
        "render_chat: continue_final_message is set but the final message has no text "
        "block to continue");
  }
  throw Error(
      "render_chat: continue_final_message is set but the final message has no "
      "\"content\" to continue");
}

}  // namespace

std::string render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const ChatOptions& options) {
  if (!messages.is_array()) {
    throw Error(
        fmt::format("render_chat: messages must be a JSON array, got {}", messages.type_name()));
  }
  if (options.continue_final_message && options.add_generation_prompt) {
    throw Error("render_chat: continue_final_message and add_generation_prompt are not compatible");
  }
  if (!options.variables.is_object()) {
    throw Error("render_chat: ChatOptions::variables must be a JSON object");
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  std::string final_message;
  if (options.continue_final_message) {
    if (chat_template.source().find("content") == std::string::npos) {
      throw Error(
          "render_chat: continue_final_message is set but the template never reads a "
          "message's \"content\"");
    }
    final_message = tag_final_message(context["messages"]);
  }
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (const auto& [name, value] : options.variables.items()) context[name] = value;
  std::string rendered = chat_template.render(context);
  if (!options.continue_final_message) return rendered;

  const std::string tag_stripped = strip_whitespace(std::string(kContinueTag), true, true);
  if (rendered.find(strip_whitespace(final_message, true, true)) == std::string::npos ||
      rendered.find(tag_stripped) == std::string::npos) {
    throw Error(
        "render_chat: continue_final_message is set but the final message does not "
        "appear in the rendered chat (the template changed it)");
  }
  size_t at = rendered.rfind(tag_stripped);
  if (rendered.compare(at, kContinueTag.size(), kContinueTag) == 0) return rendered.substr(0, at);
  return strip_whitespace(rendered.substr(0, at), false, true);  // the template trimmed the space
}

}  // namespace pagedattn
