// The evaluator's expressions (see interpreter.h): Values with Python's semantics for operators,
// truthiness and comparison, and attribute lookup as Jinja2's sandbox does it (obj.name: a method
// of obj, else the item; obj[key]: the item, else the method).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "jinja/builtins.h"
#include "jinja/errors.h"
#include "jinja/interpreter.h"

namespace pagedattn::jinja {
namespace {

// Python's integers do not overflow; these are 64-bit, so an overflow is an error, not a wrap.
template <typename Operation>
int64_t checked(Operation operation, int64_t a, int64_t b) {
  int64_t result = 0;
  if (operation(a, b, &result)) throw Error("integer overflow (this engine's integers are 64-bit)");
  return result;
}
bool add_overflows(int64_t a, int64_t b, int64_t* result) {
  return __builtin_add_overflow(a, b, result);
}
bool sub_overflows(int64_t a, int64_t b, int64_t* result) {
  return __builtin_sub_overflow(a, b, result);
}
bool mul_overflows(int64_t a, int64_t b, int64_t* result) {
  return __builtin_mul_overflow(a, b, result);
}

Value slice(const Value& object, const Value& start_value, const Value& stop_value,
            const Value& step_value) {
  auto index = [](const Value& value, const char* what) -> std::optional<int64_t> {
    if (value.is_undefined() || value.is_none()) return std::nullopt;
    if (!value.is_int() && !value.is_bool()) {
      throw Error(
          fmt::format("slice {} must be an integer or none, got {}", what, value.type_name()));
    }
    return value.as_int();
  };
  int64_t step = index(step_value, "step").value_or(1);
  if (step == 0) throw Error("slice step cannot be zero");
  auto select = [&](int64_t length, auto&& take) {
    auto clamp = [&](std::optional<int64_t> bound, int64_t fallback) {
      if (!bound) return fallback;
      int64_t i = *bound < 0 ? *bound + length : *bound;
      if (step > 0) return std::clamp<int64_t>(i, 0, length);
      return std::clamp<int64_t>(i, -1, length - 1);
    };
    int64_t first = clamp(index(start_value, "start"), step > 0 ? 0 : length - 1);
    int64_t last = clamp(index(stop_value, "stop"), step > 0 ? length : -1);
    for (int64_t i = first; step > 0 ? i < last : i > last; i += step) take(i);
  };
  if (object.is_string()) {
    std::vector<char32_t> characters = decode_utf8(object.as_string());
    std::vector<char32_t> out;
    select(static_cast<int64_t>(characters.size()),
           [&](int64_t i) { out.push_back(characters[i]); });
    return Value(encode_utf8(out));
  }
  if (object.is_list()) {
    const List& list = object.as_list();
    List out;
    select(static_cast<int64_t>(list.size()), [&](int64_t i) { out.push_back(list[i]); });
    return Value(std::move(out));
  }
  if (object.is_undefined()) fail_undefined(object);
  throw Error(fmt::format("{} is not subscriptable", type_object(object)));
}

Value python_modulo(const Value& left, const Value& right) {
  if (left.is_float() || right.is_float()) {
    double divisor = right.as_double();
    if (divisor == 0.0) throw Error("float modulo by zero");
    double result = std::fmod(left.as_double(), divisor);
    if (result != 0.0 && (result < 0) != (divisor < 0)) result += divisor;
    return Value(result);
  }
  int64_t divisor = right.as_int();
  if (divisor == 0) throw Error("integer modulo by zero");
  int64_t result = left.as_int() % divisor;
  if (result != 0 && (result < 0) != (divisor < 0)) result += divisor;
  return Value(result);
}

}  // namespace

// ---- expressions ----

void Interpreter::evaluate_arguments(const Expression& expression, size_t first,
                                     CallArguments& arguments) {
  for (size_t i = first; i < expression.children.size(); ++i) {
    arguments.positional.push_back(evaluate(*expression.children[i]));
  }
  for (const auto& [name, value] : expression.keywords) {
    arguments.keyword.emplace_back(name, evaluate(*value));
  }
}

Value Interpreter::call(const Value& callee, CallArguments& arguments) {
  if (callee.is_callable()) return callee.as_callable().function(*this, arguments);
  if (callee.is_undefined()) fail_undefined(callee);
  throw Error(fmt::format("'{}' object is not callable", callee.type_name()));
}

Value Interpreter::get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict()) {
    if (auto method = bound_method(object, name)) return *method;
    if (const Value* value = object.as_dict().find(name)) return *value;
  } else if (object.is_namespace()) {
    if (const Value* value = object.as_namespace().attributes.find(name)) return *value;
  } else if (auto method = bound_method(object, name)) {
    return *method;
  }
  return Value::undefined(fmt::format("{} has no attribute '{}'", type_object(object), name));
}

Value Interpreter::get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict() && key.is_string()) {
    if (const Value* value = object.as_dict().find(key.as_string())) return *value;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t index = key.as_int();
    if (object.is_list()) {
      const List& list = object.as_list();
      int64_t size = static_cast<int64_t>(list.size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return list[index];
    } else {
      std::vector<char32_t> characters = decode_utf8(object.as_string());
      int64_t size = static_cast<int64_t>(characters.size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) {
        std::string character;
        append_utf8(character, characters[index]);
        return Value(std::move(character));
      }
    }
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(fmt::format("{} has no element {}", type_object(object), to_repr(key)));
}

Value Interpreter::evaluate(const Expression& expression) {
  LocationGuard guard(location_, expression.location);
  using Kind = Expression::Kind;
  switch (expression.kind) {
    case Kind::kLiteral:
      return expression.literal;
    case Kind::kName:
      return lookup(expression.name);
    case Kind::kList:
    case Kind::kTuple: {
      List list;
      list.reserve(expression.children.size());
      for (const ExpressionPtr& child : expression.children) list.push_back(evaluate(*child));
      return expression.kind == Kind::kTuple ? Value::tuple(std::move(list))
                                             : Value(std::move(list));
    }
    case Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (size_t i = 0; i < expression.children.size(); i += 2) {
        Value key = evaluate(*expression.children[i]);
        if (!key.is_string()) {
          throw Error(fmt::format("dict keys must be strings here, got {}", key.type_name()));
        }
        dict->set(key.as_string(), evaluate(*expression.children[i + 1]));
      }
      return Value(std::shared_ptr<const Dict>(std::move(dict)));
    }
    case Kind::kAttribute:
      return get_attribute(evaluate(*expression.children[0]), expression.name);
    case Kind::kSubscript:
      return get_item(evaluate(*expression.children[0]), evaluate(*expression.children[1]));
    case Kind::kSlice: {
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (expression.children[i + 1]) parts[i] = evaluate(*expression.children[i + 1]);
      }
      return slice(evaluate(*expression.children[0]), parts[0], parts[1], parts[2]);
    }
    case Kind::kCall:
      return evaluate_call(expression);
    case Kind::kFilter: {
      Value operand = expression.children[0] ? evaluate(*expression.children[0]) : *filter_input_;
      CallArguments arguments;
      evaluate_arguments(expression, 1, arguments);
      LocationGuard at_filter(location_, expression.location);
      return apply_filter(*this, expression.name, operand, arguments);
    }
    case Kind::kTest: {
      Value operand = evaluate(*expression.children[0]);
      CallArguments arguments;
      evaluate_arguments(expression, 1, arguments);
      LocationGuard at_test(location_, expression.location);
      return Value(apply_test(*this, expression.name, operand, arguments) != expression.negated);
    }
    case Kind::kNegate:
    case Kind::kPositive: {
      Value operand = evaluate(*expression.children[0]);
      if (operand.is_undefined()) fail_undefined(operand);
      if (!operand.is_number()) {
        throw Error(fmt::format("bad operand type for unary {}: '{}'",
                                expression.kind == Kind::kNegate ? '-' : '+', operand.type_name()));
      }
      if (expression.kind == Kind::kPositive)
        return operand.is_bool() ? Value(operand.as_int()) : operand;
      if (operand.is_float()) return Value(-operand.as_double());
      return Value(checked(sub_overflows, 0, operand.as_int()));
    }
    case Kind::kNot:
      return Value(!evaluate(*expression.children[0]).truthy());
    case Kind::kAnd: {
      Value left = evaluate(*expression.children[0]);
      return left.truthy() ? evaluate(*expression.children[1]) : left;
    }
    case Kind::kOr: {
      Value left = evaluate(*expression.children[0]);
      return left.truthy() ? left : evaluate(*expression.children[1]);
    }
    case Kind::kBinary: {
      Value left = evaluate(*expression.children[0]);
      Value right = evaluate(*expression.children[1]);
      LocationGuard at_operator(location_, expression.location);
      return evaluate_binary(expression.name, left, right);
    }
    case Kind::kCompare: {
      Value left = evaluate(*expression.children[0]);
      for (size_t i = 0; i < expression.operators.size(); ++i) {
        Value right = evaluate(*expression.children[i + 1]);
        LocationGuard at_operator(location_, expression.location);
        if (!evaluate_compare(expression.operators[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Kind::kConditional: {
      if (evaluate(*expression.children[1]).truthy()) return evaluate(*expression.children[0]);
      if (expression.children[2]) return evaluate(*expression.children[2]);
      return Value::undefined(
          "the inline if-expression evaluated to false and no else section "
          "was defined.");
    }
  }
  return Value();
}

Value Interpreter::evaluate_call(const Expression& expression) {
  Value callee = evaluate(*expression.children[0]);
  CallArguments arguments;
  evaluate_arguments(expression, 1, arguments);
  LocationGuard at_call(location_, expression.location);
  return call(callee, arguments);
}

Value Interpreter::evaluate_binary(const std::string& op, const Value& left, const Value& right) {
  if (op == "~") return Value(to_str(left) + to_str(right));
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  auto unsupported = [&]() -> Value {
    throw Error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                            left.type_name(), right.type_name()));
  };
  if (left.is_number() && right.is_number()) {
    const bool integers = !left.is_float() && !right.is_float();
    const double a = left.as_double();
    const double b = right.as_double();
    if (op == "+") {
      if (!integers) return Value(a + b);
      return Value(checked(add_overflows, left.as_int(), right.as_int()));
    }
    if (op == "-") {
      if (!integers) return Value(a - b);
      return Value(checked(sub_overflows, left.as_int(), right.as_int()));
    }
    if (op == "*") {
      if (!integers) return Value(a * b);
      return Value(checked(mul_overflows, left.as_int(), right.as_int()));
    }
    if (op == "/") {
      if (b == 0.0) throw Error("division by zero");
      return Value(a / b);
    }
    if (op == "//") {
      if (b == 0.0) throw Error("integer division or modulo by zero");
      if (!integers) return Value(std::floor(a / b));
      int64_t x = left.as_int(), y = right.as_int();
      int64_t quotient = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --quotient;
      return Value(quotient);
    }
    if (op == "%") return python_modulo(left, right);
    if (op == "**") {
      if (integers && right.as_int() >= 0) {
        int64_t base = left.as_int(), power = 1;
        for (int64_t k = 0; k < right.as_int(); ++k) {
          power = checked(mul_overflows, power, base);
        }
        return Value(power);
      }
      return Value(std::pow(a, b));
    }
    return unsupported();
  }
  if (op == "+" && left.is_string() && right.is_string()) {
    return Value(left.as_string() + right.as_string());
  }
  if (op == "+" && left.is_list() && right.is_list()) {
    List joined = left.as_list();
    joined.insert(joined.end(), right.as_list().begin(), right.as_list().end());
    return Value(std::move(joined));
  }
  if (op == "*" && (left.is_string() || left.is_list()) && (right.is_int() || right.is_bool())) {
    int64_t count = std::max<int64_t>(0, right.as_int());
    if (left.is_string()) {
      std::string repeated;
      for (int64_t k = 0; k < count; ++k) repeated += left.as_string();
      return Value(std::move(repeated));
    }
    List repeated;
    for (int64_t k = 0; k < count; ++k) {
      repeated.insert(repeated.end(), left.as_list().begin(), left.as_list().end());
    }
    return Value(std::move(repeated));
  }
  if (op == "*" && (right.is_string() || right.is_list()) && (left.is_int() || left.is_bool())) {
    return evaluate_binary(op, right, left);
  }
  if (op == "+" && left.is_string()) {
    throw Error(fmt::format("can only concatenate str (not \"{}\") to str", right.type_name()));
  }
  return unsupported();
}

bool Interpreter::evaluate_compare(const std::string& op, const Value& left, const Value& right) {
  if (op == "==") return values_equal(left, right);
  if (op == "!=") return !values_equal(left, right);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (right.is_string()) {
      if (!left.is_string()) {
        throw Error(
            fmt::format("'in <string>' requires string as left operand, not {}", left.type_name()));
      }
      found = right.as_string().find(left.as_string()) != std::string::npos;
    } else if (right.is_dict()) {
      found = left.is_string() && right.as_dict().find(left.as_string()) != nullptr;
    } else if (right.is_list()) {
      for (const Value& element : right.as_list()) {
        if (values_equal(left, element)) {
          found = true;
          break;
        }
      }
    } else if (!right.is_undefined()) {
      throw Error(fmt::format("argument of type '{}' is not iterable", right.type_name()));
    }
    return op == "in" ? found : !found;
  }
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  if (op == "<") return values_less(left, right);
  if (op == ">") return values_less(right, left);
  if (op == "<=") return !values_less(right, left);
  if (op == ">=") return !values_less(left, right);
  throw Error(fmt::format("unknown comparison '{}'", op));
}

}  // namespace pagedattn::jinja
