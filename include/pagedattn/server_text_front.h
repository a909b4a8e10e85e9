// The server's TextFront over a real model directory: the tokenizer (tokenizer.json +
// tokenizer_config.json) for encode and single-token bytes, and the model's chat template for
// the chat endpoint, rendered as transformers' apply_chat_template does with the generation
// prompt appended.
//
// A conversation with tool calls reaches the template in the first of three forms it renders
// without error (an error the template raises itself is final): templates disagree on what they
// expect of an assistant message that calls tools:
//   kMapping  content null stays null, function.arguments a mapping: transformers' documented form
//             (Llama 3.1's template prints arguments with tojson);
//   kString   content null, arguments the JSON text the client sent (DeepSeek-V3's template
//             concatenates them as strings and renders calls only when content is none);
//   kVllm     content null becomes "", arguments a mapping: vLLM's form (Qwen3's template tests
//             `'</think>' in content`, which fails on none).
// A conversation without tool calls or null content is rendered once.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

#include "pagedattn/chat_template.h"
#include "pagedattn/server_protocol.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::server {

// `tokenizer` must outlive the front. Reads DIR/tokenizer_config.json for the template's special
// tokens; `chat_template` (a template's source, `serve --chat-template`) replaces the tokenizer's.
// A model without a chat template gets a front whose render_chat throws Error (400).
std::unique_ptr<TextFront> make_text_front(const tokenizer::Tokenizer& tokenizer,
                                           const std::filesystem::path& model_directory,
                                           std::optional<std::string> chat_template = {});

enum class ToolCallForm { kMapping, kString, kVllm };

// The messages as the template sees them: {role, content, name?, tool_calls?: [{id?, type,
// function: {name, arguments}}], tool_call_id (tool)}, in `form`.
nlohmann::ordered_json template_messages(std::span<const ChatMessage> messages, ToolCallForm form);

// render_chat (chat_template.h) of `messages` in the first form that renders; throws the first
// form's ChatTemplateError when none does.
std::string render_chat_forms(const ChatTemplate& chat_template,
                              std::span<const ChatMessage> messages, const ChatOptions& options);

}  // namespace pagedattn::server
