// Jinja2's built-in tests (`x is defined`, `n is divisibleby 3`, `a is equalto b`, ...), with
// Python's notion of the types: bool is a number but not an integer, undefined is iterable.
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace pagedattn::jinja {
namespace {

using Test = bool (*)(Interpreter&, const Value&, CallArguments&);
using Bound = std::vector<std::optional<Value>>;

bool compare_test(Interpreter&, const Value& value, CallArguments& arguments, const char* op) {
  Bound bound = bind_arguments(op, arguments, {"other"});
  Value other = bound[0].value_or(Value());
  std::string_view o = op;
  if (o == "==") return values_equal(value, other);
  if (o == "!=") return !values_equal(value, other);
  if (o == "<") return values_less(value, other);
  if (o == ">") return values_less(other, value);
  if (o == "<=") return !values_less(other, value);
  return !values_less(value, other);
}

#define TYPE_TEST(name, expression)                                                           \
  {                                                                                           \
    name, [](Interpreter&, const Value& value, CallArguments&) -> bool { return expression; } \
  }
#define COMPARE_TEST(name, op)                                                         \
  {                                                                                    \
    name, [](Interpreter& interpreter, const Value& value, CallArguments& arguments) { \
      return compare_test(interpreter, value, arguments, op);                          \
    }                                                                                  \
  }

const std::unordered_map<std::string, Test>& tests() {
  static const std::unordered_map<std::string, Test> table = {
      TYPE_TEST("defined", !value.is_undefined()),
      TYPE_TEST("undefined", value.is_undefined()),
      TYPE_TEST("none", value.is_none()),
      TYPE_TEST("string", value.is_string()),
      TYPE_TEST("number", value.is_number()),
      TYPE_TEST("integer", value.is_int()),
      TYPE_TEST("float", value.is_float()),
      TYPE_TEST("boolean", value.is_bool()),
      TYPE_TEST("true", value.is_bool() && value.as_bool()),
      TYPE_TEST("false", value.is_bool() && !value.as_bool()),
      TYPE_TEST("mapping", value.is_dict()),
      TYPE_TEST("iterable",
                value.is_list() || value.is_dict() || value.is_string() || value.is_undefined()),
      TYPE_TEST("sequence",
                value.is_list() || value.is_dict() || value.is_string() || value.is_undefined()),
      TYPE_TEST("callable", value.is_callable()),
      TYPE_TEST("lower", value.is_string() && ascii_lower(value.as_string()) == value.as_string()),
      TYPE_TEST("upper", value.is_string() && ascii_upper(value.as_string()) == value.as_string()),
      TYPE_TEST("odd", value.is_number() && !value.is_float() && value.as_int() % 2 != 0),
      TYPE_TEST("even", value.is_number() && !value.is_float() && value.as_int() % 2 == 0),
      COMPARE_TEST("equalto", "=="),
      COMPARE_TEST("eq", "=="),
      COMPARE_TEST("==", "=="),
      COMPARE_TEST("ne", "!="),
      COMPARE_TEST("!=", "!="),
      COMPARE_TEST("lt", "<"),
      COMPARE_TEST("lessthan", "<"),
      COMPARE_TEST("<", "<"),
      COMPARE_TEST("gt", ">"),
      COMPARE_TEST("greaterthan", ">"),
      COMPARE_TEST(">", ">"),
      COMPARE_TEST("le", "<="),
      COMPARE_TEST("<=", "<="),
      COMPARE_TEST("ge", ">="),
      COMPARE_TEST(">=", ">="),
      {"divisibleby",
       [](Interpreter&, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("divisibleby", arguments, {"num"});
         if (!bound[0] || !bound[0]->is_number() || !value.is_number()) {
           throw Error("divisibleby: numbers only");
         }
         if (bound[0]->as_double() == 0) throw Error("divisibleby: division by zero");
         return std::fmod(value.as_double(), bound[0]->as_double()) == 0;
       }},
      {"in",
       [](Interpreter&, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("in", arguments, {"seq"});
         Value container = bound[0].value_or(Value());
         if (container.is_string()) {
           return value.is_string() &&
                  container.as_string().find(value.as_string()) != std::string::npos;
         }
         if (container.is_dict())
           return value.is_string() && container.as_dict().find(value.as_string());
         for (const Value& item : iterate(container)) {
           if (values_equal(item, value)) return true;
         }
         return false;
       }},
      {"sameas",
       [](Interpreter&, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("sameas", arguments, {"other"});
         Value other = bound[0].value_or(Value());
         // `is` identity: only the singletons and shared objects can be the same
         if (value.is_none() || other.is_none()) return value.is_none() && other.is_none();
         if (value.is_bool() || other.is_bool()) {
           return value.is_bool() && other.is_bool() && value.as_bool() == other.as_bool();
         }
         return values_equal(value, other);
       }},
  };
  return table;
}

#undef TYPE_TEST
#undef COMPARE_TEST

}  // namespace

bool has_test(std::string_view name) { return tests().count(std::string(name)) > 0; }

bool apply_test(Interpreter& interpreter, const std::string& name, const Value& operand,
                CallArguments& arguments) {
  return tests().at(name)(interpreter, operand, arguments);
}

}  // namespace pagedattn::jinja
