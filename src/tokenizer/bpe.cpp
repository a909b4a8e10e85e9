// BPE (see bpe.h). Reading: vocab {token: id}; merges as "a b" strings or [a, b] pairs, rank =
// position; the merged token is a + b without b's continuing_subword_prefix, and must be in the
// vocabulary. Word -> ids: see merge_word.
#include "bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "core/check.h"
#include "unicode.h"

namespace pagedattn::tokenizer {

Bpe::Bpe(const JsonNode& model) {
  if (auto dropout = model.find("dropout"); dropout && dropout->number() != 0.0) {
    dropout->fail("BPE dropout is random; it is not supported");
  }
  JsonNode vocabulary = model.at("vocab");
  if (!vocabulary.is_object()) vocabulary.fail("expected an object {token: id}");
  TokenId max_id = -1;
  for (const auto& [token, id] : vocabulary.value().items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      JsonNode(id, model.file(), vocabulary.path() + "[\"" + token + "\"]")
          .fail("expected a token id (an integer in [0, 2^31))");
    }
    auto value = static_cast<TokenId>(id.get<int64_t>());
    vocabulary_.emplace(token, value);
    max_id = std::max(max_id, value);
  }
  tokens_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocabulary_) tokens_[static_cast<size_t>(id)] = token;

  continuing_subword_prefix_ = model.string_or("continuing_subword_prefix", "");
  end_of_word_suffix_ = model.string_or("end_of_word_suffix", "");
  byte_fallback_ = model.boolean_or("byte_fallback", false);
  fuse_unk_ = model.boolean_or("fuse_unk", false);
  ignore_merges_ = model.boolean_or("ignore_merges", false);
  if (auto unk = model.find("unk_token")) {
    unk_id_ = lookup(unk->string());
    if (!unk_id_) unk->fail("the unk token is not in the vocabulary");
  }
  for (int byte = 0; byte < 256; ++byte) {
    byte_ids_[byte] = lookup(fmt::format("<0x{:02X}>", byte)).value_or(-1);
  }
  codepoint_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocabulary_) {
    size_t position = 0;
    if (token.empty()) continue;
    char32_t codepoint = next_codepoint(token, position);
    if (position == token.size() && codepoint < 0x10000) codepoint_ids_[codepoint] = id;
  }

  JsonNode merges = model.at("merges");
  size_t count = merges.size();
  merges_.reserve(count);
  for (size_t rank = 0; rank < count; ++rank) {
    JsonNode merge = merges.at(rank);
    std::string left, right;
    if (merge.is_string()) {
      std::string text = merge.string();
      size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        merge.fail("expected a merge \"left right\" (two tokens and one space)");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge.at(0).string();
      right = merge.at(1).string();
    } else {
      merge.fail("expected a merge \"left right\" or [\"left\", \"right\"]");
    }
    auto left_id = lookup(left), right_id = lookup(right);
    if (!left_id || !right_id) merge.fail("a token of this merge is not in the vocabulary");
    std::string merged =
        left + right.substr(std::min(right.size(), right.starts_with(continuing_subword_prefix_)
                                                       ? continuing_subword_prefix_.size()
                                                       : size_t{0}));
    auto merged_id = lookup(merged);
    if (!merged_id)
      merge.fail(fmt::format("the merged token \"{}\" is not in the vocabulary", merged));
    merges_.emplace(pair_key(*left_id, *right_id), Merge{static_cast<int32_t>(rank), *merged_id});
  }
}

std::optional<TokenId> Bpe::lookup(std::string_view token) const {
  auto it = vocabulary_.find(token);
  if (it == vocabulary_.end()) return std::nullopt;
  return it->second;
}

std::optional<TokenId> Bpe::token_to_id(std::string_view token) const { return lookup(token); }

std::optional<std::string_view> Bpe::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return std::nullopt;
  if (tokens_[static_cast<size_t>(id)].empty()) return std::nullopt;
  return tokens_[static_cast<size_t>(id)];
}

void Bpe::tokenize(std::string_view word, std::vector<TokenId>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = lookup(word)) {
      ids.push_back(*id);
      return;
    }
  }
  bool cacheable = word.size() <= kCacheMaxWordLength;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(word), std::vector<TokenId>(ids.begin() + first, ids.end()));
    }
  }
}

void Bpe::merge_word(std::string_view word, std::vector<TokenId>& ids) const {
  struct Symbol {
    TokenId id;
    int32_t previous, next;
    bool removed;
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](TokenId id) {
    auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, false});
  };

  // Characters -> symbols (tokenizers' BPE::merge_word).
  bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  std::optional<TokenId> pending_unk;
  std::string decorated;
  for (size_t position = 0; position < word.size();) {
    size_t start = position;
    char32_t codepoint = next_codepoint(word, position);
    std::string_view character = word.substr(start, position - start);
    std::optional<TokenId> id;
    if (plain) {
      if (codepoint < 0x10000) {
        if (codepoint_ids_[codepoint] >= 0) id = codepoint_ids_[codepoint];
      } else {
        id = lookup(character);
      }
    } else {
      decorated.clear();
      if (start > 0) decorated += continuing_subword_prefix_;
      decorated += character;
      if (position == word.size()) decorated += end_of_word_suffix_;
      id = lookup(decorated);
      character = decorated;
    }
    if (id) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      add(*id);
      continue;
    }
    if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      for (char c : character) add(byte_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk) add(*pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Merge by rank, leftmost first among equal ranks.
  struct Candidate {
    int32_t rank, position;
    TokenId merged;
    bool operator<(const Candidate& other) const {  // the heap's top is the smallest
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push = [&](int32_t position, TokenId left, TokenId right) {
    auto it = merges_.find(pair_key(left, right));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, position, it->second.merged});
    std::push_heap(heap.begin(), heap.end());
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    push(static_cast<int32_t>(i), symbols[i].id, symbols[i + 1].id);
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[static_cast<size_t>(top.position)];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    auto current = merges_.find(pair_key(left.id, right.id));
    if (current == merges_.end() || current->second.merged != top.merged) continue;  // stale
    left.id = top.merged;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].previous = top.position;
    if (left.previous >= 0) {
      push(left.previous, symbols[static_cast<size_t>(left.previous)].id, left.id);
    }
    if (left.next >= 0) push(top.position, left.id, symbols[static_cast<size_t>(left.next)].id);
  }
  for (const Symbol& symbol : symbols) {
    if (!symbol.removed) ids.push_back(symbol.id);
  }
}

}  // namespace pagedattn::tokenizer
