// Added tokens (tokenizer.json "added_tokens"): split out of the text before the normalizer and
// the model, as tokenizers' AddedVocabulary does. Tokens with normalized=false are found in the
// raw text; the rest of the text is normalized, and tokens with normalized=true are then found
// (by their normalized content) in it.
//
// Matching is leftmost-longest and non-overlapping: at the first position where a token starts,
// the longest one. lstrip / rstrip extend a match over the whitespace beside it; single_word
// discards a match with a word character (alphanumeric or '_') right beside it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_node.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {

class Normalizer;

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = true;
};

// A piece of text: an added token (id >= 0) or text for the pipeline (id < 0), [start, end).
struct Segment {
  size_t start, end;
  TokenId id;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  AddedVocabulary(const JsonNode& added_tokens, const Normalizer* normalizer);

  // Splits `text` by the tokens with normalized == `normalized`; appends the segments.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

  const AddedToken* find_id(TokenId id) const;
  const AddedToken* find_content(std::string_view content) const;
  bool empty() const { return tokens_.empty(); }
  bool has_normalized() const { return !tries_[1].empty(); }
  TokenId max_id() const { return max_id_; }

 private:
  // The tokens by first byte, longest first (ties: in file order).
  struct Trie {
    std::array<std::vector<uint32_t>, 256> by_first_byte;  // indices into tokens_
    std::vector<std::string> patterns;                     // by index into tokens_
    bool empty() const { return patterns.empty(); }
  };
  std::vector<AddedToken> tokens_;
  std::array<Trie, 2> tries_;  // [0]: normalized=false (raw text), [1]: normalized=true
  std::unordered_map<TokenId, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  TokenId max_id_ = -1;
};

}  // namespace pagedattn::tokenizer
