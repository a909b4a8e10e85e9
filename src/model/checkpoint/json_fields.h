// Typed reads of config.json fields with errors that name the file, the field, the value and what
// was expected ("config.json: num_attention_heads is "16" (a string), expected a positive
// integer"). Internal to the checkpoint loader.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace pagedattn::model::detail {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string source)
      : object_(object), source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  const nlohmann::json& object() const { return object_; }
  // True when the key is present and not null.
  bool has(std::string_view key) const;
  const nlohmann::json* find(std::string_view key) const;  // nullptr when absent or null

  int64_t required_int(std::string_view key, int64_t min_value = 1) const;
  std::optional<int64_t> optional_int(std::string_view key, int64_t min_value = 0) const;
  int64_t int_or(std::string_view key, int64_t fallback, int64_t min_value = 0) const;
  double required_number(std::string_view key) const;
  std::optional<double> optional_number(std::string_view key) const;
  double number_or(std::string_view key, double fallback) const;
  bool bool_or(std::string_view key, bool fallback) const;
  std::optional<std::string> optional_string(std::string_view key) const;

  // "the value" as a short JSON text for messages (truncated).
  static std::string describe(const nlohmann::json& value);

 private:
  [[noreturn]] void fail(std::string_view key, const nlohmann::json& value,
                         std::string_view expected) const;

  const nlohmann::json& object_;
  std::string source_;
};

}  // namespace pagedattn::model::detail
