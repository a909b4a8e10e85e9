// Decoders (see decoder.h). The subtle one is text from bytes: ByteLevel concatenates the bytes
// of every token and replaces each maximal invalid UTF-8 subpart with one U+FFFD, while
// ByteFallback replaces a whole invalid run of <0xNN> tokens with one U+FFFD per token, exactly
// as `tokenizers` does. Their bytes_chain keeps the bytes raw instead.
#include "decoder.h"

#include <algorithm>

#include "pattern.h"
#include "unicode.h"

namespace pagedattn::tokenizer {

int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int high = hex(token[3]), low = hex(token[4]);
  if (high < 0 || low < 0) return -1;
  return high * 16 + low;
}

namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string text;
    append_lossy_utf8(text, join_bytes(tokens));
    tokens.assign(1, std::move(text));
  }
  void bytes_chain(std::vector<std::string>& tokens, bool& fused) const override {
    std::string bytes = join_bytes(tokens);
    tokens.assign(1, std::move(bytes));
    fused = true;
  }
  bool bytes_per_token() const override { return true; }
  // The token's characters mapped back to the bytes they stand for.
  void append_token_bytes(std::string_view token, std::string& bytes) const override {
    const ByteAlphabet& alphabet = byte_alphabet();
    const size_t mark = bytes.size();
    for (size_t position = 0; position < token.size();) {
      char32_t codepoint = next_codepoint(token, position);
      int byte = codepoint < 512 ? alphabet.byte_of_char[codepoint] : -1;
      if (byte < 0) {  // a token outside the alphabet (an added token) keeps its own bytes
        bytes.resize(mark);
        bytes += token;
        return;
      }
      bytes += static_cast<char>(byte);
    }
  }

 private:
  // Each token's bytes, concatenated.
  std::string join_bytes(const std::vector<std::string>& tokens) const {
    std::string bytes;
    for (const std::string& token : tokens) append_token_bytes(token, bytes);
    return bytes;
  }
};

class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override { run(tokens, true); }
  void bytes_chain(std::vector<std::string>& tokens, bool&) const override { run(tokens, false); }
  bool has_byte_fallback() const override { return true; }

 private:
  // `repair`: an invalid run becomes one U+FFFD per token (decode); else its bytes stay.
  static void run(std::vector<std::string>& tokens, bool repair) {
    if (std::none_of(tokens.begin(), tokens.end(),
                     [](const std::string& token) { return byte_fallback_value(token) >= 0; })) {
      return;  // the common case: nothing to do
    }
    std::vector<std::string> result;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0) return;
      if (!repair || is_valid_utf8(run)) {
        result.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) result.emplace_back(kReplacementCharacter);
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& token : tokens) {
      int byte = byte_fallback_value(token);
      if (byte >= 0) {
        run += static_cast<char>(byte);
        ++run_tokens;
      } else {
        flush();
        result.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(result);
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string text;
    for (const std::string& token : tokens) text += token;
    tokens.assign(1, std::move(text));
  }
  void bytes_chain(std::vector<std::string>& tokens, bool& fused) const override {
    decode_chain(tokens);
    fused = true;
  }
};

// Removes up to `start` leading and `stop` trailing occurrences of one character per token.
class Strip final : public Decoder {
 public:
  explicit Strip(const JsonNode& node)
      : content_(node.at("content").string()),
        start_(node.at("start").integer()),
        stop_(node.at("stop").integer()) {
    size_t position = 0;
    if (content_.empty() || (next_codepoint(content_, position), position != content_.size())) {
      node.at("content").fail("expected one character");
    }
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (int64_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0 &&
                          begin + content_.size() <= end;
           ++i) {
        begin += content_.size();
      }
      for (int64_t i = 0; i < stop_ && end >= begin + content_.size() &&
                          token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token.erase(end);
      token.erase(0, begin);
    }
  }
  // After a fuse, Strip trims the whole text (Llama 2: the space its normalizer prepended), which
  // is not part of one token's bytes; before one, it trims every token, as decode does.
  void bytes_chain(std::vector<std::string>& tokens, bool& fused) const override {
    if (!fused) decode_chain(tokens);
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  explicit Replace(const JsonNode& node)
      : pattern_(node.at("pattern")), content_(node.at("content").string()) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) pattern_.replace_all(token, content_);
  }
  // Raw bytes from an earlier stage may not be UTF-8, which the regex engine must not see: the
  // pattern is applied to each valid stretch, the invalid bytes between them are kept.
  void bytes_chain(std::vector<std::string>& tokens, bool&) const override {
    for (std::string& token : tokens) {
      if (is_valid_utf8(token)) {
        pattern_.replace_all(token, content_);
        continue;
      }
      std::string result;
      for (std::string_view rest = token; !rest.empty();) {
        const size_t valid = valid_utf8_prefix(rest);
        std::string piece(rest.substr(0, valid));
        pattern_.replace_all(piece, content_);
        result += piece;
        if (valid < rest.size()) result += rest[valid];
        rest.remove_prefix(std::min(rest.size(), valid + 1));
      }
      token = std::move(result);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Metaspace: the replacement character becomes a space; the first token loses a leading space
// unless the prepend scheme is "never".
class Metaspace final : public Decoder {
 public:
  explicit Metaspace(const JsonNode& node) : replacement_(node.string_or("replacement", "\u2581")) {
    std::string scheme = node.string_or("prepend_scheme", "");
    if (scheme.empty()) scheme = node.boolean_or("add_prefix_space", true) ? "always" : "never";
    strip_first_ = scheme != "never";
  }
  void decode_chain(std::vector<std::string>& tokens) const override { run(tokens, strip_first_); }
  // A token's bytes keep the space its replacement character stands for, first or not.
  void bytes_chain(std::vector<std::string>& tokens, bool&) const override { run(tokens, false); }

 private:
  void run(std::vector<std::string>& tokens, bool strip_first) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string text;
      std::string_view token = tokens[i];
      for (size_t position = 0; position < token.size();) {
        if (token.substr(position).starts_with(replacement_)) {
          text += ' ';
          position += replacement_.size();
        } else {
          text += token[position++];
        }
      }
      if (i == 0 && strip_first && !text.empty() && text[0] == ' ') text.erase(0, 1);
      tokens[i] = std::move(text);
    }
  }

  std::string replacement_;
  bool strip_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(const JsonNode& node) {
    for (const JsonNode& item : node.at("decoders").items()) members_.push_back(make_decoder(item));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& member : members_) member->decode_chain(tokens);
  }
  void bytes_chain(std::vector<std::string>& tokens, bool& fused) const override {
    for (const auto& member : members_) member->bytes_chain(tokens, fused);
  }
  bool has_byte_fallback() const override {
    for (const auto& member : members_) {
      if (member->has_byte_fallback()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> members_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const JsonNode& node) {
  std::string type = node.type("decoder", {"ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace",
                                           "Metaspace", "Sequence"});
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") return std::make_unique<Strip>(node);
  if (type == "Replace") return std::make_unique<Replace>(node);
  if (type == "Metaspace") return std::make_unique<Metaspace>(node);
  return std::make_unique<Sequence>(node);
}

}  // namespace pagedattn::tokenizer
