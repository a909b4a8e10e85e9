// Tokenizer::token_bytes on the four real tokenizers, against references that share nothing
// with the library:
// - every id, from tokenizer.json read here with nlohmann-json: a byte-level vocabulary string
//   mapped back through GPT-2's byte <-> character table (written out below as GPT-2's
//   encoder.py builds it), a Llama 2 "<0xNN>" string its byte and "▁" a space, an added token
//   its content;
// - Hugging Face's own ids of every corpus line (the fixtures): their bytes concatenated are the
//   text `tokenizers` decoded (Llama 2: after the one leading space its decoder strips), and for
//   the random id sequences (partial characters included) the bytes, made UTF-8 by the
//   replacement rule written here, are `tokenizers`' decode;
// - named tokens that hold half a multi-byte character.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "real_tokenizers.h"

namespace pagedattn::tokenizer::testing {
namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// take the characters from U+0100 on, in byte order. Inverted: character -> byte.
const std::map<char32_t, int>& gpt2_byte_of_char() {
  static const std::map<char32_t, int> table = [] {
    std::map<char32_t, int> result;
    int next = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable =
          (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      result[printable ? static_cast<char32_t>(byte) : static_cast<char32_t>(256 + next++)] = byte;
    }
    return result;
  }();
  return table;
}

// The code points of valid UTF-8 (the vocabulary strings are).
std::vector<char32_t> code_points(const std::string& text) {
  std::vector<char32_t> result;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) code = (code << 6) | (text[i + k] & 0x3F);
    result.push_back(code);
    i += static_cast<size_t>(length);
  }
  return result;
}

// Bytes -> UTF-8 with each maximal ill-formed subpart replaced by one U+FFFD (Unicode's
// "substitution of maximal subparts", what Rust's from_utf8_lossy and so `tokenizers` do).
std::string lossy_utf8(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out += bytes[i++];
      continue;
    }
    int length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      low = lead == 0xE0 ? 0xA0 : 0x80;
      high = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      low = lead == 0xF0 ? 0x90 : 0x80;
      high = lead == 0xF4 ? 0x8F : 0xBF;
    }
    size_t taken = 1;
    while (length > 0 && taken < static_cast<size_t>(length) && i + taken < bytes.size()) {
      const auto next = static_cast<unsigned char>(bytes[i + taken]);
      const unsigned char lo = taken == 1 ? low : 0x80, hi = taken == 1 ? high : 0xBF;
      if (next < lo || next > hi) break;
      ++taken;
    }
    if (length > 0 && taken == static_cast<size_t>(length)) {
      out.append(bytes, i, taken);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += taken;
  }
  return out;
}

bool valid_utf8(const std::string& bytes) { return lossy_utf8(bytes) == bytes; }

std::string hex(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x} ", static_cast<unsigned char>(c));
  return out;
}

// What tokenizer.json says each id stands for, derived here.
class ExpectedBytes {
 public:
  explicit ExpectedBytes(const std::string& name) {
    std::ifstream file(real_tokenizer_directory(name) + "/tokenizer.json");
    const nlohmann::json root = nlohmann::json::parse(file);
    const std::string decoder = root["decoder"]["type"];
    byte_level_ = decoder == "ByteLevel";
    EXPECT_TRUE(byte_level_ || name == "llama2") << name << ": decoder " << decoder;
    for (const auto& [token, id] : root["model"]["vocab"].items()) {
      by_id_[id.get<TokenId>()] = from_vocabulary(token);
    }
    for (const nlohmann::json& added : root["added_tokens"]) {
      by_id_[added["id"].get<TokenId>()] = from_added(added["content"]);
      added_.push_back(added["id"].get<TokenId>());
    }
  }
  bool is_added(TokenId id) const {
    return std::find(added_.begin(), added_.end(), id) != added_.end();
  }
  std::optional<std::string> operator()(TokenId id) const {
    const auto it = by_id_.find(id);
    return it == by_id_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  bool byte_level() const { return byte_level_; }

 private:
  std::string from_vocabulary(const std::string& token) const {
    if (byte_level_) return through_alphabet(token);
    // Llama 2: "<0xNN>" is byte NN (ByteFallback); "▁" is a space (Replace).
    if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>') {
      return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
    }
    std::string out;
    for (size_t i = 0; i < token.size();) {
      if (token.compare(i, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += token[i++];
      }
    }
    return out;
  }
  // An added token goes through the same decoder; in these files every one either lies outside
  // the byte alphabet or is plain printable ASCII, so it is its content.
  std::string from_added(const std::string& content) const {
    return byte_level_ ? through_alphabet(content) : from_vocabulary(content);
  }
  // Each character's byte; a string with a character outside the alphabet keeps its own bytes.
  static std::string through_alphabet(const std::string& token) {
    const auto& table = gpt2_byte_of_char();
    std::string out;
    for (const char32_t code : code_points(token)) {
      const auto it = table.find(code);
      if (it == table.end()) return token;
      out += static_cast<char>(it->second);
    }
    return out;
  }

  bool byte_level_ = false;
  std::map<TokenId, std::string> by_id_;
  std::vector<TokenId> added_;
};

class TokenBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenBytes, EveryIdIsItsVocabularyStringsBytes) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const ExpectedBytes expected(GetParam());
  int mismatches = 0;
  int partial = 0;  // ids whose bytes are not UTF-8 on their own
  for (TokenId id = -1; id <= tokenizer.vocab_size(); ++id) {
    const std::optional<std::string> want = expected(id);
    const std::optional<std::string> got = tokenizer.token_bytes(id);
    if (got != want && mismatches++ < 5) {
      ADD_FAILURE() << GetParam() << " id " << id << ": expected "
                    << (want ? hex(*want) : "nullopt") << ", got " << (got ? hex(*got) : "nullopt");
    }
    if (want && !valid_utf8(*want)) {
      ++partial;
      // decode() repairs such a token; token_bytes does not.
      const TokenId ids[] = {id};
      EXPECT_NE(tokenizer.decode(ids, false).find("\xEF\xBF\xBD"), std::string::npos) << id;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Byte-level vocabularies hold thousands of partial characters; Llama 2 its 128 high bytes.
  EXPECT_GE(partial, 128) << GetParam();
}

TEST_P(TokenBytes, TokenizersIdsConcatenateToTheirText) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const ExpectedBytes reference(GetParam());
  const bool byte_level = reference.byte_level();
  const Fixtures& expected = fixtures(GetParam());
  const auto concatenated = [&](const std::vector<TokenId>& ids) {
    std::string bytes;
    for (const TokenId id : ids) bytes += tokenizer.token_bytes(id).value_or("");
    return bytes;
  };
  int mismatches = 0;
  for (size_t line = 0; line < expected.corpus.size(); ++line) {
    const CorpusCase& item = expected.corpus[line];
    struct Check {
      const std::vector<TokenId>* ids;
      std::string want;
    };
    std::vector<Check> checks;
    if (byte_level) {
      checks = {{&item.ids, item.decoded}, {&item.ids_special, item.decoded_special}};
    } else {
      // Llama 2's normalizer prepends "▁" to the text before the first added token and its
      // decoder strips that space from the text's start again; a text that starts with an
      // added token (split out before normalizing) has no such space.
      const bool space = !item.ids.empty() && !reference.is_added(item.ids[0]);
      checks = {{&item.ids, (space ? " " : "") + item.decoded}};
    }
    for (const Check& check : checks) {
      const std::string bytes = concatenated(*check.ids);
      if (bytes != check.want && mismatches++ < 3) {
        ADD_FAILURE() << GetParam() << " corpus line " << line + 1
                      << "\n  ids: " << format_ids(*check.ids)
                      << "\n  expected: " << hex(check.want) << "\n  got:      " << hex(bytes);
      }
    }
  }
  // Random ids: partial characters everywhere. Llama 2's decoder repairs byte-fallback runs
  // token by token, not by this rule, so only the byte-level tokenizers are checked here.
  if (byte_level) {
    ASSERT_FALSE(expected.random.empty());
    for (const DecodeCase& item : expected.random) {
      const std::string bytes = concatenated(item.ids);
      if (lossy_utf8(bytes) != item.decoded && mismatches++ < 6) {
        ADD_FAILURE() << GetParam() << " random ids " << format_ids(item.ids)
                      << "\n  bytes: " << hex(bytes);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Real, TokenBytes, ::testing::ValuesIn(kRealTokenizers),
                         [](const auto& info) { return info.param; });

// Tokens by their vocabulary strings, with the bytes written out by hand.
TEST(TokenBytesNamed, HalfCharactersKeepTheirRawBytes) {
  struct Case {
    const char* tokenizer;
    const char* token;  // as the vocabulary spells it
    std::string bytes;
    std::string decoded;  // decode({id})
  };
  const std::string replacement = "\xEF\xBF\xBD";
  const std::vector<Case> cases = {
      // "ä" is GPT-2's character for byte E4: the lead byte of 你 (E4 BD A0), alone.
      {"qwen3", "\xC3\xA4", "\xE4", replacement},
      // "ä½": E4 BD, two thirds of 你.
      {"qwen3", "\xC3\xA4\xC2\xBD", "\xE4\xBD", replacement},
      // "ĠðŁ": a space and the first half of an emoji (F0 9F ..).
      {"llama3", "\xC4\xA0\xC3\xB0\xC5\x81", " \xF0\x9F", " " + replacement},
      {"llama3", "\xC3\xB0\xC5\x81\xC4\xBA", "\xF0\x9F\x98", replacement},
      {"deepseek_v3", "\xC3\xA6\xC4\xAA", "\xE6\x88", replacement},
      // Llama 2: a byte-fallback token is its byte; "▁the" keeps the space decode strips.
      {"llama2", "<0xE4>", "\xE4", replacement},
      {"llama2", "<0x0A>", "\n", "\n"},
      {"llama2", "\xE2\x96\x81the", " the", "the"},
      // Special tokens: their content.
      {"qwen3", "<|im_start|>", "<|im_start|>", "<|im_start|>"},
      {"llama2", "</s>", "</s>", "</s>"},
  };
  for (const Case& item : cases) {
    const Tokenizer& tokenizer = real_tokenizer(item.tokenizer);
    const std::optional<TokenId> id = tokenizer.token_to_id(item.token);
    ASSERT_TRUE(id) << item.tokenizer << " has no token " << item.token;
    EXPECT_EQ(tokenizer.token_bytes(*id), item.bytes) << item.tokenizer << " " << item.token;
    const TokenId ids[] = {*id};
    EXPECT_EQ(tokenizer.decode(ids, false), item.decoded) << item.tokenizer << " " << item.token;
  }
  EXPECT_EQ(real_tokenizer("qwen3").token_bytes(-1), std::nullopt);
  EXPECT_EQ(real_tokenizer("qwen3").token_bytes(
                static_cast<TokenId>(real_tokenizer("qwen3").vocab_size())),
            std::nullopt);
}

}  // namespace
}  // namespace pagedattn::tokenizer::testing
