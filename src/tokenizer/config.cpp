// tokenizer_config.json (see TokenizerConfig in tokenizer.h): special tokens as strings or
// AddedToken objects ({"content": ...}), add_bos_token / add_eos_token, and the chat template as
// a string or a list of {"name", "template"}; chat_template.jinja beside it is the "default".
#include <fmt/format.h>

#include "tokenizer_impl.h"

namespace pagedattn::tokenizer {
namespace {

std::optional<std::string> special_token(const JsonNode& config, std::string_view key) {
  auto member = config.find(key);
  if (!member) return std::nullopt;
  if (member->is_string()) return member->string();
  if (member->is_object()) return member->at("content").string();
  member->fail("expected a token: a string or an object with \"content\"");
}

}  // namespace

TokenizerConfig read_config(std::string_view config_json, std::string_view config_name,
                            std::string_view chat_template_jinja, const Tokenizer& tokenizer) {
  TokenizerConfig config;
  nlohmann::json document =
      config_json.empty() ? nlohmann::json::object() : parse_json(config_json, config_name);
  JsonNode root(document, std::string(config_name));
  if (!root.is_object()) root.fail("expected an object");
  config.bos_token = special_token(root, "bos_token");
  config.eos_token = special_token(root, "eos_token");
  config.pad_token = special_token(root, "pad_token");
  config.unk_token = special_token(root, "unk_token");
  auto id_of = [&](const std::optional<std::string>& token) -> std::optional<TokenId> {
    if (!token) return std::nullopt;
    return tokenizer.token_to_id(*token);
  };
  config.bos_token_id = id_of(config.bos_token);
  config.eos_token_id = id_of(config.eos_token);
  config.pad_token_id = id_of(config.pad_token);
  config.unk_token_id = id_of(config.unk_token);
  if (auto flag = root.find("add_bos_token")) config.add_bos_token = flag->boolean();
  if (auto flag = root.find("add_eos_token")) config.add_eos_token = flag->boolean();

  if (!chat_template_jinja.empty()) {
    config.chat_templates.emplace_back("default", std::string(chat_template_jinja));
  }
  if (auto chat = root.find("chat_template")) {
    auto add = [&](std::string name, std::string text) {
      for (const auto& entry : config.chat_templates) {
        if (entry.first == name) return;  // chat_template.jinja comes first
      }
      config.chat_templates.emplace_back(std::move(name), std::move(text));
    };
    if (chat->is_string()) {
      add("default", chat->string());
    } else if (chat->is_array()) {
      for (const JsonNode& item : chat->items()) {
        add(item.at("name").string(), item.at("template").string());
      }
    } else {
      chat->fail("expected a template string or a list of {\"name\", \"template\"}");
    }
  }
  return config;
}

}  // namespace pagedattn::tokenizer
