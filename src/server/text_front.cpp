// TokenizerTextFront: the TextFront of a real model (see include/pagedattn/server_text_front.h).
//
// encode: the tokenizer's post processor adds BOS as `tokenizers` does; a text that already
// starts with the BOS token (a rendered chat template writes it itself) keeps one BOS, not two.
// token_bytes: the tokenizer's raw bytes of the token (Tokenizer::token_bytes: a token that is
// part of a multi-byte character gives those bytes, not U+FFFD); empty for an id the model can
// sample but the tokenizer does not know (a vocabulary padded past the tokenizer's).
// render_chat: the conversation in one of the ToolCallForms, the first the template renders
// (render_chat_forms).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "pagedattn/chat_template.h"
#include "pagedattn/error.h"
#include "pagedattn/server_text_front.h"

namespace pagedattn::server {
namespace {

class TokenizerTextFront final : public TextFront {
 public:
  TokenizerTextFront(const tokenizer::Tokenizer& tokenizer, std::optional<ChatTemplate> chat,
                     ChatOptions options, std::string name)
      : tokenizer_(tokenizer),
        chat_(std::move(chat)),
        options_(std::move(options)),
        name_(std::move(name)) {
    options_.add_generation_prompt = true;
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids = tokenizer_.encode(text, /*add_special_tokens=*/true);
    const auto& bos = tokenizer_.config().bos_token;
    if (ids.size() >= 2 && bos && !bos->empty() && text.starts_with(*bos) && ids[0] == ids[1]) {
      ids.erase(ids.begin());
    }
    return ids;
  }

  std::string render_chat(std::span<const ChatMessage> messages,
                          const nlohmann::ordered_json& tools) const override {
    if (!chat_) throw Error(fmt::format("model {} has no chat template: use /v1/completions", name_));
    ChatOptions options = options_;
    options.tools = tools;
    return render_chat_forms(*chat_, messages, options);
  }

  std::string token_bytes(int32_t token) const override {
    return tokenizer_.token_bytes(token).value_or(std::string());
  }

 private:
  const tokenizer::Tokenizer& tokenizer_;
  std::optional<ChatTemplate> chat_;
  ChatOptions options_;
  std::string name_;
};

}  // namespace

nlohmann::ordered_json template_messages(std::span<const ChatMessage> messages, ToolCallForm form) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson list = OrderedJson::array();
  for (const ChatMessage& message : messages) {
    OrderedJson item = {{"role", message.role}};
    item["content"] = !message.content_null         ? OrderedJson(message.content)
                      : form == ToolCallForm::kVllm ? OrderedJson("")
                                                    : OrderedJson(nullptr);
    if (!message.name.empty()) item["name"] = message.name;
    if (!message.tool_calls.empty()) {
      OrderedJson calls = OrderedJson::array();
      for (const ChatToolCall& call : message.tool_calls) {
        OrderedJson entry = OrderedJson::object();
        if (!call.id.empty()) entry["id"] = call.id;
        entry["type"] = "function";
        OrderedJson arguments(call.arguments);
        if (form != ToolCallForm::kString) {
          // Validated as a JSON object when the request was read.
          arguments = OrderedJson::parse(call.arguments, nullptr, false);
          if (arguments.is_discarded()) arguments = OrderedJson::object();
        }
        entry["function"] = {{"name", call.name}, {"arguments", std::move(arguments)}};
        calls.push_back(std::move(entry));
      }
      item["tool_calls"] = std::move(calls);
    }
    if (message.role == "tool") item["tool_call_id"] = message.tool_call_id;
    list.push_back(std::move(item));
  }
  return list;
}

std::string render_chat_forms(const ChatTemplate& chat_template,
                              std::span<const ChatMessage> messages, const ChatOptions& options) {
  const bool varies = std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
    return m.content_null || !m.tool_calls.empty();
  });
  if (!varies) {
    return pagedattn::render_chat(chat_template,
                                  template_messages(messages, ToolCallForm::kMapping), options);
  }
  std::optional<ChatTemplateError> first_error;
  for (const ToolCallForm form :
       {ToolCallForm::kMapping, ToolCallForm::kString, ToolCallForm::kVllm}) {
    try {
      return pagedattn::render_chat(chat_template, template_messages(messages, form), options);
    } catch (const ChatTemplateError& error) {
      // The template refusing the conversation is its answer whatever the form.
      if (error.raised_by_template()) throw;
      if (!first_error) first_error = error;
    }
  }
  throw *first_error;
}

std::unique_ptr<TextFront> make_text_front(const tokenizer::Tokenizer& tokenizer,
                                           const std::filesystem::path& model_directory,
                                           std::optional<std::string> chat_template) {
  nlohmann::json config = nlohmann::json::object();
  const std::filesystem::path config_path = model_directory / "tokenizer_config.json";
  if (std::ifstream in(config_path); in) {
    config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      throw Error(fmt::format("{}: not a JSON object", config_path.string()));
    }
  }
  std::optional<ChatTemplate> chat;
  if (chat_template) {
    chat = ChatTemplate::compile(std::move(*chat_template));
  } else if (const std::optional<std::string_view> source = tokenizer.chat_template()) {
    chat = ChatTemplate::compile(std::string(*source));
  }
  return std::make_unique<TokenizerTextFront>(tokenizer, std::move(chat),
                                              chat_options_from_config(config),
                                              model_directory.filename().string());
}

}  // namespace pagedattn::server
