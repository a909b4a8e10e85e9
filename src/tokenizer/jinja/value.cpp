// Value: truthiness, Python's str() / repr(), json.dumps as transformers' tojson calls it,
// equality and ordering, and the conversion from and to JSON. See value.h.
#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "pagedattn/error.h"

namespace pagedattn::jinja {

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (type()) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return as_bool();
    case Type::kInt:
      return as_int() != 0;
    case Type::kFloat:
      return as_double() != 0.0;
    case Type::kString:
      return !as_string().empty();
    case Type::kList:
      return !as_list().empty();
    case Type::kDict:
      return !as_dict().entries.empty();
    case Type::kNamespace:
    case Type::kCallable:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type()) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return "list";
    case Type::kDict:
      return "dict";
    case Type::kNamespace:
      return "Namespace";
    case Type::kCallable:
      return "function";
  }
  return "?";
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [name, value] : entries) {
    if (name == key) return &value;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [name, existing] : entries) {
    if (name == key) {
      existing = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest round-trip digits, then Python's layout: positional for exponents -4 .. 15,
  // scientific (at least two exponent digits) outside, and always a ".0" on integral values.
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  size_t e_pos = scientific.find('e');
  std::string mantissa = scientific.substr(0, e_pos);
  int exponent = std::stoi(scientific.substr(e_pos + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

namespace {

std::string python_string_repr(const std::string& text) {
  bool has_single = text.find('\'') != std::string::npos;
  bool has_double = text.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(quote))
      out += std::string("\\") + quote;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  out += quote;
  return out;
}

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  out += '"';
}

void append_json(std::string& out, const Value& value, const JsonOptions& options, int depth) {
  auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(*options.indent) * level, ' ');
  };
  const std::string& item_separator = options.item_separator;
  switch (value.type()) {
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(value.as_int());
      return;
    case Value::Type::kFloat: {
      double number = value.as_double();
      if (std::isnan(number))
        out += "NaN";
      else if (std::isinf(number))
        out += number > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(number);
      return;
    }
    case Value::Type::kString:
      append_json_string(out, value.as_string());
      return;
    case Value::Type::kList: {
      const List& list = value.as_list();
      if (list.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += item_separator;
        if (options.indent) newline(depth + 1);
        append_json(out, list[i], options, depth + 1);
      }
      if (options.indent) newline(depth);
      out += ']';
      return;
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      if (value.is_namespace()) {
        throw Error("tojson: Object of type Namespace is not JSON serializable");
      }
      const Dict& dict = value.as_dict();
      if (dict.entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : dict.entries) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        if (options.indent) newline(depth + 1);
        append_json_string(out, entries[i]->first);
        out += options.key_separator;
        append_json(out, entries[i]->second, options, depth + 1);
      }
      if (options.indent) newline(depth);
      out += '}';
      return;
    }
    case Value::Type::kUndefined:
    case Value::Type::kCallable:
      throw Error(
          fmt::format("tojson: Object of type {} is not JSON serializable", value.type_name()));
  }
}

}  // namespace

std::string to_repr(const Value& value) {
  switch (value.type()) {
    case Value::Type::kString:
      return python_string_repr(value.as_string());
    case Value::Type::kList: {
      std::string out = value.is_tuple() ? "(" : "[";
      const List& list = value.as_list();
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += ", ";
        out += to_repr(list[i]);
      }
      if (value.is_tuple()) return out + (list.size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Type::kDict: {
      std::string out = "{";
      const Dict& dict = value.as_dict();
      for (size_t i = 0; i < dict.entries.size(); ++i) {
        if (i > 0) out += ", ";
        out += python_string_repr(dict.entries[i].first) + ": " + to_repr(dict.entries[i].second);
      }
      return out + "}";
    }
    default:
      return to_str(value);
  }
}

std::string to_str(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "";
    case Value::Type::kNone:
      return "None";
    case Value::Type::kBool:
      return value.as_bool() ? "True" : "False";
    case Value::Type::kInt:
      return std::to_string(value.as_int());
    case Value::Type::kFloat:
      return float_repr(value.as_double());
    case Value::Type::kString:
      return value.as_string();
    case Value::Type::kNamespace:
      return "<Namespace>";
    case Value::Type::kCallable:
      return "<function " + value.as_callable().name + ">";
    default:
      return to_repr(value);
  }
}

std::string to_json_text(const Value& value, const JsonOptions& options) {
  std::string out;
  append_json(out, value, options, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t number = json.get<uint64_t>();
      if (number > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(number));
      return Value(static_cast<int64_t>(number));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      list.reserve(json.size());
      for (const auto& element : json) list.push_back(from_json(element));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      dict->entries.reserve(json.size());
      for (const auto& [key, element] : json.items()) dict->set(key, from_json(element));
      return Value(std::shared_ptr<const Dict>(std::move(dict)));
    }
    default:
      return Value::none();  // binary and discarded values do not come from JSON text
  }
}

nlohmann::ordered_json to_json(const Value& value) {
  switch (value.type()) {
    case Value::Type::kBool:
      return value.as_bool();
    case Value::Type::kInt:
      return value.as_int();
    case Value::Type::kFloat:
      return value.as_double();
    case Value::Type::kString:
      return value.as_string();
    case Value::Type::kList: {
      auto array = nlohmann::ordered_json::array();
      for (const Value& element : value.as_list()) array.push_back(to_json(element));
      return array;
    }
    case Value::Type::kDict: {
      auto object = nlohmann::ordered_json::object();
      for (const auto& [key, element] : value.as_dict().entries) object[key] = to_json(element);
      return object;
    }
    default:
      return nullptr;
  }
}

bool values_equal(const Value& left, const Value& right) {
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float()) return left.as_double() == right.as_double();
    return left.as_int() == right.as_int();
  }
  if (left.type() != right.type()) return false;
  switch (left.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return left.as_string() == right.as_string();
    case Value::Type::kList: {
      const List& a = left.as_list();
      const List& b = right.as_list();
      if (a.size() != b.size() || left.is_tuple() != right.is_tuple()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!values_equal(a[i], b[i])) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      const Dict& a = left.as_dict();
      const Dict& b = right.as_dict();
      if (a.entries.size() != b.entries.size()) return false;
      for (const auto& [key, element] : a.entries) {
        const Value* other = b.find(key);
        if (other == nullptr || !values_equal(element, *other)) return false;
      }
      return true;
    }
    case Value::Type::kNamespace:
      return &left.as_namespace() == &right.as_namespace();
    case Value::Type::kCallable:
      return &left.as_callable() == &right.as_callable();
    default:
      return false;
  }
}

bool values_less(const Value& left, const Value& right) {
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float()) return left.as_double() < right.as_double();
    return left.as_int() < right.as_int();
  }
  if (left.is_string() && right.is_string()) {
    // UTF-8 byte order is code point order, which is Python's string order.
    return left.as_string() < right.as_string();
  }
  if (left.is_list() && right.is_list()) {
    const List& a = left.as_list();
    const List& b = right.as_list();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!values_equal(a[i], b[i])) return values_less(a[i], b[i]);
    }
    return a.size() < b.size();
  }
  throw Error(fmt::format("'<' not supported between instances of '{}' and '{}'", left.type_name(),
                          right.type_name()));
}

std::vector<char32_t> decode_utf8(std::string_view text) {
  // Lenient: a byte that does not start a complete sequence is read as the code point of its
  // value (Latin-1), never an error: template data comes from JSON, which is valid UTF-8.
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    int length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || i + length > text.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    char32_t code_point = length == 1 ? c : c & (0x7f >> length);
    for (int k = 1; k < length; ++k) {
      code_point = (code_point << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    }
    out.push_back(code_point);
    i += length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

std::string encode_utf8(const std::vector<char32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t code_point : code_points) append_utf8(out, code_point);
  return out;
}

size_t code_point_count(std::string_view text) {
  size_t count = 0;
  for (char c : text) count += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return count;
}

}  // namespace pagedattn::jinja
