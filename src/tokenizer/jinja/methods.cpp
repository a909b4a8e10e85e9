// The methods of Python's str, dict and list that chat templates call (message.content.split(...),
// tool.get('x'), d.items()), the globals (range, namespace, dict, raise_exception, strftime_now),
// argument binding and iteration. Mutating methods (list.append, dict.update, ...) fail the way
// transformers' ImmutableSandboxedEnvironment fails them. Case mapping is ASCII-only.
#include <fmt/format.h>

#include <cctype>
#include <ctime>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/errors.h"
#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace pagedattn::jinja {
namespace {

using Method = Value (*)(const Value& self, CallArguments& arguments);

const std::string& string_argument(const std::optional<Value>& value, std::string_view function,
                                   std::string_view name) {
  if (!value || !value->is_string()) {
    throw Error(fmt::format("{}: argument '{}' must be a string, got {}", function, name,
                            value ? value->type_name() : "nothing"));
  }
  return value->as_string();
}

int64_t int_argument(const std::optional<Value>& value, int64_t fallback) {
  if (!value || value->is_none()) return fallback;
  if (!value->is_int() && !value->is_bool()) {
    throw Error(fmt::format("an integer argument is required, got {}", value->type_name()));
  }
  return value->as_int();
}

// startswith / endswith take a string or a tuple (list) of strings.
bool affix_matches(const Value& self, const std::optional<Value>& affix, bool prefix) {
  const std::string& text = self.as_string();
  auto one = [&](const Value& candidate) {
    if (!candidate.is_string()) {
      throw Error(fmt::format("{} first arg must be str or a tuple of str, not {}",
                              prefix ? "startswith" : "endswith", candidate.type_name()));
    }
    const std::string& a = candidate.as_string();
    return a.size() <= text.size() &&
           (prefix ? text.compare(0, a.size(), a) == 0
                   : text.compare(text.size() - a.size(), a.size(), a) == 0);
  };
  if (!affix) throw Error("startswith / endswith need an argument");
  if (affix->is_list()) {
    for (const Value& candidate : affix->as_list()) {
      if (one(candidate)) return true;
    }
    return false;
  }
  return one(*affix);
}

Value strip_method(const Value& self, CallArguments& arguments, bool left, bool right,
                   const char* name) {
  auto bound = bind_arguments(name, arguments, {"chars"});
  std::optional<std::string> chars;
  if (bound[0] && !bound[0]->is_none()) chars = string_argument(bound[0], name, "chars");
  return Value(python_strip(self.as_string(), chars, left, right));
}

Value split_method(const Value& self, CallArguments& arguments, bool from_right) {
  const char* name = from_right ? "str.rsplit" : "str.split";
  auto bound = bind_arguments(name, arguments, {"sep", "maxsplit"});
  std::optional<std::string> separator;
  if (bound[0] && !bound[0]->is_none()) separator = string_argument(bound[0], name, "sep");
  if (separator && separator->empty()) throw Error(fmt::format("{}: empty separator", name));
  List parts;
  for (std::string& part :
       python_split(self.as_string(), separator, int_argument(bound[1], -1), from_right)) {
    parts.emplace_back(std::move(part));
  }
  return Value(std::move(parts));
}

const std::unordered_map<std::string, Method>& string_methods() {
  static const std::unordered_map<std::string, Method> methods = {
      {"startswith",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.startswith", arguments, {"prefix"});
         return Value(affix_matches(self, bound[0], true));
       }},
      {"endswith",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.endswith", arguments, {"suffix"});
         return Value(affix_matches(self, bound[0], false));
       }},
      {"strip",
       [](const Value& self, CallArguments& arguments) {
         return strip_method(self, arguments, true, true, "str.strip");
       }},
      {"lstrip",
       [](const Value& self, CallArguments& arguments) {
         return strip_method(self, arguments, true, false, "str.lstrip");
       }},
      {"rstrip",
       [](const Value& self, CallArguments& arguments) {
         return strip_method(self, arguments, false, true, "str.rstrip");
       }},
      {"split", [](const Value& self,
                   CallArguments& arguments) { return split_method(self, arguments, false); }},
      {"rsplit", [](const Value& self,
                    CallArguments& arguments) { return split_method(self, arguments, true); }},
      {"splitlines",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("str.splitlines", arguments, {});
         List lines;
         for (std::string& line : python_splitlines(self.as_string())) lines.emplace_back(line);
         return Value(std::move(lines));
       }},
      {"replace",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.replace", arguments, {"old", "new", "count"});
         return Value(python_replace(
             self.as_string(), string_argument(bound[0], "str.replace", "old"),
             string_argument(bound[1], "str.replace", "new"), int_argument(bound[2], -1)));
       }},
      {"upper",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("str.upper", arguments, {});
         return Value(ascii_upper(self.as_string()));
       }},
      {"lower",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("str.lower", arguments, {});
         return Value(ascii_lower(self.as_string()));
       }},
      {"title",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("str.title", arguments, {});
         return Value(python_title(self.as_string()));
       }},
      {"capitalize",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("str.capitalize", arguments, {});
         return Value(python_capitalize(self.as_string()));
       }},
      {"find",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.find", arguments, {"sub"});
         return Value(
             python_find(self.as_string(), string_argument(bound[0], "str.find", "sub"), false));
       }},
      {"rfind",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.rfind", arguments, {"sub"});
         return Value(
             python_find(self.as_string(), string_argument(bound[0], "str.rfind", "sub"), true));
       }},
      {"count",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.count", arguments, {"sub"});
         return Value(
             python_count(self.as_string(), string_argument(bound[0], "str.count", "sub")));
       }},
      {"join",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("str.join", arguments, {"iterable"});
         std::string out;
         bool first = true;
         for (const Value& item : iterate(bound[0].value_or(Value()))) {
           if (!item.is_string()) {
             throw Error(
                 fmt::format("str.join: expected str instance, {} found", item.type_name()));
           }
           if (!first) out += self.as_string();
           out += item.as_string();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"isdigit",
       [](const Value& self, CallArguments&) {
         const std::string& s = self.as_string();
         return Value(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c));
         }));
       }},
      {"isspace",
       [](const Value& self, CallArguments&) {
         const std::string& s = self.as_string();
         return Value(!s.empty() && python_strip(s, std::nullopt, true, true).empty());
       }},
      {"isalpha",
       [](const Value& self, CallArguments&) {
         const std::string& s = self.as_string();
         return Value(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isalpha(static_cast<unsigned char>(c));
         }));
       }},
  };
  return methods;
}

const std::unordered_map<std::string, Method>& dict_methods() {
  static const std::unordered_map<std::string, Method> methods = {
      {"get",
       [](const Value& self, CallArguments& arguments) {
         auto bound = bind_arguments("dict.get", arguments, {"key", "default"});
         if (!bound[0]) throw Error("dict.get expected at least 1 argument, got 0");
         if (bound[0]->is_string()) {
           if (const Value* value = self.as_dict().find(bound[0]->as_string())) return *value;
         }
         return bound[1].value_or(Value::none());
       }},
      {"items",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("dict.items", arguments, {});
         List items;
         for (const auto& [key, value] : self.as_dict().entries) {
           items.push_back(Value::tuple(List{Value(key), value}));
         }
         return Value(std::move(items));
       }},
      {"keys",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("dict.keys", arguments, {});
         List keys;
         for (const auto& entry : self.as_dict().entries) keys.emplace_back(entry.first);
         return Value(std::move(keys));
       }},
      {"values",
       [](const Value& self, CallArguments& arguments) {
         bind_arguments("dict.values", arguments, {});
         List values;
         for (const auto& entry : self.as_dict().entries) values.push_back(entry.second);
         return Value(std::move(values));
       }},
  };
  return methods;
}

bool is_mutating(const Value& object, const std::string& name) {
  static const char* const kList[] = {"append", "extend", "insert", "pop",
                                      "remove", "clear",  "sort",   "reverse"};
  static const char* const kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (object.is_list())
    return std::find(std::begin(kList), std::end(kList), name) != std::end(kList);
  if (object.is_dict())
    return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return false;
}

Value make_callable(std::string name, std::function<Value(Interpreter&, CallArguments&)> function) {
  auto callable = std::make_shared<Callable>();
  callable->name = std::move(name);
  callable->function = std::move(function);
  return Value(std::shared_ptr<const Callable>(std::move(callable)));
}

Value range_function(Interpreter&, CallArguments& arguments) {
  auto bound = bind_arguments("range", arguments, {"start", "stop", "step"});
  if (!bound[0]) throw Error("range expected at least 1 argument, got 0");
  int64_t start = 0, stop = 0, step = int_argument(bound[2], 1);
  if (bound[1]) {
    start = int_argument(bound[0], 0);
    stop = int_argument(bound[1], 0);
  } else {
    stop = int_argument(bound[0], 0);
  }
  if (step == 0) throw Error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) throw Error("range too big, maximum size for range is 100000");
    out.emplace_back(i);
  }
  return Value(std::move(out));
}

Value namespace_function(Interpreter&, CallArguments& arguments) {
  auto ns = std::make_shared<Namespace>();
  for (const Value& positional : arguments.positional) {
    if (!positional.is_dict()) throw Error("namespace() takes a dict or keyword arguments");
    for (const auto& [key, value] : positional.as_dict().entries) ns->attributes.set(key, value);
  }
  for (const auto& [key, value] : arguments.keyword) ns->attributes.set(key, value);
  return Value(ns);
}

Value dict_function(Interpreter&, CallArguments& arguments) {
  auto dict = std::make_shared<Dict>();
  for (const Value& positional : arguments.positional) {
    if (!positional.is_dict()) throw Error("dict() takes a dict or keyword arguments");
    for (const auto& [key, value] : positional.as_dict().entries) dict->set(key, value);
  }
  for (const auto& [key, value] : arguments.keyword) dict->set(key, value);
  return Value(std::shared_ptr<const Dict>(std::move(dict)));
}

Value raise_exception_function(Interpreter& interpreter, CallArguments& arguments) {
  auto bound = bind_arguments("raise_exception", arguments, {"message"});
  raise_from_template(interpreter.location(), bound[0] ? to_str(*bound[0]) : "");
}

Value strftime_now_function(Interpreter&, CallArguments& arguments) {
  auto bound = bind_arguments("strftime_now", arguments, {"format"});
  const std::string& format = string_argument(bound[0], "strftime_now", "format");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string out(format.size() * 4 + 64, '\0');
  size_t written =
      format.empty() ? 0 : std::strftime(out.data(), out.size(), format.c_str(), &local);
  out.resize(written);
  return Value(std::move(out));
}

}  // namespace

std::optional<Value> bound_method(const Value& object, const std::string& name) {
  const std::unordered_map<std::string, Method>* table = nullptr;
  if (object.is_string())
    table = &string_methods();
  else if (object.is_dict())
    table = &dict_methods();
  if (table != nullptr) {
    auto it = table->find(name);
    if (it != table->end()) {
      Method method = it->second;
      return make_callable(object.type_name() + "." + name,
                           [object, method](Interpreter&, CallArguments& arguments) {
                             return method(object, arguments);
                           });
    }
  }
  if (is_mutating(object, name)) {
    std::string type = object.type_name();
    return make_callable(type + "." + name, [name, type](Interpreter&, CallArguments&) -> Value {
      throw Error(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type));
    });
  }
  return std::nullopt;
}

std::optional<Value> global_function(const std::string& name) {
  static const std::unordered_map<std::string, Value> globals = {
      {"range", make_callable("range", range_function)},
      {"namespace", make_callable("namespace", namespace_function)},
      {"dict", make_callable("dict", dict_function)},
      {"raise_exception", make_callable("raise_exception", raise_exception_function)},
      {"strftime_now", make_callable("strftime_now", strftime_now_function)},
  };
  auto it = globals.find(name);
  if (it == globals.end()) return std::nullopt;
  return it->second;
}

std::vector<std::optional<Value>> bind_arguments(std::string_view function,
                                                 const CallArguments& arguments,
                                                 std::initializer_list<std::string_view> names) {
  std::vector<std::optional<Value>> bound(names.size());
  if (arguments.positional.size() > names.size()) {
    throw Error(fmt::format("{}() takes at most {} argument(s) ({} given)", function, names.size(),
                            arguments.positional.size()));
  }
  for (size_t i = 0; i < arguments.positional.size(); ++i) bound[i] = arguments.positional[i];
  for (const auto& [keyword, value] : arguments.keyword) {
    size_t i = 0;
    for (std::string_view name : names) {
      if (name == keyword) break;
      ++i;
    }
    if (i == names.size()) {
      throw Error(fmt::format("{}() got an unexpected keyword argument '{}'", function, keyword));
    }
    bound[i] = value;
  }
  return bound;
}

List iterate(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kList:
      return value.as_list();
    case Value::Type::kDict: {
      List keys;
      for (const auto& entry : value.as_dict().entries) keys.emplace_back(entry.first);
      return keys;
    }
    case Value::Type::kString: {
      List characters;
      for (char32_t c : decode_utf8(value.as_string())) {
        std::string character;
        append_utf8(character, c);
        characters.emplace_back(std::move(character));
      }
      return characters;
    }
    default:
      throw Error(fmt::format("'{}' object is not iterable", value.type_name()));
  }
}

}  // namespace pagedattn::jinja
