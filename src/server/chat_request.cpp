// read_chat_input (chat_request.h). Messages as OpenAI's API takes them: content a string or an
// array of text parts (null only for an assistant message that makes tool calls), assistant
// tool_calls with `function.arguments` a JSON object as text (an object itself is taken too),
// tool messages with the tool_call_id they answer. The null fields the official clients echo
// back in an assistant message (refusal, function_call, audio) are accepted and ignored.
//
// Tools keep the key order the client wrote (templates print them with tojson, and a Python dict
// keeps its order): the body is parsed a second time, order-preserving, when it has tools or
// tool calls.
#include "chat_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace pagedattn::server::detail {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string spelled(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string message_text(const Json& message, size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    fail(param, fmt::format("'{}': missing (expected a string or an array of text parts)", param),
         "invalid_type");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    fail(param,
         fmt::format("'{}': expected a string or an array of text parts, got {}", param,
                     type_name(*it)),
         "invalid_type");
  }
  std::string text;
  for (size_t part = 0; part < it->size(); ++part) {
    const Json& item = (*it)[part];
    const std::string part_param = fmt::format("{}[{}]", param, part);
    if (!item.is_object()) fail(part_param, fmt::format("'{}': expected an object", part_param));
    const Json* type = find(item, "type");
    if (type == nullptr || !type->is_string() || *type != "text") {
      fail(part_param, fmt::format("'{}': only parts of type \"text\" are supported, got {}",
                                   part_param, type == nullptr ? "none" : spelled(*type)));
    }
    const Json* part_text = find(item, "text");
    if (part_text == nullptr || !part_text->is_string()) {
      fail(part_param + ".text", fmt::format("'{}.text': expected a string", part_param),
           "invalid_type");
    }
    text += part_text->get<std::string>();
  }
  return text;
}

const std::string& string_field(const Json& object, const char* key, const std::string& param,
                                bool non_empty) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    fail(param,
         fmt::format("'{}': expected a string, got {}", param,
                     it == object.end() ? "none" : type_name(*it)),
         it == object.end() ? "missing_required_parameter" : "invalid_type");
  }
  if (non_empty && it->get_ref<const std::string&>().empty()) {
    fail(param, fmt::format("'{}': must not be empty", param));
  }
  return it->get_ref<const std::string&>();
}

std::vector<ChatToolCall> read_tool_calls(const Json& calls, const OrderedJson* ordered,
                                          const std::string& param) {
  if (!calls.is_array()) {
    fail(param, fmt::format("'{}': expected an array, got {}", param, type_name(calls)),
         "invalid_type");
  }
  std::vector<ChatToolCall> result;
  for (size_t j = 0; j < calls.size(); ++j) {
    const Json& call = calls[j];
    const std::string call_param = fmt::format("{}[{}]", param, j);
    if (!call.is_object()) {
      fail(call_param, fmt::format("'{}': expected an object, got {}", call_param, type_name(call)),
           "invalid_type");
    }
    ChatToolCall parsed;
    if (const Json* id = find(call, "id")) {
      if (!id->is_string()) {
        fail(call_param + ".id", fmt::format("'{}.id': expected a string", call_param),
             "invalid_type");
      }
      parsed.id = id->get<std::string>();
    }
    if (const Json* type = find(call, "type"); type != nullptr && *type != "function") {
      fail(call_param + ".type", fmt::format("'{}.type': only \"function\" is supported, got {}",
                                             call_param, spelled(*type)));
    }
    const Json* function = find(call, "function");
    if (function == nullptr || !function->is_object()) {
      fail(call_param + ".function",
           fmt::format("'{}.function': expected an object with name and arguments", call_param),
           "invalid_type");
    }
    parsed.name = string_field(*function, "name", call_param + ".function.name", true);
    const std::string arguments_param = call_param + ".function.arguments";
    const Json* arguments = find(*function, "arguments");
    if (arguments == nullptr) {
      parsed.arguments = "{}";
    } else if (arguments->is_object()) {
      // The client's key order, from the order-preserving parse.
      const OrderedJson& same = (*ordered)[j]["function"]["arguments"];
      parsed.arguments = same.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
    } else if (arguments->is_string()) {
      const std::string& text = arguments->get_ref<const std::string&>();
      const OrderedJson value = OrderedJson::parse(text, nullptr, false);
      if (!text.empty() && (value.is_discarded() || !value.is_object())) {
        fail(arguments_param, fmt::format("'{}': expected a JSON object as a string, got {}",
                                          arguments_param, spelled(*arguments)));
      }
      parsed.arguments = text.empty() ? "{}" : text;
    } else {
      fail(arguments_param,
           fmt::format("'{}': expected a string (a JSON object), got {}", arguments_param,
                       type_name(*arguments)),
           "invalid_type");
    }
    result.push_back(std::move(parsed));
  }
  return result;
}

std::vector<ChatMessage> read_messages(const Json& request, const OrderedJson* ordered) {
  const Json* messages = find(request, "messages");
  if (messages == nullptr) fail("messages", "'messages': required", "missing_required_parameter");
  if (!messages->is_array()) {
    fail("messages", fmt::format("'messages': expected an array, got {}", type_name(*messages)),
         "invalid_type");
  }
  if (messages->empty()) fail("messages", "'messages': must contain at least one message");
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  // Fields besides role / content / name, per role; `echoed`: accepted when null.
  static const std::set<std::string> kEchoed = {"refusal", "function_call", "audio"};
  std::vector<ChatMessage> result;
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!message.is_object()) {
      fail(param, fmt::format("'{}': expected an object, got {}", param, type_name(message)),
           "invalid_type");
    }
    const Json* role = find(message, "role");
    if (role == nullptr || !role->is_string() || !kRoles.contains(role->get<std::string>())) {
      fail(param + ".role",
           fmt::format("'{}.role': expected one of system, developer, user, assistant, tool, "
                       "got {}",
                       param, role == nullptr ? "none" : spelled(*role)));
    }
    ChatMessage parsed;
    parsed.role = role->get<std::string>();
    const bool assistant = parsed.role == "assistant", tool = parsed.role == "tool";
    for (const auto& [key, value] : message.items()) {
      const bool known = key == "role" || key == "content" || key == "name" ||
                         (assistant && key == "tool_calls") ||
                         (assistant && kEchoed.contains(key) && value.is_null()) ||
                         (tool && key == "tool_call_id");
      if (!known) {
        fail(param + "." + key,
             fmt::format("'{}': unrecognized field '{}' (supported: role, content, name{})", param,
                         key,
                         assistant ? ", tool_calls"
                         : tool    ? ", tool_call_id"
                                   : ""),
             "unknown_parameter");
      }
    }
    if (const Json* name = find(message, "name")) {
      if (!name->is_string()) {
        fail(param + ".name", fmt::format("'{}.name': expected a string", param), "invalid_type");
      }
      parsed.name = name->get<std::string>();
    }
    if (assistant) {
      if (const Json* calls = find(message, "tool_calls")) {
        const OrderedJson* ordered_calls =
            ordered != nullptr ? &(*ordered)["messages"][i]["tool_calls"] : nullptr;
        parsed.tool_calls = read_tool_calls(*calls, ordered_calls, param + ".tool_calls");
      }
    }
    if (tool) {
      parsed.tool_call_id = string_field(message, "tool_call_id", param + ".tool_call_id", false);
    }
    if (assistant && !parsed.tool_calls.empty() && find(message, "content") == nullptr) {
      parsed.content_null = true;
    } else {
      parsed.content = message_text(message, i);
    }
    result.push_back(std::move(parsed));
  }
  return result;
}

// Each tool {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}.
void validate_tools(const Json& tools) {
  if (!tools.is_array()) {
    fail("tools", fmt::format("'tools': expected an array, got {}", type_name(tools)),
         "invalid_type");
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!tool.is_object()) {
      fail(param, fmt::format("'{}': expected an object, got {}", param, type_name(tool)),
           "invalid_type");
    }
    const Json* type = find(tool, "type");
    if (type == nullptr || *type != "function") {
      fail(param + ".type", fmt::format("'{}.type': only \"function\" is supported, got {}", param,
                                        type == nullptr ? "none" : spelled(*type)));
    }
    const Json* function = find(tool, "function");
    if (function == nullptr || !function->is_object()) {
      fail(param + ".function", fmt::format("'{}.function': expected an object", param),
           "invalid_type");
    }
    string_field(*function, "name", param + ".function.name", true);
    if (const Json* description = find(*function, "description");
        description != nullptr && !description->is_string()) {
      fail(param + ".function.description",
           fmt::format("'{}.function.description': expected a string", param), "invalid_type");
    }
    if (const Json* parameters = find(*function, "parameters");
        parameters != nullptr && !parameters->is_object()) {
      fail(param + ".function.parameters",
           fmt::format("'{}.function.parameters': expected a JSON Schema object, got {}", param,
                       type_name(*parameters)),
           "invalid_type");
    }
    if (const Json* strict = find(*function, "strict");
        strict != nullptr && !strict->is_boolean()) {
      fail(param + ".function.strict",
           fmt::format("'{}.function.strict': expected a boolean", param), "invalid_type");
    }
  }
}

bool names_tool(const Json& tools, const std::string& name) {
  return std::any_of(tools.begin(), tools.end(),
                     [&](const Json& tool) { return tool["function"]["name"] == name; });
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
// Returns whether the output is to be parsed for calls.
bool read_tool_choice(const Json& request, const Json* tools, const ParseContext& context) {
  const Json* choice = find(request, "tool_choice");
  const bool have_tools = tools != nullptr && !tools->empty();
  std::string mode = have_tools ? "auto" : "none";
  if (choice != nullptr) {
    if (choice->is_string()) {
      mode = choice->get<std::string>();
      if (mode != "none" && mode != "auto" && mode != "required") {
        fail("tool_choice",
             fmt::format("'tool_choice': expected \"none\", \"auto\", \"required\" or "
                         "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                         spelled(*choice)));
      }
    } else if (choice->is_object()) {
      const Json* type = find(*choice, "type");
      const Json* function = find(*choice, "function");
      if (type == nullptr || *type != "function" || function == nullptr || !function->is_object()) {
        fail("tool_choice",
             "'tool_choice': expected {\"type\": \"function\", \"function\": "
             "{\"name\": ...}}");
      }
      const std::string& name = string_field(*function, "name", "tool_choice.function.name", true);
      if (!have_tools || !names_tool(*tools, name)) {
        fail("tool_choice.function.name",
             fmt::format("'tool_choice.function.name': '{}' is not among the request's tools",
                         name));
      }
      fail("tool_choice",
           fmt::format("'tool_choice': forcing the function '{}' needs guided decoding, which "
                       "this server does not have; use \"auto\" (the model chooses) or \"none\"",
                       name));
    } else {
      fail("tool_choice",
           fmt::format("'tool_choice': expected a string or an object, got {}", type_name(*choice)),
           "invalid_type");
    }
  }
  if (mode == "none") return false;
  if (!have_tools) {
    fail("tool_choice", fmt::format("'tool_choice': \"{}\" requires 'tools'", mode));
  }
  if (mode == "required") {
    fail("tool_choice",
         "'tool_choice': \"required\" needs guided decoding, which this server "
         "does not have; use \"auto\" (the model chooses) or \"none\"");
  }
  if (context.tool_call_format == ToolCallFormat::kNone) {
    fail(choice != nullptr ? "tool_choice" : "tools",
         "tool calling (tool_choice \"auto\", the default with tools) needs a tool-call parser, "
         "and the server has none for this model: start it with --tool-call-parser "
         "hermes|llama3_json|deepseek_v3 (or send tool_choice \"none\")");
  }
  return true;
}

}  // namespace

ChatInput read_chat_input(const Json& request, std::string_view body, const ParseContext& context) {
  const Json* tools = find(request, "tools");
  if (tools != nullptr) validate_tools(*tools);
  const std::optional<bool> parallel = read_bool(request, "parallel_tool_calls");
  const bool parse_calls = read_tool_choice(request, tools, context);

  bool has_calls = false;
  if (const Json* messages = find(request, "messages");
      messages != nullptr && messages->is_array()) {
    for (const Json& message : *messages) {
      has_calls = has_calls || (message.is_object() && message.contains("tool_calls"));
    }
  }
  OrderedJson ordered;
  if (has_calls || (tools != nullptr && !tools->empty())) {
    // Parsed before with the depth guard: this parse cannot fail or go deep.
    ordered = OrderedJson::parse(body.begin(), body.end());
  }
  ChatInput input;
  input.messages = read_messages(request, ordered.is_null() ? nullptr : &ordered);
  if (tools != nullptr && !tools->empty()) input.tools = ordered["tools"];
  input.tool_call_format = parse_calls ? context.tool_call_format : ToolCallFormat::kNone;
  input.parallel_tool_calls = parallel.value_or(true);
  return input;
}

}  // namespace pagedattn::server::detail
