// IncrementalDecoder properties on the real tokenizers: fed one id at a time, the pieces are each
// valid UTF-8 (no character split) and concatenate to exactly decode(all ids) — checked on every
// corpus line (with and without special tokens, skipping them or not) and on the random id
// sequences of the fixtures (invalid UTF-8, byte-fallback runs, ids past the vocabulary), where
// decode(all ids) is also the fixture's (Hugging Face's) string.
#include <gtest/gtest.h>

#include "real_tokenizers.h"
#include "tokenizer/unicode.h"

namespace pagedattn::tokenizer::testing {
namespace {

// Streams `ids`; returns the concatenation, failing the test on a piece that is not valid UTF-8.
std::string stream(IncrementalDecoder& decoder, const std::vector<TokenId>& ids, bool& valid) {
  std::string text;
  for (TokenId id : ids) {
    std::string piece = decoder.feed(id);
    valid = valid && is_valid_utf8(piece);
    text += piece;
  }
  std::string rest = decoder.finish();
  valid = valid && is_valid_utf8(rest);
  return text + rest;
}

class Incremental : public ::testing::TestWithParam<std::string> {};

TEST_P(Incremental, PiecesConcatenateToDecodeOnCorpus) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  int mismatches = 0;
  for (bool skip : {false, true}) {
    IncrementalDecoder decoder(tokenizer, skip);  // reused: finish() resets it
    for (const CorpusCase& item : fixtures(GetParam()).corpus) {
      for (const auto* ids : {&item.ids, &item.ids_special}) {
        bool valid = true;
        std::string streamed = stream(decoder, *ids, valid);
        std::string whole = tokenizer.decode(*ids, skip);
        if (streamed == whole && valid) continue;
        if (mismatches++ == 0) {
          ADD_FAILURE() << GetParam() << " skip=" << skip << " ids " << format_ids(*ids)
                        << "\n  decode:   " << whole << "\n  streamed: " << streamed
                        << "\n  pieces valid UTF-8: " << valid;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(Incremental, PiecesConcatenateToHuggingFaceDecodeOnRandomIds) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  int mismatches = 0;
  for (const DecodeCase& item : fixtures(GetParam()).random) {
    for (bool skip : {false, true}) {
      IncrementalDecoder decoder(tokenizer, skip);
      bool valid = true;
      std::string streamed = stream(decoder, item.ids, valid);
      const std::string& want = skip ? item.decoded_skip : item.decoded;
      if (streamed == want && valid) continue;
      if (mismatches++ == 0) {
        ADD_FAILURE() << GetParam() << " skip=" << skip << " ids " << format_ids(item.ids)
                      << "\n  expected: " << want << "\n  streamed: " << streamed
                      << "\n  pieces valid UTF-8: " << valid;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(Incremental, ReleasesTextAsSoonAsCharactersAreComplete) {
  // A long text streamed: nothing is held back longer than a character's bytes or a run of
  // byte-fallback tokens (Llama 2 spells emoji sequences that way: ~100 bytes), so the released
  // text trails decode(prefix) by little.
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  std::string text;
  for (size_t i = 0; i < 60; ++i) text += corpus()[i] + "\n";
  auto ids = tokenizer.encode(text, false);
  IncrementalDecoder decoder(tokenizer, false);
  std::string released;
  size_t max_held = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    released += decoder.feed(ids[i]);
    std::string whole = tokenizer.decode(std::span(ids).first(i + 1), false);
    ASSERT_TRUE(whole.starts_with(released)) << "released text is not a prefix at id " << i;
    max_held = std::max(max_held, whole.size() - released.size());
  }
  EXPECT_LE(max_held, 128u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Incremental, ::testing::ValuesIn(kRealTokenizers),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedattn::tokenizer::testing
