// Typed readers of request fields: each takes the JSON object and a field name and either fills
// the value or throws FieldError naming the field, what it was and what was expected. null means
// "not given", as in OpenAI's API. Internal to the server layer.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "pagedattn/server_protocol.h"

namespace pagedattn::server::detail {

using Json = nlohmann::json;

struct FieldError {
  ApiError error;
};

[[noreturn]] void fail(std::string param, std::string message, std::string code = "invalid_value",
                       int status = 400);

// The JSON type's name as a message says it ("string", "integer", "array", ...).
std::string type_name(const Json& value);

const Json* find(const Json& object, const char* name);  // nullptr when absent or null

std::optional<bool> read_bool(const Json& object, const char* name);
std::optional<int64_t> read_integer(const Json& object, const char* name, int64_t low,
                                    int64_t high);
std::optional<double> read_number(const Json& object, const char* name, double low, double high);
std::optional<std::string> read_string(const Json& object, const char* name);

}  // namespace pagedattn::server::detail
