// The values a chat template computes with, modelled on the Python objects Jinja2 hands around:
// undefined (with the reason, for the error a later use raises), none, bool, int (64-bit), float,
// str (UTF-8), list, dict (insertion-ordered, string keys, as JSON objects are), namespace (the
// one mutable object a template may assign into) and callables (macros, globals such as range(),
// bound methods such as str.split). Lists and dicts are shared and never mutated once built (the
// sandbox transformers uses forbids list.append and dict.update), so copying a Value is cheap.
// Printing follows Python: str() for output and `string`, repr() inside containers, and
// json.dumps(ensure_ascii=False) for the `tojson` filter transformers installs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn::jinja {

class Value;
using List = std::vector<Value>;
struct Dict;
struct Namespace;
struct Callable;

struct Undefined {
  std::string hint;  // what a use of it reports: "'x' is undefined", "'dict object' has no ..."
};
struct None {};

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : data_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(None{}); }
  // A Python tuple: a list that prints as (a, b) and never equals a list.
  static Value tuple(List elements) {
    Value value(std::move(elements));
    value.tuple_ = true;
    return value;
  }
  Value(bool value) : data_(value) {}
  Value(int value) : data_(static_cast<int64_t>(value)) {}
  Value(int64_t value) : data_(value) {}
  Value(double value) : data_(value) {}
  Value(std::string value) : data_(std::move(value)) {}
  Value(const char* value) : data_(std::string(value)) {}
  Value(List value) : data_(std::make_shared<const List>(std::move(value))) {}
  Value(std::shared_ptr<const List> value) : data_(std::move(value)) {}
  Value(std::shared_ptr<const Dict> value) : data_(std::move(value)) {}
  Value(std::shared_ptr<Namespace> value) : data_(std::move(value)) {}
  Value(std::shared_ptr<const Callable> value) : data_(std::move(value)) {}

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  // Python's numbers.Number: bool counts, as True + 1 == 2 there.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return type() == Type::kString; }
  bool is_list() const { return type() == Type::kList; }  // lists and tuples
  bool is_tuple() const { return tuple_; }
  bool is_dict() const { return type() == Type::kDict; }
  bool is_namespace() const { return type() == Type::kNamespace; }
  bool is_callable() const { return type() == Type::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;    // bool or int
  double as_double() const;  // any number
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }

  bool truthy() const;
  // Python's type name as Jinja's messages spell it: "str", "list", "dict", "int", ...
  std::string type_name() const;

 private:
  explicit Value(Undefined value) : data_(std::move(value)) {}
  explicit Value(None value) : data_(value) {}

  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Callable>>
      data_;
  bool tuple_ = false;
};

// An insertion-ordered mapping from string keys, as Python dicts and JSON objects keep them.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces an existing key in place
};

// namespace(): attributes assigned with `{% set ns.name = ... %}` are seen by every scope that
// holds the same namespace, which is why templates use it to carry state out of loops.
struct Namespace {
  Dict attributes;
};

class Interpreter;

// Arguments of a call as Python passes them: positional, then keyword.
struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;  // for messages: "range", "str.split", the macro's name
  std::function<Value(Interpreter&, CallArguments&)> function;
};

// Python's str() of a value (what `{{ value }}` prints); undefined prints empty.
std::string to_str(const Value& value);
// Python's repr(): quotes strings, as lists and dicts print their elements.
std::string to_repr(const Value& value);
// Python's repr() of a float: the shortest digits that read back exactly, 1e+16 from 1e16 on.
std::string float_repr(double value);

struct JsonOptions {
  // none: one line; else each element on its own line, indented, item_separator ending the line
  // (json.dumps' default is "," then; the caller sets it)
  std::optional<int> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ensure_ascii=False, ...): non-ASCII text kept as it is. Throws for values JSON
// cannot hold (undefined, callables).
std::string to_json_text(const Value& value, const JsonOptions& options);

// JSON in (an ordered_json keeps the caller's key order, as a Python dict does) and out.
Value from_json(const nlohmann::ordered_json& json);
nlohmann::ordered_json to_json(const Value& value);

// Python's ==, and <, which throws Error for types that do not order (a list and a dict).
bool values_equal(const Value& left, const Value& right);
bool values_less(const Value& left, const Value& right);

// UTF-8 helpers: Python indexes strings by code point, not byte.
std::vector<char32_t> decode_utf8(std::string_view text);
std::string encode_utf8(const std::vector<char32_t>& code_points);
void append_utf8(std::string& out, char32_t code_point);
size_t code_point_count(std::string_view text);

}  // namespace pagedattn::jinja
