// TokenizerTextFront: the TextFront of a real model (see include/pagedattn/server_text_front.h).
//
// encode: the tokenizer's post processor adds BOS as `tokenizers` does; a text that already
// starts with the BOS token (a rendered chat template writes it itself) keeps one BOS, not two.
// token_bytes: the tokenizer's raw bytes of the token (Tokenizer::token_bytes: a token that is
// part of a multi-byte character gives those bytes, not U+FFFD); empty for an id the model can
// sample but the tokenizer does not know (a vocabulary padded past the tokenizer's).
#include "pagedattn/server_text_front.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "pagedattn/chat_template.h"
#include "pagedattn/error.h"

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

  std::string render_chat(std::span<const ChatMessage> messages) const override {
    if (!chat_) throw Error(fmt::format("model {} has no chat template: use /v1/completions", name_));
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ChatMessage& message : messages) {
      list.push_back({{"role", message.role}, {"content", message.content}});
    }
    return pagedattn::render_chat(*chat_, list, options_);
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

std::unique_ptr<TextFront> make_text_front(const tokenizer::Tokenizer& tokenizer,
                                           const std::filesystem::path& model_directory) {
  nlohmann::json config = nlohmann::json::object();
  const std::filesystem::path config_path = model_directory / "tokenizer_config.json";
  if (std::ifstream in(config_path); in) {
    config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      throw Error(fmt::format("{}: not a JSON object", config_path.string()));
    }
  }
  std::optional<ChatTemplate> chat;
  if (const std::optional<std::string_view> source = tokenizer.chat_template()) {
    chat = ChatTemplate::compile(std::string(*source));
  }
  return std::make_unique<TokenizerTextFront>(tokenizer, std::move(chat),
                                              chat_options_from_config(config),
                                              model_directory.filename().string());
}

}  // namespace pagedattn::server
