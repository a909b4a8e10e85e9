// The tool-call parser (server_tool_calls.h). One small state machine per format family:
//
// - marker formats (hermes, deepseek_v3): content until the start marker; the text that could
//   still become the marker (a suffix of the buffer that is a prefix of it) and the whitespace
//   before it are held back; inside a call everything is held until the end marker; the body is
//   then parsed and comes out as one call, or, invalid, as the raw text (with the whitespace that
//   was held before it). deepseek_v3 wraps its calls in a section whose own markers and the
//   whitespace between calls are dropped.
// - llama3_json: the first non-whitespace character decides: '{' starts calls, anything else
//   makes the whole reply content. Calls are JSON objects found by bracket matching (strings and
//   escapes skipped), separated by ';' and whitespace.
//
// Every decision depends only on text already received plus whether the generation ended, never
// on where the pieces were cut, which is what makes a streamed reply equal a whole one.
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "pagedattn/server_tool_calls.h"

namespace pagedattn::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kDeepSeekSectionStart = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekSectionEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepSeekCallStart = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepSeekSeparator = "<｜tool▁sep｜>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length) {
    if (text.substr(text.size() - length) == marker.substr(0, length)) return length;
  }
  return 0;
}

std::optional<OrderedJson> parse_json(std::string_view text) {
  OrderedJson value = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// Arguments as OpenAI sends them: a JSON object as text. The model may write an object, a
// string holding one, or nothing (no arguments).
std::optional<std::string> arguments_text(const OrderedJson* arguments) {
  if (arguments == nullptr || arguments->is_null()) return std::string("{}");
  if (arguments->is_object()) {
    return arguments->dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  }
  if (arguments->is_string()) {
    std::optional<OrderedJson> inner = parse_json(arguments->get<std::string>());
    if (inner && inner->is_object()) return arguments_text(&*inner);
  }
  return std::nullopt;
}

// {"name": ..., "arguments" | "parameters": {...}}.
std::optional<ParsedToolCall> parse_json_call(std::string_view body) {
  std::optional<OrderedJson> value = parse_json(trim(body));
  if (!value || !value->is_object()) return std::nullopt;
  const auto name = value->find("name");
  if (name == value->end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  const OrderedJson* arguments = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (const auto it = value->find(key); it != value->end()) {
      arguments = &*it;
      break;
    }
  }
  std::optional<std::string> text = arguments_text(arguments);
  if (!text) return std::nullopt;
  return ParsedToolCall{name->get<std::string>(), std::move(*text)};
}

// TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```
std::optional<ParsedToolCall> parse_deepseek_call(std::string_view body) {
  const size_t separator = body.find(kDeepSeekSeparator);
  if (separator == std::string_view::npos) return std::nullopt;
  std::string_view rest = body.substr(separator + kDeepSeekSeparator.size());
  const size_t line_end = rest.find('\n');
  const std::string_view name = trim(rest.substr(0, line_end));
  if (name.empty()) return std::nullopt;
  std::string_view arguments =
      line_end == std::string_view::npos ? std::string_view() : trim(rest.substr(line_end));
  if (arguments.starts_with("```")) {
    arguments.remove_prefix(3);
    if (arguments.starts_with("json")) arguments.remove_prefix(4);
    if (!arguments.ends_with("```")) return std::nullopt;
    arguments.remove_suffix(3);
    arguments = trim(arguments);
  }
  std::optional<std::string> text;
  if (arguments.empty()) {
    text = "{}";
  } else if (std::optional<OrderedJson> value = parse_json(arguments)) {
    if (value->is_object()) text = arguments_text(&*value);
  }
  if (!text) return std::nullopt;
  return ParsedToolCall{std::string(name), std::move(*text)};
}

// Where the JSON object that starts text[0] == '{' ends (one past its '}'), or npos while it
// is still open.
size_t json_object_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  for (const ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                      ToolCallFormat::kLlama3Json, ToolCallFormat::kDeepSeekV3}) {
    if (tool_call_format_name(format) == name) return format;
  }
  return std::nullopt;
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template,
                                       std::string_view model_type) {
  if (chat_template.find(kHermesStart) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (chat_template.find(kDeepSeekSectionStart) != std::string_view::npos) {
    return ToolCallFormat::kDeepSeekV3;
  }
  const bool ipython = chat_template.find("ipython") != std::string_view::npos ||
                       chat_template.find("<|python_tag|>") != std::string_view::npos;
  if (ipython && chat_template.find("\"parameters\"") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  constexpr std::array kHermesFamilies = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"};
  if (std::find(kHermesFamilies.begin(), kHermesFamilies.end(), model_type) !=
      kHermesFamilies.end()) {
    return ToolCallFormat::kHermes;
  }
  if (model_type == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  return ToolCallFormat::kNone;
}

ToolCallParser::ToolCallParser(ToolCallFormat format)
    : format_(format),
      state_(format == ToolCallFormat::kLlama3Json ? State::kLlamaStart
             : format == ToolCallFormat::kNone     ? State::kPlainContent
                                                   : State::kContent) {}

std::vector<ToolCallPiece> ToolCallParser::push(std::string_view text) {
  buffer_ += text;
  std::vector<ToolCallPiece> out;
  run(false, out);
  return out;
}

std::vector<ToolCallPiece> ToolCallParser::finish() {
  std::vector<ToolCallPiece> out;
  run(true, out);
  return out;
}

void ToolCallParser::emit_content(std::string text, std::vector<ToolCallPiece>& out) {
  if (text.empty()) return;
  if (!out.empty() && !out.back().call) {
    out.back().content += text;
  } else {
    out.push_back({std::move(text), std::nullopt});
  }
}

bool ToolCallParser::close_call(const std::string& body, const std::string& raw,
                                std::vector<ToolCallPiece>& out) {
  std::optional<ParsedToolCall> call =
      format_ == ToolCallFormat::kDeepSeekV3 ? parse_deepseek_call(body) : parse_json_call(body);
  separator_.clear();
  if (format_ == ToolCallFormat::kDeepSeekV3) {
    section_raw_ += raw;
    if (!call) {
      // Before the section's first valid call, whether it is a section at all is open.
      if (section_calls_ == 0) {
        section_pending_ += raw;
      } else {
        emit_content(raw, out);
      }
      return false;
    }
    if (section_calls_++ == 0) emit_content(std::exchange(section_pending_, {}), out);
    out.push_back({std::string(), std::move(call)});
    return true;
  }
  if (call) {
    out.push_back({std::string(), std::move(call)});
    skip_whitespace_ = true;
    return true;
  }
  emit_content(raw, out);
  skip_whitespace_ = false;
  return false;
}

void ToolCallParser::run(bool at_end, std::vector<ToolCallPiece>& out) {
  const bool llama = format_ == ToolCallFormat::kLlama3Json;
  // Each pass either changes state or consumes text; false: wait for more.
  while (llama ? run_llama(at_end, out) : run_markers(at_end, out)) {
  }
}

bool ToolCallParser::run_markers(bool at_end, std::vector<ToolCallPiece>& out) {
  const bool deepseek = format_ == ToolCallFormat::kDeepSeekV3;
  const std::string_view start = deepseek ? kDeepSeekSectionStart : kHermesStart;
  switch (state_) {
    case State::kPlainContent:
      emit_content(std::exchange(buffer_, {}), out);
      return false;
    case State::kContent: {
      if (skip_whitespace_) {
        const size_t first = buffer_.find_first_not_of(" \t\n\r");
        buffer_.erase(0, first == std::string::npos ? buffer_.size() : first);
        if (buffer_.empty()) return false;
        skip_whitespace_ = false;
      }
      const size_t at = buffer_.find(start);
      if (at == std::string::npos) {
        size_t cut = buffer_.size();
        if (!at_end) {
          cut -= partial_marker(buffer_, start);
          while (cut > 0 && is_space(buffer_[cut - 1])) --cut;
        }
        emit_content(buffer_.substr(0, cut), out);
        buffer_.erase(0, cut);
        return false;
      }
      size_t text_end = at;
      while (text_end > 0 && is_space(buffer_[text_end - 1])) --text_end;
      emit_content(buffer_.substr(0, text_end), out);
      separator_ = buffer_.substr(text_end, at - text_end);
      buffer_.erase(0, at + start.size());
      if (deepseek) {
        section_raw_ = separator_ + std::string(start);
        section_pending_.clear();
        section_calls_ = 0;
        state_ = State::kSection;
      } else {
        state_ = State::kCall;
      }
      return true;
    }
    case State::kSection: {
      const size_t call = buffer_.find(kDeepSeekCallStart);
      const size_t end = buffer_.find(kDeepSeekSectionEnd);
      if (call != std::string::npos && (end == std::string::npos || call < end)) {
        // What stands between calls (a newline) is dropped with the section's markers.
        section_raw_ += buffer_.substr(0, call);
        buffer_.erase(0, call + kDeepSeekCallStart.size());
        state_ = State::kCall;
        return true;
      }
      if (end == std::string::npos && !at_end) return false;
      const size_t used =
          end == std::string::npos ? buffer_.size() : end + kDeepSeekSectionEnd.size();
      if (section_calls_ == 0) {
        // A section with no valid call in it was not a tool call: the model's text as it was.
        emit_content(section_raw_ + buffer_.substr(0, used), out);
        skip_whitespace_ = false;
      } else {
        skip_whitespace_ = true;
      }
      section_raw_.clear();
      section_pending_.clear();
      buffer_.erase(0, used);
      state_ = State::kContent;
      return true;
    }
    case State::kCall: {
      const std::string_view call_start = deepseek ? kDeepSeekCallStart : start;
      const std::string_view call_end = deepseek ? kDeepSeekCallEnd : kHermesEnd;
      const size_t end = buffer_.find(call_end);
      if (end == std::string::npos && !at_end) return false;
      const size_t body_size = end == std::string::npos ? buffer_.size() : end;
      const size_t raw_size = end == std::string::npos ? buffer_.size() : end + call_end.size();
      const std::string body = buffer_.substr(0, body_size);
      const std::string raw = (deepseek ? std::string() : separator_) + std::string(call_start) +
                              buffer_.substr(0, raw_size);
      buffer_.erase(0, raw_size);
      close_call(body, raw, out);
      state_ = deepseek ? State::kSection : State::kContent;
      return true;
    }
    case State::kLlamaStart:
    case State::kLlamaCalls:
      break;
  }
  return false;
}

bool ToolCallParser::run_llama(bool at_end, std::vector<ToolCallPiece>& out) {
  switch (state_) {
    case State::kLlamaStart: {
      const size_t first = buffer_.find_first_not_of(" \t\n\r");
      if (first == std::string::npos) {
        if (at_end) emit_content(std::exchange(buffer_, {}), out);
        return false;
      }
      if (buffer_[first] == '{') {
        buffer_.erase(0, first);
        state_ = State::kLlamaCalls;
      } else {
        state_ = State::kPlainContent;
      }
      return true;
    }
    case State::kLlamaCalls: {
      // Separators between calls: whitespace, at most one ';', whitespace.
      size_t at = 0;
      while (at < buffer_.size() && is_space(buffer_[at])) ++at;
      if (at < buffer_.size() && buffer_[at] == ';' && skip_whitespace_) {
        ++at;
        while (at < buffer_.size() && is_space(buffer_[at])) ++at;
      }
      if (at == buffer_.size()) {
        if (at_end) buffer_.clear();
        return false;
      }
      if (buffer_[at] != '{') {
        buffer_.erase(0, at);
        state_ = State::kPlainContent;
        return true;
      }
      const size_t end = json_object_end(std::string_view(buffer_).substr(at));
      if (end == std::string::npos) {
        if (at_end) {
          emit_content(buffer_.substr(at), out);
          buffer_.clear();
        }
        return false;
      }
      const std::string object = buffer_.substr(at, end);
      buffer_.erase(0, at + end);
      // Not a call: it and the rest are text.
      if (!close_call(object, object, out)) state_ = State::kPlainContent;
      return true;
    }
    case State::kPlainContent:
      emit_content(std::exchange(buffer_, {}), out);
      return false;
    default:
      break;
  }
  return false;
}

}  // namespace pagedattn::server
