// Jinja2's built-in filters, with the signatures and defaults of Jinja2 3.1, and the
// `tojson` that transformers installs in their place (json.dumps with ensure_ascii=False, keys in
// insertion order, an optional indent). Filters on undefined behave as Jinja2's: string filters
// see "", length sees 0, iteration sees nothing; `default` replaces it.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace pagedattn::jinja {
namespace {

using Filter = Value (*)(Interpreter&, const Value&, CallArguments&);
using Bound = std::vector<std::optional<Value>>;

bool flag(const std::optional<Value>& value, bool fallback) {
  return value ? value->truthy() : fallback;
}

// A dotted attribute path ("a.b", "0") as the filters with attribute= resolve it.
Value attribute_path(Interpreter& interpreter, const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    current = interpreter.get_item(
        current, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Value item_key(Interpreter& interpreter, const Value& item, const std::optional<Value>& attribute,
               bool case_sensitive) {
  Value key = attribute ? attribute_path(interpreter, item, to_str(*attribute)) : item;
  if (!case_sensitive && key.is_string()) return Value(ascii_lower(key.as_string()));
  return key;
}

Value length(Interpreter&, const Value& value, CallArguments& arguments) {
  bind_arguments("length", arguments, {});
  switch (value.type()) {
    case Value::Type::kUndefined:
      return Value(0);
    case Value::Type::kString:
      return Value(static_cast<int64_t>(code_point_count(value.as_string())));
    case Value::Type::kList:
      return Value(static_cast<int64_t>(value.as_list().size()));
    case Value::Type::kDict:
      return Value(static_cast<int64_t>(value.as_dict().entries.size()));
    default:
      throw Error(fmt::format("object of type '{}' has no len()", value.type_name()));
  }
}

Value tojson(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound =
      bind_arguments("tojson", arguments, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (flag(bound[0], false)) throw Error("tojson: ensure_ascii=True is not supported");
  JsonOptions options;
  if (bound[1] && !bound[1]->is_none()) {
    if (bound[1]->is_string()) throw Error("tojson: a string indent is not supported");
    options.indent = static_cast<int>(bound[1]->as_int());
    options.item_separator = ",";  // json.dumps' default once indent is given
  }
  if (bound[2] && !bound[2]->is_none()) {
    const List parts = iterate(*bound[2]);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      throw Error("tojson: separators must be a pair of strings");
    }
    options.item_separator = parts[0].as_string();
    options.key_separator = parts[1].as_string();
  }
  options.sort_keys = flag(bound[3], false);
  return Value(to_json_text(value, options));
}

Value default_filter(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("default", arguments, {"default_value", "boolean"});
  bool replace = flag(bound[1], false) ? !value.truthy() : value.is_undefined();
  return replace ? bound[0].value_or(Value("")) : value;
}

Value join(Interpreter& interpreter, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("join", arguments, {"d", "attribute"});
  std::string separator = bound[0] ? to_str(*bound[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(value)) {
    if (!first) out += separator;
    out += to_str(bound[1] ? attribute_path(interpreter, item, to_str(*bound[1])) : item);
    first = false;
  }
  return Value(std::move(out));
}

Value first_or_last(const Value& value, bool last) {
  List items = iterate(value);
  if (items.empty()) {
    return Value::undefined(last ? "No last item, sequence was empty."
                                 : "No first item, sequence was empty.");
  }
  return last ? items.back() : items.front();
}

Value int_filter(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("int", arguments, {"default", "base"});
  Value fallback = bound[0].value_or(Value(0));
  if (value.is_bool() || value.is_int()) return Value(value.as_int());
  if (value.is_float()) return Value(static_cast<int64_t>(value.as_double()));
  if (value.is_string()) {
    std::string text = python_strip(value.as_string(), std::nullopt, true, true);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    int base = bound[1] ? static_cast<int>(bound[1]->as_int()) : 10;
    try {
      size_t used = 0;
      int64_t number = std::stoll(text, &used, base);
      if (used == text.size()) return Value(number);
    } catch (const std::exception&) {
    }
    try {  // Jinja2 falls back to int(float(value))
      size_t used = 0;
      double number = std::stod(text, &used);
      if (used == text.size() && std::isfinite(number)) return Value(static_cast<int64_t>(number));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value float_filter(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("float", arguments, {"default"});
  if (value.is_number()) return Value(value.as_double());
  if (value.is_string()) {
    std::string text = python_strip(value.as_string(), std::nullopt, true, true);
    try {
      size_t used = 0;
      double number = std::stod(text, &used);
      if (used == text.size()) return Value(number);
    } catch (const std::exception&) {
    }
  }
  return bound[0].value_or(Value(0.0));
}

Value round_filter(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("round", arguments, {"precision", "method"});
  int64_t precision = bound[0] ? bound[0]->as_int() : 0;
  std::string method = bound[1] ? to_str(*bound[1]) : "common";
  if (!value.is_number())
    throw Error(fmt::format("round: a number is required, got {}", value.type_name()));
  double number = value.as_double();
  if (method == "ceil" || method == "floor") {
    double scale = std::pow(10.0, static_cast<double>(precision));
    double scaled = method == "ceil" ? std::ceil(number * scale) : std::floor(number * scale);
    return Value(scaled / scale);
  }
  if (method != "common") throw Error("round: method must be 'common', 'ceil' or 'floor'");
  if (!value.is_float() && precision >= 0) return Value(value.as_int());  // Python: int stays int
  if (precision < 0 || precision > 300) throw Error("round: precision must be 0 .. 300");
  // Python's round(): correctly rounded, halves to even; printf's %.*f rounds the same way.
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(precision), number);
  return Value(std::stod(buffer));
}

Value sort_filter(Interpreter& interpreter, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("sort", arguments, {"reverse", "case_sensitive", "attribute"});
  bool reverse = flag(bound[0], false);
  bool case_sensitive = flag(bound[1], false);
  List items = iterate(value);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    keyed.emplace_back(item_key(interpreter, item, bound[2], case_sensitive), item);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? values_less(b.first, a.first) : values_less(a.first, b.first);
  });
  List out;
  for (auto& entry : keyed) out.push_back(std::move(entry.second));
  return Value(std::move(out));
}

Value unique_filter(Interpreter& interpreter, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("unique", arguments, {"case_sensitive", "attribute"});
  List out, seen;
  for (const Value& item : iterate(value)) {
    Value key = item_key(interpreter, item, bound[1], flag(bound[0], false));
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value& v) { return values_equal(v, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value(std::move(out));
}

Value min_max(Interpreter& interpreter, const Value& value, CallArguments& arguments, bool max) {
  Bound bound = bind_arguments(max ? "max" : "min", arguments, {"case_sensitive", "attribute"});
  List items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = item_key(interpreter, items[0], bound[1], flag(bound[0], false));
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = item_key(interpreter, items[i], bound[1], flag(bound[0], false));
    if (max ? values_less(best_key, key) : values_less(key, best_key)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

// select / reject / selectattr / rejectattr: keep the items whose (attribute) passes the test.
Value select_items(Interpreter& interpreter, const Value& value, CallArguments& arguments,
                   bool by_attribute, bool keep_if) {
  std::vector<Value> rest = arguments.positional;
  std::optional<std::string> attribute;
  if (by_attribute) {
    if (rest.empty()) throw Error("selectattr / rejectattr need an attribute");
    attribute = to_str(rest.front());
    rest.erase(rest.begin());
  }
  std::optional<std::string> test;
  if (!rest.empty()) {
    test = to_str(rest.front());
    rest.erase(rest.begin());
    if (!has_test(*test)) throw Error(fmt::format("No test named '{}'.", *test));
  }
  List out;
  for (const Value& item : iterate(value)) {
    Value subject = attribute ? attribute_path(interpreter, item, *attribute) : item;
    bool passed;
    if (test) {
      CallArguments test_arguments{rest, arguments.keyword};
      passed = apply_test(interpreter, *test, subject, test_arguments);
    } else {
      passed = subject.truthy();
    }
    if (passed == keep_if) out.push_back(item);
  }
  return Value(std::move(out));
}

Value map_filter(Interpreter& interpreter, const Value& value, CallArguments& arguments) {
  List out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [name, argument] : arguments.keyword) {
    if (name == "attribute")
      attribute = &argument;
    else if (name == "default")
      fallback = &argument;
  }
  if (attribute != nullptr) {
    for (const Value& item : iterate(value)) {
      Value mapped = attribute_path(interpreter, item, to_str(*attribute));
      out.push_back(mapped.is_undefined() && fallback != nullptr ? *fallback : mapped);
    }
    return Value(std::move(out));
  }
  if (arguments.positional.empty()) throw Error("map: give a filter name or attribute=");
  std::string filter = to_str(arguments.positional[0]);
  if (!has_filter(filter)) throw Error(fmt::format("No filter named '{}'.", filter));
  CallArguments rest{
      std::vector<Value>(arguments.positional.begin() + 1, arguments.positional.end()),
      arguments.keyword};
  for (const Value& item : iterate(value)) {
    CallArguments copy = rest;
    out.push_back(apply_filter(interpreter, filter, item, copy));
  }
  return Value(std::move(out));
}

Value indent_filter(Interpreter&, const Value& value, CallArguments& arguments) {
  Bound bound = bind_arguments("indent", arguments, {"width", "first", "blank"});
  std::string indentation = !bound[0]               ? "    "
                            : bound[0]->is_string() ? bound[0]->as_string()
                                                    : std::string(bound[0]->as_int(), ' ');
  std::vector<std::string> lines = python_splitlines(to_str(value) + "\n");
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (flag(bound[2], false) || !lines[i].empty()) out += indentation;
    out += lines[i];
  }
  if (flag(bound[1], false)) out = indentation + out;
  return Value(std::move(out));
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Jinja2's title filter: a word starts after a run of whitespace, '-', '(', '{', '[' or '<'.
std::string jinja_title(const std::string& text) {
  std::string out = text;
  bool word_start = true;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      word_start = true;
      continue;
    }
    c = static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
    word_start = false;
  }
  return out;
}

// Jinja2 counts the matches of \w+. Python's \w is Unicode's letters, digits and '_'; without
// Unicode tables this approximates it: ASCII alphanumerics, and every other code point except
// the punctuation and symbol blocks (Latin-1 signs, general punctuation, arrows and symbols,
// CJK punctuation, fullwidth punctuation, emoji).
bool is_word_code_point(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  if (c < 0xC0)
    return c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA ||
           (c >= 0xBC && c <= 0xBE);
  if (c == 0xD7 || c == 0xF7) return false;
  if (c >= 0x2000 && c <= 0x206F) return false;
  if (c >= 0x2190 && c <= 0x2BFF) return false;
  if (c >= 0x3000 && c <= 0x303F) return false;
  if ((c >= 0xFF00 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) ||
      (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65)) {
    return false;
  }
  if (c >= 0x1F000 && c <= 0x1FAFF) return false;
  return true;
}

int64_t word_count(const std::string& text) {
  int64_t count = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(text)) {
    bool word = is_word_code_point(c);
    count += word && !in_word;
    in_word = word;
  }
  return count;
}

#define STRING_FILTER(name, expression)                                             \
  {                                                                                 \
    name, [](Interpreter&, const Value& value, CallArguments& arguments) -> Value { \
      bind_arguments(name, arguments, {});                                          \
      const std::string text = to_str(value);                                       \
      return Value(expression);                                                     \
    }                                                                               \
  }

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> table = {
      {"length", length},
      {"count", length},
      {"tojson", tojson},
      {"default", default_filter},
      {"d", default_filter},
      {"join", join},
      {"int", int_filter},
      {"float", float_filter},
      {"round", round_filter},
      {"sort", sort_filter},
      {"unique", unique_filter},
      {"map", map_filter},
      {"indent", indent_filter},
      STRING_FILTER("upper", ascii_upper(text)),
      STRING_FILTER("lower", ascii_lower(text)),
      STRING_FILTER("capitalize", python_capitalize(text)),
      STRING_FILTER("title", jinja_title(text)),
      STRING_FILTER("string", text),
      STRING_FILTER("escape", html_escape(text)),
      STRING_FILTER("e", html_escape(text)),
      STRING_FILTER("wordcount", word_count(text)),
      {"safe", [](Interpreter&, const Value& value, CallArguments&) { return value; }},
      {"trim",
       [](Interpreter&, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("trim", arguments, {"chars"});
         std::optional<std::string> chars;
         if (bound[0] && !bound[0]->is_none()) chars = to_str(*bound[0]);
         return Value(python_strip(to_str(value), chars, true, true));
       }},
      {"replace",
       [](Interpreter&, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("replace", arguments, {"old", "new", "count"});
         if (!bound[0] || !bound[1]) throw Error("replace: needs old and new");
         int64_t count = bound[2] && !bound[2]->is_none() ? bound[2]->as_int() : -1;
         return Value(python_replace(to_str(value), to_str(*bound[0]), to_str(*bound[1]), count));
       }},
      {"first", [](Interpreter&, const Value& value,
                   CallArguments&) { return first_or_last(value, false); }},
      {"last",
       [](Interpreter&, const Value& value, CallArguments&) { return first_or_last(value, true); }},
      {"list",
       [](Interpreter&, const Value& value, CallArguments&) { return Value(iterate(value)); }},
      {"items",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         if (value.is_undefined()) return Value(List{});
         if (!value.is_dict())
           throw Error(fmt::format("items: expected a dict, got {}", value.type_name()));
         return interpreter.call(*bound_method(value, "items"), arguments);
       }},
      {"reverse",
       [](Interpreter&, const Value& value, CallArguments&) {
         if (value.is_string()) {
           std::vector<char32_t> characters = decode_utf8(value.as_string());
           std::reverse(characters.begin(), characters.end());
           return Value(encode_utf8(characters));
         }
         List items = iterate(value);
         std::reverse(items.begin(), items.end());
         return Value(std::move(items));
       }},
      {"abs",
       [](Interpreter&, const Value& value, CallArguments&) {
         if (value.is_float()) return Value(std::fabs(value.as_double()));
         if (value.is_number()) return Value(static_cast<int64_t>(std::llabs(value.as_int())));
         throw Error(fmt::format("bad operand type for abs(): '{}'", value.type_name()));
       }},
      {"sum",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         Bound bound = bind_arguments("sum", arguments, {"attribute", "start"});
         Value total = bound[1].value_or(Value(0));
         for (const Value& item : iterate(value)) {
           Value term = bound[0] ? attribute_path(interpreter, item, to_str(*bound[0])) : item;
           if (!term.is_number() || !total.is_number()) throw Error("sum: numbers only");
           total = total.is_float() || term.is_float() ? Value(total.as_double() + term.as_double())
                                                       : Value(total.as_int() + term.as_int());
         }
         return total;
       }},
      {"min",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return min_max(interpreter, value, arguments, false);
       }},
      {"max",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return min_max(interpreter, value, arguments, true);
       }},
      {"select",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return select_items(interpreter, value, arguments, false, true);
       }},
      {"reject",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return select_items(interpreter, value, arguments, false, false);
       }},
      {"selectattr",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return select_items(interpreter, value, arguments, true, true);
       }},
      {"rejectattr",
       [](Interpreter& interpreter, const Value& value, CallArguments& arguments) {
         return select_items(interpreter, value, arguments, true, false);
       }},
  };
  return table;
}

#undef STRING_FILTER

}  // namespace

bool has_filter(std::string_view name) { return filters().count(std::string(name)) > 0; }

Value apply_filter(Interpreter& interpreter, const std::string& name, const Value& operand,
                   CallArguments& arguments) {
  return filters().at(name)(interpreter, operand, arguments);
}

}  // namespace pagedattn::jinja
