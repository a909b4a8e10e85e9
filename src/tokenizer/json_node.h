// A position in a parsed JSON file: the value, its file and its JSON path ($.model.merges[3]),
// so that every stage that reads its section can fail with a message naming all three.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::tokenizer {

class JsonNode {
 public:
  JsonNode(const nlohmann::json& value, std::string file, std::string path = "$")
      : value_(&value), file_(std::move(file)), path_(std::move(path)) {}

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }

  // The member `key`; an Error when absent (or, for at(), when null).
  JsonNode at(std::string_view key) const;
  // nullopt when absent or null.
  std::optional<JsonNode> find(std::string_view key) const;
  JsonNode at(size_t index) const;
  size_t size() const;  // of an array (an Error for anything else)
  std::vector<JsonNode> items() const;

  std::string string() const;
  bool boolean() const;
  int64_t integer() const;
  double number() const;
  bool is_string() const { return value_->is_string(); }
  bool is_array() const { return value_->is_array(); }
  bool is_object() const { return value_->is_object(); }
  bool is_null() const { return value_->is_null(); }

  // Optional members with a default (absent or null gives the default).
  std::string string_or(std::string_view key, std::string_view fallback) const;
  bool boolean_or(std::string_view key, bool fallback) const;

  // Throws Error "FILE: PATH: what (value: VALUE)".
  [[noreturn]] void fail(std::string_view what) const;
  // The "type" member of a stage, checked against the supported names for the message.
  std::string type(std::string_view stage, const std::vector<std::string_view>& supported) const;

 private:
  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
};

// Parses `text` as JSON; malformed JSON is an Error naming `file` and the parser's position.
nlohmann::json parse_json(std::string_view text, std::string_view file);

}  // namespace pagedattn::tokenizer
