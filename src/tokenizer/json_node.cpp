// JsonNode: typed access to a JSON value that fails with the file, the JSON path and the value.
#include "json_node.h"

#include <fmt/format.h>

#include "core/check.h"

namespace pagedattn::tokenizer {
namespace {

std::string shortened(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 120) text = text.substr(0, 117) + "...";
  return text;
}

}  // namespace

void JsonNode::fail(std::string_view what) const {
  PA_FAIL("{}: {}: {} (value: {})", file_, path_, what, shortened(*value_));
}

JsonNode JsonNode::at(std::string_view key) const {
  if (!value_->is_object()) fail(fmt::format("expected an object with member \"{}\"", key));
  auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) {
    fail(fmt::format("missing member \"{}\"", key));
  }
  return JsonNode(*it, file_, fmt::format("{}.{}", path_, key));
}

std::optional<JsonNode> JsonNode::find(std::string_view key) const {
  if (!value_->is_object()) return std::nullopt;
  auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return std::nullopt;
  return JsonNode(*it, file_, fmt::format("{}.{}", path_, key));
}

JsonNode JsonNode::at(size_t index) const {
  if (!value_->is_array() || index >= value_->size()) {
    fail(fmt::format("expected an array with an element {}", index));
  }
  return JsonNode((*value_)[index], file_, fmt::format("{}[{}]", path_, index));
}

size_t JsonNode::size() const {
  if (!value_->is_array()) fail("expected an array");
  return value_->size();
}

std::vector<JsonNode> JsonNode::items() const {
  std::vector<JsonNode> result;
  result.reserve(size());
  for (size_t i = 0; i < value_->size(); ++i) result.push_back(at(i));
  return result;
}

std::string JsonNode::string() const {
  if (!value_->is_string()) fail("expected a string");
  return value_->get<std::string>();
}

bool JsonNode::boolean() const {
  if (!value_->is_boolean()) fail("expected true or false");
  return value_->get<bool>();
}

int64_t JsonNode::integer() const {
  if (!value_->is_number_integer()) fail("expected an integer");
  return value_->get<int64_t>();
}

double JsonNode::number() const {
  if (!value_->is_number()) fail("expected a number");
  return value_->get<double>();
}

std::string JsonNode::string_or(std::string_view key, std::string_view fallback) const {
  auto member = find(key);
  return member ? member->string() : std::string(fallback);
}

bool JsonNode::boolean_or(std::string_view key, bool fallback) const {
  auto member = find(key);
  return member ? member->boolean() : fallback;
}

std::string JsonNode::type(std::string_view stage,
                           const std::vector<std::string_view>& supported) const {
  std::string name = at("type").string();
  for (std::string_view candidate : supported) {
    if (candidate == name) return name;
  }
  at("type").fail(fmt::format("unsupported {} type \"{}\" (supported: {})", stage, name,
                              fmt::join(supported, ", ")));
}

nlohmann::json parse_json(std::string_view text, std::string_view file) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& error) {
    PA_FAIL("{}: malformed JSON at byte {}: {}", file, error.byte, error.what());
  }
}

}  // namespace pagedattn::tokenizer
