// Typed field readers (fields.h): the type checks and range messages of every request field.
#include "fields.h"

#include <fmt/format.h>

#include <cmath>

namespace pagedattn::server::detail {

void fail(std::string param, std::string message, std::string code, int status) {
  ApiError error;
  error.status = status;
  error.message = std::move(message);
  error.param = std::move(param);
  error.code = std::move(code);
  throw FieldError{std::move(error)};
}

std::string type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "binary";
  }
}

const Json* find(const Json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

static void wrong_type(const char* name, const char* expected, const Json& value) {
  fail(name, fmt::format("'{}': expected {}, got {}", name, expected, type_name(value)),
       "invalid_type");
}

std::optional<bool> read_bool(const Json& object, const char* name) {
  const Json* value = find(object, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) wrong_type(name, "a boolean", *value);
  return value->get<bool>();
}

std::optional<int64_t> read_integer(const Json& object, const char* name, int64_t low,
                                    int64_t high) {
  const Json* value = find(object, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number_integer()) wrong_type(name, "an integer", *value);
  if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(INT64_MAX)) {
    fail(name, fmt::format("'{}': {} is out of range [{}, {}]", name, value->dump(), low, high));
  }
  const int64_t number = value->get<int64_t>();
  if (number < low || number > high) {
    fail(name, fmt::format("'{}': {} is out of range [{}, {}]", name, number, low, high));
  }
  return number;
}

std::optional<double> read_number(const Json& object, const char* name, double low, double high) {
  const Json* value = find(object, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) wrong_type(name, "a number", *value);
  const double number = value->get<double>();
  if (!std::isfinite(number) || number < low || number > high) {
    fail(name, fmt::format("'{}': {} is out of range [{}, {}]", name, number, low, high));
  }
  return number;
}

std::optional<std::string> read_string(const Json& object, const char* name) {
  const Json* value = find(object, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) wrong_type(name, "a string", *value);
  return value->get<std::string>();
}

}  // namespace pagedattn::server::detail
