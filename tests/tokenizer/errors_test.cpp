// Files the tokenizer cannot read exactly are errors naming the file, the JSON path and the
// value (never a silently different tokenization); bad input text and ids likewise.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {
namespace {

std::string load_error(const std::string& json) {
  try {
    Tokenizer::from_json(json, "bad/tokenizer.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// A valid small tokenizer.json with one section replaced.
std::string with(const std::string& section, const std::string& value,
                 const std::string& model = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                                                "merges": ["a b"]})") {
  nlohmann::json json = {{"added_tokens", nlohmann::json::array()},
                         {"normalizer", nullptr},
                         {"pre_tokenizer", nullptr},
                         {"post_processor", nullptr},
                         {"decoder", nullptr},
                         {"model", nlohmann::json::parse(model)}};
  if (!section.empty()) json[section] = nlohmann::json::parse(value);
  return json.dump();
}

TEST(TokenizerErrors, OtherModelTypes) {
  for (std::string type : {"Unigram", "WordPiece", "WordLevel"}) {
    EXPECT_EQ(load_error(with("", "", R"({"type": ")" + type + R"(", "vocab": []})")),
              "bad/tokenizer.json: $.model.type: unsupported model type \"" + type +
                  "\" (supported: BPE) (value: \"" + type + "\")");
  }
}

TEST(TokenizerErrors, UnknownStages) {
  EXPECT_EQ(load_error(with("normalizer", R"({"type": "BertNormalizer"})")),
            "bad/tokenizer.json: $.normalizer.type: unsupported normalizer type "
            "\"BertNormalizer\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, "
            "Sequence) (value: \"BertNormalizer\")");
  EXPECT_EQ(
      load_error(with("pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [
                                            {"type": "Digits"}, {"type": "Whitespace"}]})")),
      "bad/tokenizer.json: $.pre_tokenizer.pretokenizers[1].type: unsupported pre-tokenizer type "
      "\"Whitespace\" (supported: Split, ByteLevel, Digits, Metaspace, Sequence) (value: "
      "\"Whitespace\")");
  EXPECT_EQ(load_error(with("decoder", R"({"type": "WordPiece", "prefix": "##"})")),
            "bad/tokenizer.json: $.decoder.type: unsupported decoder type \"WordPiece\" "
            "(supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence) "
            "(value: \"WordPiece\")");
  EXPECT_EQ(load_error(with("post_processor", R"({"type": "BertProcessing"})")),
            "bad/tokenizer.json: $.post_processor.type: unsupported post processor type "
            "\"BertProcessing\" (supported: TemplateProcessing, RobertaProcessing, ByteLevel, "
            "Sequence) (value: \"BertProcessing\")");
}

TEST(TokenizerErrors, MalformedJsonAndModel) {
  EXPECT_TRUE(load_error(R"({"model": {"type": "BPE", )")
                  .starts_with("bad/tokenizer.json: malformed JSON at byte"));
  EXPECT_EQ(load_error(with("", "", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})")),
            "bad/tokenizer.json: $.model.merges[0]: a token of this merge is not in the "
            "vocabulary (value: \"a b\")");
  EXPECT_EQ(load_error(with("", "", R"({"type": "BPE", "vocab": {"a": 0, "b": 1},
                                        "merges": ["a b"]})")),
            "bad/tokenizer.json: $.model.merges[0]: the merged token \"ab\" is not in the "
            "vocabulary (value: \"a b\")");
  EXPECT_EQ(load_error(with("", "", R"({"type": "BPE", "vocab": {"a": "x"}, "merges": []})")),
            "bad/tokenizer.json: $.model.vocab[\"a\"]: expected a token id (an integer in "
            "[0, 2^31)) (value: \"x\")");
  EXPECT_EQ(load_error(with("", "", R"({"type": "BPE", "vocab": {"a": 0}})")),
            "bad/tokenizer.json: $.model: missing member \"merges\" (value: {\"type\":\"BPE\","
            "\"vocab\":{\"a\":0}})");
  EXPECT_EQ(load_error(with("truncation", R"({"max_length": 8})")),
            "bad/tokenizer.json: $.truncation: truncation is not supported (expected null) "
            "(value: {\"max_length\":8})");
}

TEST(TokenizerErrors, RegexThatDoesNotCompile) {
  std::string message = load_error(
      with("pre_tokenizer",
           R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})"));
  EXPECT_TRUE(
      message.starts_with("bad/tokenizer.json: $.pre_tokenizer.pattern.Regex: the "
                          "regular expression \"(unclosed\" does not compile"))
      << message;
}

TEST(TokenizerErrors, ConfigFile) {
  std::string json = with("", "");
  try {
    Tokenizer::from_json(json, "tokenizer.json", R"({"bos_token": 5})",
                         "dir/tokenizer_config.json");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "dir/tokenizer_config.json: $.bos_token: expected a token: a string or an object "
                 "with \"content\" (value: 5)");
  }
}

TEST(TokenizerErrors, InvalidUtf8TextAndMissingDirectory) {
  auto tokenizer = Tokenizer::from_json(with("", ""), "tokenizer.json");
  try {
    tokenizer.encode("ab\xC3(", false);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "encode: the text is not valid UTF-8 (byte 2 of 4: 0xC3)");
  }
  try {
    Tokenizer::from_directory("/nonexistent/model");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "/nonexistent/model/tokenizer.json: no tokenizer.json in the tokenizer directory");
  }
}

}  // namespace
}  // namespace pagedattn::tokenizer
