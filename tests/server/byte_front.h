// A byte-level text front for the server tests, standing in for the real tokenizer (issue 15):
// token t < 256 is the byte t, token 256 is EOS, tokens 257 .. kVocab-1 are specials that
// decode to no text. The chat "template" is "<role>: <content>\n" per message, then
// "assistant: " (tools and tool calls: see render_chat). The incremental detokenizer emits every
// complete, valid UTF-8 character as soon as its last byte arrives; a byte that cannot start or
// continue a valid character becomes U+FFFD on its own (the rule naive_decode() in server_support.h
// applies to a whole buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/engine_stop.h"
#include "pagedattn/server_protocol.h"

namespace pagedattn::server::testing {

inline constexpr int32_t kVocab = 320;
inline constexpr int32_t kEos = 256;
inline constexpr const char* kReplacement = "\xEF\xBF\xBD";

// How many bytes the valid character starting at text[0] takes: > 0 if complete and valid,
// 0 if it is a valid prefix of a character still to be completed, -1 if invalid.
inline int utf8_character(const std::string& text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // <= U+10FFFF
  } else {
    return -1;
  }
  for (size_t i = 1; i < static_cast<size_t>(length); ++i) {
    if (i >= text.size()) return 0;
    const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (byte(i) < lo || byte(i) > hi) return -1;
  }
  return length;
}

class ByteDetokenizer : public engine::IncrementalDetokenizer {
 public:
  std::string push(int32_t token) override {
    if (token >= 256) return {};
    pending_ += static_cast<char>(token);
    std::string out;
    while (!pending_.empty()) {
      const int length = utf8_character(pending_);
      if (length == 0) break;
      if (length < 0) {
        out += kReplacement;
        pending_.erase(0, 1);
      } else {
        out += pending_.substr(0, static_cast<size_t>(length));
        pending_.erase(0, static_cast<size_t>(length));
      }
    }
    return out;
  }
  std::string flush() override {
    std::string out;
    while (!pending_.empty()) {
      const int length = utf8_character(pending_);
      if (length <= 0) {
        out += kReplacement;
        pending_.erase(0, 1);
      } else {
        out += pending_.substr(0, static_cast<size_t>(length));
        pending_.erase(0, static_cast<size_t>(length));
      }
    }
    return out;
  }

 private:
  std::string pending_;
};

class ByteFront : public TextFront {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> tokens;
    for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
    return tokens;
  }
  // With tools: "tools: <the list as JSON>\n" first; an assistant's calls follow its content as
  // "<call NAME ARGUMENTS>", a tool message's content is followed by " (for ID)".
  std::string render_chat(std::span<const ChatMessage> messages,
                          const nlohmann::ordered_json& tools) const override {
    std::string text;
    if (!tools.is_null()) text += "tools: " + tools.dump() + "\n";
    for (const ChatMessage& message : messages) {
      text += message.role + ": " + message.content;
      for (const ChatToolCall& call : message.tool_calls) {
        text += "<call " + call.name + " " + call.arguments + ">";
      }
      if (message.role == "tool") text += " (for " + message.tool_call_id + ")";
      text += "\n";
    }
    return text + "assistant: ";
  }
  std::string token_bytes(int32_t token) const override {
    if (token < 256) return std::string(1, static_cast<char>(token));
    return token == kEos ? "<|eos|>" : "<|special_" + std::to_string(token) + "|>";
  }
  static engine::DetokenizerFactory detokenizer() {
    return [](std::span<const int32_t>) { return std::make_unique<ByteDetokenizer>(); };
  }
};

}  // namespace pagedattn::server::testing
