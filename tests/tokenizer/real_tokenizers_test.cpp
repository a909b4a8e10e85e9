// The four real tokenizers against Hugging Face `tokenizers` 0.23 (fixtures written by
// scripts/fixtures/tokenizer_fixtures.py on the corpus): every corpus line encoded with and
// without special tokens, decoded with and without skip_special_tokens, and random id sequences
// (invalid UTF-8 included) decoded. 100% equality; the first mismatch of each kind is printed
// with its line, text, expected and actual values, and the count of the rest.
#include "real_tokenizers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>
#include <optional>

namespace pagedattn::tokenizer::testing {
namespace {

std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, EncodeEqualsTokenizersOnEveryCorpusLine) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const Fixtures& expected = fixtures(GetParam());
  int mismatches = 0;
  for (size_t line = 0; line < expected.corpus.size(); ++line) {
    const CorpusCase& item = expected.corpus[line];
    for (bool special : {false, true}) {
      auto ids = tokenizer.encode(item.text, special);
      const auto& want = special ? item.ids_special : item.ids;
      if (ids == want) continue;
      if (mismatches++ == 0) {
        ADD_FAILURE() << GetParam() << " corpus line " << line + 1
                      << " add_special_tokens=" << special << "\n  text:     " << quoted(item.text)
                      << "\n  expected: " << format_ids(want)
                      << "\n  got:      " << format_ids(ids);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "encodings differing from tokenizers (first one above)";
}

TEST_P(RealTokenizer, DecodeEqualsTokenizersOnEveryCorpusLine) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const Fixtures& expected = fixtures(GetParam());
  int mismatches = 0;
  for (size_t line = 0; line < expected.corpus.size(); ++line) {
    const CorpusCase& item = expected.corpus[line];
    struct Check {
      const std::vector<TokenId>& ids;
      bool skip;
      const std::string& want;
    };
    for (const Check& check :
         {Check{item.ids, false, item.decoded}, Check{item.ids, true, item.decoded_skip},
          Check{item.ids_special, false, item.decoded_special},
          Check{item.ids_special, true, item.decoded_special_skip}}) {
      std::string text = tokenizer.decode(check.ids, check.skip);
      if (text == check.want) continue;
      if (mismatches++ == 0) {
        ADD_FAILURE() << GetParam() << " corpus line " << line + 1
                      << " skip_special_tokens=" << check.skip
                      << "\n  ids:      " << format_ids(check.ids)
                      << "\n  expected: " << quoted(check.want) << "\n  got:      " << quoted(text);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "decodes differing from tokenizers (first one above)";
}

TEST_P(RealTokenizer, DecodeOfRandomIdsEqualsTokenizers) {
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const Fixtures& expected = fixtures(GetParam());
  ASSERT_GT(expected.random.size(), 300u);
  int mismatches = 0;
  for (size_t i = 0; i < expected.random.size(); ++i) {
    const DecodeCase& item = expected.random[i];
    for (bool skip : {false, true}) {
      std::string text = tokenizer.decode(item.ids, skip);
      const std::string& want = skip ? item.decoded_skip : item.decoded;
      if (text == want) continue;
      if (mismatches++ == 0) {
        ADD_FAILURE() << GetParam() << " random sequence " << i << " skip_special_tokens=" << skip
                      << "\n  ids:      " << format_ids(item.ids)
                      << "\n  expected: " << quoted(want) << "\n  got:      " << quoted(text);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "decodes differing from tokenizers (first one above)";
}

TEST_P(RealTokenizer, ThreadsShareOneTokenizer) {
  // Four threads encode interleaved corpus lines at once (the word cache is shared): every
  // line as tokenizers has it.
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const Fixtures& expected = fixtures(GetParam());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (size_t thread = 0; thread < 4; ++thread) {
    threads.emplace_back([&, thread] {
      for (size_t line = thread; line < expected.corpus.size(); line += 4) {
        if (tokenizer.encode(expected.corpus[line].text, false) != expected.corpus[line].ids) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(RealTokenizer, ConfigSpecialTokens) {
  // From the shipped tokenizer_config.json files (bos, eos, their ids, add_bos_token).
  struct Expected {
    std::optional<std::string> bos;
    std::optional<TokenId> bos_id;
    std::string eos;
    TokenId eos_id;
    std::optional<bool> add_bos;
    bool has_template;
  };
  static const std::map<std::string, Expected> table = {
      {"qwen3", {std::nullopt, std::nullopt, "<|im_end|>", 151645, false, true}},
      {"deepseek_v3", {"<｜begin▁of▁sentence｜>", 0, "<｜end▁of▁sentence｜>", 1, true, true}},
      {"llama3", {"<|begin_of_text|>", 128000, "<|eot_id|>", 128009, std::nullopt, true}},
      {"llama2", {"<s>", 1, "</s>", 2, true, false}},
  };
  const Tokenizer& tokenizer = real_tokenizer(GetParam());
  const TokenizerConfig& config = tokenizer.config();
  const Expected& want = table.at(GetParam());
  EXPECT_EQ(config.bos_token, want.bos);
  EXPECT_EQ(config.bos_token_id, want.bos_id);
  EXPECT_EQ(config.eos_token, want.eos);
  EXPECT_EQ(config.eos_token_id, want.eos_id);
  EXPECT_EQ(config.add_bos_token, want.add_bos);
  EXPECT_TRUE(tokenizer.is_special(want.eos_id));
  EXPECT_EQ(tokenizer.chat_template().has_value(), want.has_template);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, RealTokenizer, ::testing::ValuesIn(kRealTokenizers),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedattn::tokenizer::testing
