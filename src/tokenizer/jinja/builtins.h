// Jinja2's built-in filters and tests, the methods of str / dict / list that templates call, and
// the global functions (range, namespace, dict, raise_exception, strftime_now). filters.cpp holds
// the filters and tests, methods.cpp the methods and globals.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace pagedattn::jinja {

class Interpreter;

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(Interpreter& interpreter, const std::string& name, const Value& operand,
                   CallArguments& arguments);
bool apply_test(Interpreter& interpreter, const std::string& name, const Value& operand,
                CallArguments& arguments);

// obj.name for a str, dict or list method: a callable bound to obj, or nullopt.
std::optional<Value> bound_method(const Value& object, const std::string& name);
// A global function by name, or nullopt.
std::optional<Value> global_function(const std::string& name);

// The values of a call's arguments matched to a Python signature by position, then by keyword.
// Throws Error naming `function` for an unknown keyword or too many positional arguments.
std::vector<std::optional<Value>> bind_arguments(std::string_view function,
                                                 const CallArguments& arguments,
                                                 std::initializer_list<std::string_view> names);

// Elements of a value as `for` sees them: a list's elements, a dict's keys, a string's
// characters; nothing for undefined. Throws Error for values that do not iterate.
List iterate(const Value& value);

}  // namespace pagedattn::jinja
