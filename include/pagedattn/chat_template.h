// Chat templates: the Jinja template a model's tokenizer_config.json carries (`chat_template`),
// compiled once and rendered for a conversation exactly as Hugging Face transformers'
// apply_chat_template renders it with Jinja2 (a sandboxed environment with trim_blocks,
// lstrip_blocks, loop controls, its own `tojson`, and the globals `raise_exception` and
// `strftime_now`). The interpreter covers what chat templates use: {{ }}, {% %}, {# #} and
// whitespace control; for (loop.*, break / continue, else, unpacking, `if` filters), if / elif /
// else, set (also block set and namespace attributes), macro / call, filter blocks; Jinja2's
// filters, tests and operators, and the str / dict methods templates call. Undefined values behave
// as Jinja2's default Undefined: empty when printed, false when tested, an error when used further.
//
//   auto chat = pagedattn::ChatTemplate::compile(config["chat_template"]);
//   std::string prompt = chat.render({{"messages", messages}, {"add_generation_prompt", true}});
//
// or, with the context built as apply_chat_template builds it:
//   pagedattn::ChatOptions options = pagedattn::chat_options_from_config(config);
//   options.add_generation_prompt = true;
//   std::string prompt = pagedattn::render_chat(chat, messages, options);
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "pagedattn/error.h"

namespace pagedattn {

// A template that failed to compile or render. what() reads "chat template: line L, column C:
// <reason>"; for raise_exception("...") the reason is the template's own message.
class ChatTemplateError : public Error {
 public:
  ChatTemplateError(int line, int column, std::string reason, bool raised_by_template);
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& reason() const { return reason_; }
  // True when the template called raise_exception(): the conversation was refused by the
  // template (roles that do not alternate, ...), not a defect of the template or the engine.
  bool raised_by_template() const { return raised_by_template_; }

 private:
  int line_;
  int column_;
  std::string reason_;
  bool raised_by_template_;
};

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template; throws ChatTemplateError for a syntax error (unclosed block, unknown tag,
  // unknown filter or test).
  static ChatTemplate compile(std::string source);

  // Renders with the given variables (a JSON object; its key order is kept, as a Python dict's).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& source() const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

// What apply_chat_template passes besides the messages.
struct ChatOptions {
  bool add_generation_prompt = false;
  // Render the conversation up to the end of the last message's content (no end-of-turn after
  // it), so that the model continues that message; as transformers 5's continue_final_message
  // (a sentinel appended to the content, the rendering cut where it comes out).
  bool continue_final_message = false;
  nlohmann::ordered_json tools = nullptr;      // a list of tool schemas, or null
  nlohmann::ordered_json documents = nullptr;  // a list of documents, or null
  // The tokenizer's special tokens (bos_token, eos_token, unk_token, pad_token, ...,
  // additional_special_tokens) and any extra template variables (enable_thinking, ...). Later keys
  // override earlier ones; extra variables override special tokens.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

// The special tokens of a tokenizer_config.json as template variables, as transformers 5 passes
// them (its special_tokens_map): each of bos_token, eos_token, unk_token, sep_token, pad_token,
// cls_token, mask_token that is set, a string or an AddedToken object (its "content").
ChatOptions chat_options_from_config(const nlohmann::json& tokenizer_config);

// The context apply_chat_template builds: messages, tools, documents, add_generation_prompt, then
// the variables; rendered, and cut after the final message for continue_final_message. Throws
// Error for bad arguments, ChatTemplateError from the template.
std::string render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const ChatOptions& options);

}  // namespace pagedattn
