// The BPE model (tokenizer.json "model" of type BPE): a word -> token ids by merging adjacent
// symbols in rank order, as tokenizers' BPE does.
//
// A word's characters start as symbols (their vocabulary ids; unknown characters become <0xNN>
// byte tokens with byte_fallback, else the unk token, fused with fuse_unk); then the pair of
// lowest merge rank (leftmost among equals) is merged until none is left: a min-heap of candidate
// merges over a doubly linked list of symbols, stale entries skipped when popped. The merge
// table maps the pair of ids to (rank, merged id) in one hash lookup. ignore_merges takes a word
// that is itself in the vocabulary whole. Results are cached per word.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_node.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using Vocabulary = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

class Bpe {
 public:
  explicit Bpe(const JsonNode& model);

  // Appends the ids of one word.
  void tokenize(std::string_view word, std::vector<TokenId>& ids) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(TokenId id) const;
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  void merge_word(std::string_view word, std::vector<TokenId>& ids) const;
  std::optional<TokenId> lookup(std::string_view token) const;

  Vocabulary vocabulary_;
  std::vector<std::string> tokens_;     // by id ("" for ids without a token)
  std::vector<TokenId> codepoint_ids_;  // id of single characters below U+10000, -1 if none
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<TokenId, 256> byte_ids_{};  // <0xNN> tokens (byte_fallback), -1 if absent
  std::optional<TokenId> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;

  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordLength = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_;
};

}  // namespace pagedattn::tokenizer
