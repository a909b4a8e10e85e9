// The four real tokenizers (fetched at test set-up by scripts/fetch-tokenizers into the build
// tree: the CTest fixture tokenizer_files) and their Hugging Face fixtures
// (tests/data/tokenizer/<name>.jsonl, written by scripts/fixtures/tokenizer_fixtures.py).
#pragma once

#include <string>
#include <vector>

#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer::testing {

inline const std::vector<std::string> kRealTokenizers = {"qwen3", "deepseek_v3", "llama3",
                                                         "llama2"};

// Loaded once per process: $PAGEDATTN_TOKENIZERS/<name>, else the build tree's directory.
const Tokenizer& real_tokenizer(const std::string& name);
// That directory (tokenizer.json, tokenizer_config.json).
std::string real_tokenizer_directory(const std::string& name);

// One corpus line and what `tokenizers` made of it (defaults filled in; see the fixture script).
struct CorpusCase {
  std::string text;
  std::vector<TokenId> ids, ids_special;
  std::string decoded, decoded_skip, decoded_special, decoded_special_skip;
};
// A random id sequence and its decodes.
struct DecodeCase {
  std::vector<TokenId> ids;
  std::string decoded, decoded_skip;
};
struct Fixtures {
  std::vector<CorpusCase> corpus;
  std::vector<DecodeCase> random;
};
const Fixtures& fixtures(const std::string& name);

// The corpus lines (tests/data/tokenizer/corpus.jsonl).
const std::vector<std::string>& corpus();

// Ids as "[1, 2, 3]" for messages.
std::string format_ids(const std::vector<TokenId>& ids);

}  // namespace pagedattn::tokenizer::testing
