// AddedVocabulary (see added_vocabulary.h).
#include "added_vocabulary.h"

#include <algorithm>

#include "normalizer.h"
#include "unicode.h"

namespace pagedattn::tokenizer {

AddedVocabulary::AddedVocabulary(const JsonNode& added_tokens, const Normalizer* normalizer) {
  for (const JsonNode& item : added_tokens.items()) {
    AddedToken token;
    token.content = item.at("content").string();
    int64_t id = item.at("id").integer();
    if (id < 0 || id > INT32_MAX) item.at("id").fail("expected a token id in [0, 2^31)");
    token.id = static_cast<TokenId>(id);
    token.special = item.boolean_or("special", false);
    token.lstrip = item.boolean_or("lstrip", false);
    token.rstrip = item.boolean_or("rstrip", false);
    token.single_word = item.boolean_or("single_word", false);
    token.normalized = item.boolean_or("normalized", !token.special);
    if (token.content.empty()) item.at("content").fail("an added token must not be empty");
    if (!is_valid_utf8(token.content)) item.at("content").fail("not valid UTF-8");
    by_id_[token.id] = tokens_.size();
    by_content_.emplace(token.content, tokens_.size());
    max_id_ = std::max(max_id_, token.id);
    tokens_.push_back(std::move(token));
  }
  for (Trie& trie : tries_) trie.patterns.resize(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    Trie& trie = tries_[token.normalized ? 1 : 0];
    std::string pattern = token.content;
    if (token.normalized && normalizer) normalizer->normalize(pattern);
    if (pattern.empty()) continue;
    trie.by_first_byte[static_cast<unsigned char>(pattern[0])].push_back(static_cast<uint32_t>(i));
    trie.patterns[i] = std::move(pattern);
  }
  for (Trie& trie : tries_) {
    bool any = false;
    for (auto& bucket : trie.by_first_byte) {
      any = any || !bucket.empty();
      std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
        return trie.patterns[a].size() > trie.patterns[b].size();
      });
    }
    if (!any) trie.patterns.clear();
  }
}

const AddedToken* AddedVocabulary::find_id(TokenId id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

namespace {

// The character that ends right before `position` / starts at `position`.
char32_t codepoint_before(std::string_view text, size_t position) {
  size_t start = position - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_codepoint(text, start);
}

bool is_word_character(char32_t codepoint) {
  return codepoint == '_' || is_alphanumeric(codepoint);
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized,
                            std::vector<Segment>& out) const {
  const Trie& trie = tries_[normalized ? 1 : 0];
  if (trie.empty()) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return;
  }
  size_t emitted = 0;  // text before this is in `out`
  size_t position = 0;
  while (position < text.size()) {
    const auto& bucket = trie.by_first_byte[static_cast<unsigned char>(text[position])];
    const AddedToken* match = nullptr;
    size_t match_length = 0;
    for (uint32_t index : bucket) {
      const std::string& pattern = trie.patterns[index];
      if (text.substr(position).starts_with(pattern)) {
        match = &tokens_[index];
        match_length = pattern.size();
        break;
      }
    }
    if (match == nullptr) {
      ++position;
      continue;
    }
    size_t start = position, stop = position + match_length;
    position = stop;  // the next search starts after this match, kept or not
    if (match->single_word) {
      bool word_before = start > 0 && is_word_character(codepoint_before(text, start));
      size_t after = stop;
      bool word_after = stop < text.size() && is_word_character(next_codepoint(text, after));
      if (word_before || word_after) continue;
    }
    if (match->lstrip) {
      while (start > emitted) {
        size_t previous = start - 1;
        while (previous > 0 && (static_cast<unsigned char>(text[previous]) & 0xC0) == 0x80) {
          --previous;
        }
        size_t probe = previous;
        if (!is_whitespace(next_codepoint(text, probe))) break;
        start = previous;
      }
    }
    if (match->rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_whitespace(next_codepoint(text, next))) break;
        stop = next;
      }
      position = stop;
    }
    if (start > emitted) out.push_back({emitted, start, -1});
    out.push_back({start, stop, match->id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace pagedattn::tokenizer
