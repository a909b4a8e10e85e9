// Tool calls in a chat model's output: the formats models write them in, and a parser that
// splits generated text into content and calls, fed piece by piece as the text streams.
//
// Formats (vLLM's --tool-call-parser names):
//   hermes       Qwen2.5 / Qwen3 / Hermes: <tool_call>\n{"name": ..., "arguments":
//   {...}}\n</tool_call>,
//                one block per call, text around the blocks is content.
//   llama3_json  Llama 3.1 / 3.2 / 3.3: the whole reply is JSON, {"name": ..., "parameters": {...}}
//                (or "arguments"), calls separated by ';' (<|python_tag|> before them, a special
//                token, never reaches the text). A reply that does not start with '{' is content.
//   deepseek_v3  DeepSeek-V3 / R1: <｜tool▁calls▁begin｜> then per call
//                <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>,
//                then <｜tool▁calls▁end｜>; text before the section is content.
//
// The parser holds back text that may still become a call marker, so no fragment of a marker
// ever comes out as content, and holds each call until its end marker: a call comes out whole
// (name and arguments, the arguments re-serialized as compact JSON) once it is known to be
// valid. A call whose body is not valid JSON (or lacks a name) comes out as content, exactly as
// the model wrote it. Whitespace that only separates content from a call (before a call's start
// marker, after its end marker) is not content. Feeding a text in one piece or split anywhere
// gives the same content and the same calls.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::server {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kDeepSeekV3 };

// "none", "hermes", "llama3_json", "deepseek_v3".
std::string_view tool_call_format_name(ToolCallFormat format);
// The format of a name above; nullopt for any other name.
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);
// What `--tool-call-parser auto` picks: the format the chat template itself writes calls in
// (<tool_call> -> hermes, <｜tool▁calls▁begin｜> -> deepseek_v3, a template with ipython /
// <|python_tag|> and "parameters" -> llama3_json), else the one of the model family
// (config.json's model_type: qwen2 / qwen3 and their MoE -> hermes, deepseek_v3 -> deepseek_v3),
// else kNone.
ToolCallFormat detect_tool_call_format(std::string_view chat_template, std::string_view model_type);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text (compact), as OpenAI's `function.arguments`
};

// One piece of parsed output, in the order the model wrote it: content text or one whole call.
struct ToolCallPiece {
  std::string content;  // when !call
  std::optional<ParsedToolCall> call;
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);

  // The next generated text; the content and calls it completes (possibly none: held back).
  std::vector<ToolCallPiece> push(std::string_view text);
  // The end of the generation: what was held back comes out (an unterminated call that parses
  // is a call, otherwise content).
  std::vector<ToolCallPiece> finish();

  ToolCallFormat format() const { return format_; }

 private:
  enum class State { kContent, kSection, kCall, kLlamaStart, kLlamaCalls, kPlainContent };

  void run(bool at_end, std::vector<ToolCallPiece>& out);
  void emit_content(std::string text, std::vector<ToolCallPiece>& out);
  bool run_markers(bool at_end, std::vector<ToolCallPiece>& out);
  bool run_llama(bool at_end, std::vector<ToolCallPiece>& out);
  // Ends the current call (its body and how it was written); a valid one is emitted as a call,
  // anything else as the raw text it was (deepseek_v3: once its section is known to hold a
  // valid call). Returns whether it was valid.
  bool close_call(const std::string& body, const std::string& raw, std::vector<ToolCallPiece>& out);

  ToolCallFormat format_;
  State state_;
  std::string buffer_;            // text not yet decided
  std::string separator_;         // whitespace held before a marker (content if no call follows)
  std::string section_raw_;       // deepseek_v3: the section's text so far (content if no call)
  std::string section_pending_;   // deepseek_v3: invalid calls before the section's first valid one
  int section_calls_ = 0;         // deepseek_v3: valid calls in the open section
  bool skip_whitespace_ = false;  // after a call: whitespace that only separates is dropped
};

}  // namespace pagedattn::server
