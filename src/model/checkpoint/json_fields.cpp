// Typed config.json field reads (see json_fields.h). Integers must be JSON integers (or floats with
// an integral value, as some exporters write 4096.0); numbers may be integers or floats.
#include "checkpoint/json_fields.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace pagedattn::model::detail {

using nlohmann::json;

std::string JsonFields::describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

void JsonFields::fail(std::string_view key, const json& value, std::string_view expected) const {
  PA_FAIL("{}: {} is {}, expected {}", source_, key, describe(value), expected);
}

const json* JsonFields::find(std::string_view key) const {
  const auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(std::string_view key) const { return find(key) != nullptr; }

static std::optional<int64_t> as_integer(const json& value) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
      return static_cast<int64_t>(v);
    }
  }
  return std::nullopt;
}

std::optional<int64_t> JsonFields::optional_int(std::string_view key, int64_t min_value) const {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  const std::optional<int64_t> number = as_integer(*value);
  if (!number || *number < min_value) {
    fail(key, *value, fmt::format("an integer >= {}", min_value));
  }
  return number;
}

int64_t JsonFields::required_int(std::string_view key, int64_t min_value) const {
  const std::optional<int64_t> value = optional_int(key, min_value);
  PA_CHECK(value.has_value(), "{}: {} is missing, expected an integer >= {}", source_, key,
           min_value);
  return *value;
}

int64_t JsonFields::int_or(std::string_view key, int64_t fallback, int64_t min_value) const {
  return optional_int(key, min_value).value_or(fallback);
}

std::optional<double> JsonFields::optional_number(std::string_view key) const {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number() || !std::isfinite(value->get<double>())) {
    fail(key, *value, "a finite number");
  }
  return value->get<double>();
}

double JsonFields::required_number(std::string_view key) const {
  const std::optional<double> value = optional_number(key);
  PA_CHECK(value.has_value(), "{}: {} is missing, expected a number", source_, key);
  return *value;
}

double JsonFields::number_or(std::string_view key, double fallback) const {
  return optional_number(key).value_or(fallback);
}

bool JsonFields::bool_or(std::string_view key, bool fallback) const {
  const json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) fail(key, *value, "true or false");
  return value->get<bool>();
}

std::optional<std::string> JsonFields::optional_string(std::string_view key) const {
  const json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) fail(key, *value, "a string");
  return value->get<std::string>();
}

}  // namespace pagedattn::model::detail
