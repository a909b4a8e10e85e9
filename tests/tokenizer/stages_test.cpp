// The pipeline's stages alone, on hand-worked inputs: split behaviors, pre-tokenizers (Split,
// Digits, Metaspace, ByteLevel), decoders (Strip, Replace, Metaspace, ByteLevel), lossy UTF-8.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/decoder.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagedattn::tokenizer {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges split(SplitBehavior behavior, bool invert = false) {
  // "a-b--c": matches of "-" at [1,2), [3,4), [4,5).
  std::vector<std::pair<size_t, size_t>> matches = {{1, 2}, {3, 4}, {4, 5}};
  Ranges out;
  split_range(0, 6, matches, behavior, invert, out);
  return out;
}

TEST(SplitBehaviors, AsTokenizersDefinesThem) {
  EXPECT_EQ(split(SplitBehavior::kRemoved), (Ranges{{0, 1}, {2, 3}, {5, 6}}));
  EXPECT_EQ(split(SplitBehavior::kIsolated),
            (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}}));
  // a- b- - c: a match joins the piece before unless that piece was a match too.
  EXPECT_EQ(split(SplitBehavior::kMergedWithPrevious), (Ranges{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  // a -b - -c: the same from the right.
  EXPECT_EQ(split(SplitBehavior::kMergedWithNext), (Ranges{{0, 1}, {1, 3}, {3, 4}, {4, 6}}));
  EXPECT_EQ(split(SplitBehavior::kContiguous), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 5}, {5, 6}}));
  EXPECT_EQ(split(SplitBehavior::kRemoved, true), (Ranges{{1, 2}, {3, 4}, {4, 5}}));
}

std::vector<std::string> pre_tokenize(const std::string& json, const std::string& text) {
  nlohmann::json document = nlohmann::json::parse(json);
  auto stage = make_pre_tokenizer(JsonNode(document, "stage.json"));
  Words words, scratch;
  words.reset(text, true);
  stage->pre_tokenize(words, scratch);
  std::vector<std::string> result;
  for (auto [start, end] : words.ranges) result.push_back(words.text.substr(start, end - start));
  return result;
}

using Strings = std::vector<std::string>;

TEST(PreTokenizers, Digits) {
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": false})", "ab123c4"),
            (Strings{"ab", "123", "c", "4"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": true})", "ab123c4"),
            (Strings{"ab", "1", "2", "3", "c", "4"}));
  // Unicode numbers count: Arabic-Indic digits and a vulgar fraction.
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": true})", "x\u0661\u00BD"),
            (Strings{"x", "\u0661", "\u00BD"}));
}

TEST(PreTokenizers, SplitWithRegexAndLookahead) {
  // \s+(?!\S) leaves the last space of a run to the next word, as GPT-style patterns do.
  EXPECT_EQ(pre_tokenize(R"({"type": "Split", "pattern": {"Regex": " ?\\p{L}+|\\s+(?!\\S)|\\s+"},
                             "behavior": "Isolated", "invert": false})",
                         "hi   there"),
            (Strings{"hi", "  ", " there"}));
}

TEST(PreTokenizers, WhiteSpaceIsUnicodeWhiteSpaceAsInOniguruma) {
  // U+180E is not White_Space (since Unicode 6.3); PCRE2's own \s would take it. U+3000 is.
  const std::string split = R"({"type": "Split", "pattern": {"Regex": "\\s+"},
                                "behavior": "Isolated", "invert": false})";
  EXPECT_EQ(pre_tokenize(split, "a\u180Eb\u3000c"), (Strings{"a\u180Eb", "\u3000", "c"}));
  const std::string in_class = R"({"type": "Split", "pattern": {"Regex": "[^\\s]+"},
                                   "behavior": "Removed", "invert": true})";
  EXPECT_EQ(pre_tokenize(in_class, "x\u180E y"), (Strings{"x\u180E", "y"}));
}

TEST(PreTokenizers, MetaspaceReplacesAndSplits) {
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "always", "split": true})",
                         "hello  world"),
            (Strings{"\u2581hello", "\u2581", "\u2581world"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "never", "split": false})",
                         "a b"),
            (Strings{"a\u2581b"}));
}

TEST(PreTokenizers, ByteLevelPrefixSpaceRegexAndAlphabet) {
  // A space before the text, GPT-2's split, then bytes as characters: ' ' -> Ġ, 'é' (C3 A9) ->
  // Ã ©.
  EXPECT_EQ(pre_tokenize(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})",
                         "Hi caf\u00E9"),
            (Strings{"\u0120Hi", "\u0120caf\u00C3\u00A9"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})",
                         "a b\n"),
            (Strings{"a\u0120b\u010A"}));
}

std::string decode(const std::string& json, std::vector<std::string> tokens) {
  nlohmann::json document = nlohmann::json::parse(json);
  auto stage = make_decoder(JsonNode(document, "stage.json"));
  stage->decode_chain(tokens);
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

TEST(Decoders, StripReplaceMetaspace) {
  EXPECT_EQ(decode(R"({"type": "Strip", "content": " ", "start": 1, "stop": 0})", {"  a ", " b"}),
            " a b");
  EXPECT_EQ(decode(R"({"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "})",
                   {"\u2581a\u2581\u2581b"}),
            " a  b");
  EXPECT_EQ(decode(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"})",
                   {"\u2581Hello", "\u2581world"}),
            "Hello world");
}

TEST(Decoders, ByteLevelMapsBackAndReplacesInvalidBytes) {
  const std::string byte_level = R"({"type": "ByteLevel"})";
  EXPECT_EQ(decode(byte_level, {"\u0120caf", "\u00C3\u00A9"}), " caf\u00E9");
  // A token outside the alphabet (an added token) keeps its own bytes.
  EXPECT_EQ(decode(byte_level, {"<\uFF5Cx\uFF5C>", "a"}), "<\uFF5Cx\uFF5C>a");
  // E2 82 then 'a': one U+FFFD for the truncated character (its maximal subpart).
  EXPECT_EQ(decode(byte_level, {"\u00E2\u0124", "a"}), "\uFFFDa");
}

TEST(Unicode, LossyUtf8ReplacesEachMaximalSubpart) {
  auto lossy = [](std::string_view bytes) {
    std::string out;
    append_lossy_utf8(out, bytes);
    return out;
  };
  EXPECT_EQ(lossy("a\xE2\x82"
                  "b"),
            "a\uFFFDb");                                             // truncated 3-byte character
  EXPECT_EQ(lossy("\xF0\x80\x80"), "\uFFFD\uFFFD\uFFFD");            // F0 80: not a valid start
  EXPECT_EQ(lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // a surrogate
  EXPECT_EQ(lossy("\xC0\xAF"), "\uFFFD\uFFFD");                      // overlong
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // past U+10FFFF
  EXPECT_EQ(lossy("\xF0\x9F\x98"), "\uFFFD");                        // truncated 4-byte character
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80"), "\U0001F600");
}

}  // namespace
}  // namespace pagedattn::tokenizer
