// The chat endpoint's conversation fields: `messages` (system / developer / user / assistant with
// tool_calls / tool), `tools`, `tool_choice` and `parallel_tool_calls`, read and validated into
// what the text front renders and how the output is parsed. Each failure is a FieldError naming
// the field (`messages[3].tool_calls[0].function.arguments`, `tools[2].function.name`). Internal
// to the server layer.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "fields.h"
#include "pagedattn/server_protocol.h"

namespace pagedattn::server::detail {

struct ChatInput {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // null, or the validated tool list in the client's key order
  // How the output is parsed: the server's format when tools are given and tool_choice is
  // "auto"; kNone otherwise.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  bool parallel_tool_calls = true;
};

// `request`: the parsed `body` (its second, order-preserving parse is done here if needed).
ChatInput read_chat_input(const Json& request, std::string_view body, const ParseContext& context);

}  // namespace pagedattn::server::detail
