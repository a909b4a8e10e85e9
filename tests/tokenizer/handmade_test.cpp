// Small hand-made tokenizer.json files, one per feature the real files do not exercise (or not
// alone): merge ranks and leftmost ties, merges as pairs, ignore_merges, NFC / NFKC, byte
// fallback and unk fusing, subword prefix / word suffix, added-token flags, the post processor
// template, split behaviors, Digits, Metaspace, ByteLevel's prefix space, the decoders. Every
// expected value is worked out by hand from tokenizers' documented rules (in the comments).
#include <gtest/gtest.h>

#include <string>

#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

// A tokenizer.json with a BPE model; the other sections are JSON text ("null" when absent).
std::string tokenizer_json(const std::string& vocab, const std::string& merges,
                           const std::string& extra_model = "",
                           const std::string& normalizer = "null",
                           const std::string& pre_tokenizer = "null",
                           const std::string& post_processor = "null",
                           const std::string& decoder = "null",
                           const std::string& added_tokens = "[]") {
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": )" +
         added_tokens + R"(, "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" +
         pre_tokenizer + R"(, "post_processor": )" + post_processor + R"(, "decoder": )" + decoder +
         R"(, "model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": )" + merges +
         extra_model + "}}";
}

Tokenizer load(const std::string& json) { return Tokenizer::from_json(json, "handmade.json"); }

const std::string kAbcVocab = R"({"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "aa": 6})";

TEST(Handmade, MergesApplyInRankOrder) {
  // "abc": pairs (a,b) rank 1 and (b,c) rank 0: b+c first, then (a,bc) has no merge.
  auto tokenizer = load(tokenizer_json(kAbcVocab, R"(["b c", "a b", "ab c"])"));
  EXPECT_EQ(tokenizer.encode("abc", false), (Ids{0, 4}));
  // With (a,b) first: ab, then (ab,c) rank 2 -> abc.
  auto other = load(tokenizer_json(kAbcVocab, R"(["a b", "b c", "ab c"])"));
  EXPECT_EQ(other.encode("abc", false), (Ids{5}));
}

TEST(Handmade, EqualRanksMergeLeftmostFirst) {
  // "aaa": both pairs are (a,a); the leftmost merges: aa a. "aaaa": aa aa (no merge aa+aa).
  auto tokenizer = load(tokenizer_json(kAbcVocab, R"(["a a"])"));
  EXPECT_EQ(tokenizer.encode("aaa", false), (Ids{6, 0}));
  EXPECT_EQ(tokenizer.encode("aaaa", false), (Ids{6, 6}));
}

TEST(Handmade, MergesAsPairsEqualMergesAsStrings) {
  auto pairs = load(tokenizer_json(kAbcVocab, R"([["a", "b"], ["b", "c"], ["ab", "c"]])"));
  EXPECT_EQ(pairs.encode("abc", false), (Ids{5}));
  EXPECT_EQ(pairs.encode("cab", false), (Ids{2, 3}));
}

TEST(Handmade, IgnoreMergesTakesAWordInTheVocabularyWhole) {
  // Only "a b" merges: "abc" -> ab c; with ignore_merges, "abc" is in the vocabulary: itself.
  EXPECT_EQ(load(tokenizer_json(kAbcVocab, R"(["a b"])")).encode("abc", false), (Ids{3, 2}));
  auto ignoring = load(tokenizer_json(kAbcVocab, R"(["a b"])", R"(, "ignore_merges": true)"));
  EXPECT_EQ(ignoring.encode("abc", false), (Ids{5}));
  EXPECT_EQ(ignoring.encode("bca", false), (Ids{1, 2, 0}));  // not in it: merged as usual
}

const std::string kUnicodeVocab =
    R"({"<unk>": 0, "f": 1, "i": 2, "fi": 3, "1": 4, "\u00e9": 5, "e": 6, "\u0301": 7})";

TEST(Handmade, NfkcFoldsCompatibilityCharacters) {
  auto tokenizer = load(tokenizer_json(kUnicodeVocab, R"(["f i"])", R"(, "unk_token": "<unk>")",
                                       R"({"type": "NFKC"})"));
  EXPECT_EQ(tokenizer.encode("\uFB01", false), (Ids{3}));   // the ligature fi -> f i -> fi
  EXPECT_EQ(tokenizer.encode("\u2460", false), (Ids{4}));   // circled one -> 1
  EXPECT_EQ(tokenizer.encode("e\u0301", false), (Ids{5}));  // composed to é
}

TEST(Handmade, NfcComposesButKeepsCompatibilityCharacters) {
  auto tokenizer = load(tokenizer_json(kUnicodeVocab, R"(["f i"])", R"(, "unk_token": "<unk>")",
                                       R"({"type": "NFC"})"));
  EXPECT_EQ(tokenizer.encode("e\u0301", false), (Ids{5}));
  EXPECT_EQ(tokenizer.encode("\uFB01", false), (Ids{0}));  // not in the vocabulary: unk
  auto plain = load(tokenizer_json(kUnicodeVocab, "[]", R"(, "unk_token": "<unk>")"));
  EXPECT_EQ(plain.encode("e\u0301", false), (Ids{6, 7}));  // no normalizer: as written
}

const std::string kByteVocab =
    R"({"<unk>": 0, "<0xE2>": 1, "<0x82>": 2, "<0xAC>": 3, "a": 4, "<0x41>": 5})";
const std::string kByteDecoder =
    R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]})";

TEST(Handmade, ByteFallbackAndUnknownCharacters) {
  auto tokenizer =
      load(tokenizer_json(kByteVocab, "[]", R"(, "unk_token": "<unk>", "byte_fallback": true)",
                          "null", "null", "null", kByteDecoder));
  // € = E2 82 AC: all three byte tokens exist. ☃ = E2 98 83: <0x98> does not: unk.
  EXPECT_EQ(tokenizer.encode("a\u20AC", false), (Ids{4, 1, 2, 3}));
  EXPECT_EQ(tokenizer.encode("\u2603\u2603a", false), (Ids{0, 0, 4}));
  auto fusing = load(tokenizer_json(
      kByteVocab, "[]", R"(, "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true)"));
  EXPECT_EQ(fusing.encode("\u2603\u2603a\u2603", false), (Ids{0, 4, 0}));
  // Decoding: a valid run is its text; an invalid run is one U+FFFD per byte token.
  EXPECT_EQ(tokenizer.decode(Ids{4, 1, 2, 3}, false), "a\u20AC");
  EXPECT_EQ(tokenizer.decode(Ids{1, 4}, false), "\uFFFDa");
  EXPECT_EQ(tokenizer.decode(Ids{1, 2, 5}, false), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(tokenizer.decode(Ids{5, 1, 2, 3, 5}, false), "A\u20ACA");
}

TEST(Handmade, ContinuingSubwordPrefixAndEndOfWordSuffix) {
  // a, ##b, ##c</w>: a+##b -> "ab" (prefix dropped from the right part), ab+##c</w> -> abc</w>.
  auto tokenizer =
      load(tokenizer_json(R"({"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "abc</w>": 4, "b": 5})",
                          R"(["a ##b", "ab ##c</w>"])",
                          R"(, "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>")"));
  EXPECT_EQ(tokenizer.encode("abc", false), (Ids{4}));
  // "ab": the last character is "##b</w>", not in the vocabulary and no unk: dropped.
  EXPECT_EQ(tokenizer.encode("ab", false), (Ids{0}));
}

const std::string kAddedTokens = R"([
  {"id": 10, "content": "<t>", "lstrip": true, "rstrip": false, "single_word": false, "normalized": false, "special": true},
  {"id": 11, "content": "<r>", "lstrip": false, "rstrip": true, "single_word": false, "normalized": false, "special": false},
  {"id": 12, "content": "ab", "lstrip": false, "rstrip": false, "single_word": true, "normalized": false, "special": false},
  {"id": 13, "content": "<n>", "lstrip": false, "rstrip": false, "single_word": false, "normalized": true, "special": true}])";

Tokenizer added_tokens_tokenizer() {
  // Normalizer: "@" -> "<n>", "r" -> "x". Model: single characters, no merges.
  return load(tokenizer_json(R"({" ": 0, "a": 1, "b": 2, "x": 3, "<": 4, ">": 5, "n": 6, "t": 7})",
                             "[]", "",
                             R"({"type": "Sequence", "normalizers": [
          {"type": "Replace", "pattern": {"String": "@"}, "content": "<n>"},
          {"type": "Replace", "pattern": {"String": "r"}, "content": "x"}]})",
                             "null", "null", "null", kAddedTokens));
}

TEST(Handmade, AddedTokenStripFlagsTakeTheWhitespaceBeside) {
  auto tokenizer = added_tokens_tokenizer();
  EXPECT_EQ(tokenizer.encode("a  <t>b", false), (Ids{1, 10, 2}));  // lstrip: "  " is the token's
  EXPECT_EQ(tokenizer.encode("a <t> b", false), (Ids{1, 10, 0, 2}));
  EXPECT_EQ(tokenizer.encode("<r>  a", false), (Ids{11, 1}));  // rstrip
  EXPECT_EQ(tokenizer.encode("a <r>", false), (Ids{1, 0, 11}));
}

TEST(Handmade, AddedTokenSingleWordNeedsNoWordCharacterBeside) {
  auto tokenizer = added_tokens_tokenizer();
  EXPECT_EQ(tokenizer.encode("ab", false), (Ids{12}));
  EXPECT_EQ(tokenizer.encode("a ab b", false), (Ids{1, 0, 12, 0, 2}));
  EXPECT_EQ(tokenizer.encode("bab", false), (Ids{2, 1, 2}));  // letter before
  EXPECT_EQ(tokenizer.encode("ab_", false), (Ids{1, 2}));     // '_' after; '_' unknown
}

TEST(Handmade, AddedTokensNormalizedOrNot) {
  auto tokenizer = added_tokens_tokenizer();
  // <r> (normalized=false) is found before the normalizer would turn its r into x.
  EXPECT_EQ(tokenizer.encode("<r>", false), (Ids{11}));
  EXPECT_EQ(tokenizer.encode("r", false), (Ids{3}));
  // <n> (normalized=true) is found in the normalized text, also where "@" became it.
  EXPECT_EQ(tokenizer.encode("<n>", false), (Ids{13}));
  EXPECT_EQ(tokenizer.encode("a@", false), (Ids{1, 13}));
}

TEST(Handmade, DecodeSkipsSpecialAddedTokensAndJoinsWithoutDecoder) {
  auto tokenizer = added_tokens_tokenizer();
  // No decoder: the tokens joined by spaces. 10 and 13 are special; 11 is not.
  EXPECT_EQ(tokenizer.decode(Ids{1, 10, 2}, false), "a <t> b");
  EXPECT_EQ(tokenizer.decode(Ids{1, 10, 2, 11, 13}, true), "a b <r>");
  EXPECT_EQ(tokenizer.decode(Ids{1, 99, 2}, false), "a b");  // past the vocabulary: dropped
  EXPECT_TRUE(tokenizer.is_special(10));
  EXPECT_FALSE(tokenizer.is_special(11));
  EXPECT_EQ(tokenizer.vocab_size(), 14);
}

TEST(Handmade, TemplateProcessingAddsBosAndEos) {
  auto tokenizer = load(tokenizer_json(R"({"<s>": 0, "</s>": 1, "a": 2})", "[]", "", "null", "null",
                                       R"({"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
          "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                                         "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}})"));
  EXPECT_EQ(tokenizer.encode("aa", true), (Ids{0, 2, 2, 1}));
  EXPECT_EQ(tokenizer.encode("aa", false), (Ids{2, 2}));
  EXPECT_EQ(tokenizer.encode("", true), (Ids{0, 1}));
}

TEST(Handmade, MetaspacePrependFirstOnlyAtTheStartOfTheInput) {
  // prepend_scheme "first": "▁" before the word at input offset 0 only; after an added token the
  // text does not start the input, so "a" stays bare there.
  auto tokenizer = load(tokenizer_json(
      R"({"\u2581": 0, "a": 1, "b": 2, "\u2581a": 3, "\u2581b": 4, "<s>": 5})",
      R"(["\u2581 a", "\u2581 b"])", "", "null",
      R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})",
      "null", "null",
      R"([{"id": 5, "content": "<s>", "special": true, "normalized": false, "lstrip": false,
           "rstrip": false, "single_word": false}])"));
  EXPECT_EQ(tokenizer.encode("a b", false), (Ids{3, 4}));
  EXPECT_EQ(tokenizer.encode("<s>a b", false), (Ids{5, 1, 4}));
}

}  // namespace
}  // namespace pagedattn::tokenizer
