// Pre-tokenizers (see pre_tokenizer.h). A split turns the matches of a pattern in a word into
// (range, is_match) pieces covering it, then keeps or merges them by the behavior, exactly as
// tokenizers' NormalizedString::split does; empty pieces are dropped.
#include "pre_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "pattern.h"
#include "regex.h"
#include "unicode.h"

namespace pagedattn::tokenizer {

void split_range(uint32_t start, uint32_t end,
                 const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                 bool invert, std::vector<std::pair<uint32_t, uint32_t>>& out) {
  struct Piece {
    uint32_t start, end;
    bool is_match;
  };
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  uint32_t previous = start;
  for (auto [match_start, match_end] : matches) {
    auto first = static_cast<uint32_t>(match_start), last = static_cast<uint32_t>(match_end);
    if (first > previous) pieces.push_back({previous, first, invert});
    pieces.push_back({first, last, !invert});
    previous = last;
  }
  if (previous < end) pieces.push_back({previous, end, invert});

  thread_local std::vector<std::pair<uint32_t, uint32_t>> kept;
  kept.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Piece& piece : pieces) kept.emplace_back(piece.start, piece.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Piece& piece : pieces) {
        if (!piece.is_match) kept.emplace_back(piece.start, piece.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Piece& piece : pieces) {
        if (piece.is_match && !previous_match && !kept.empty()) {
          kept.back().second = piece.end;
        } else {
          kept.emplace_back(piece.start, piece.end);
        }
        previous_match = piece.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t i = pieces.size(); i-- > 0;) {
        const Piece& piece = pieces[i];
        if (piece.is_match && !previous_match && !kept.empty()) {
          kept.back().first = piece.start;
        } else {
          kept.emplace_back(piece.start, piece.end);
        }
        previous_match = piece.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (i > 0 && pieces[i].is_match == previous_match) {
          kept.back().second = pieces[i].end;
        } else {
          kept.emplace_back(pieces[i].start, pieces[i].end);
        }
        previous_match = pieces[i].is_match;
      }
      break;
  }
  for (auto range : kept) {
    if (range.second > range.first) out.push_back(range);
  }
}

namespace {

SplitBehavior behavior_of(const JsonNode& node) {
  std::string name = node.string();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  node.fail(
      fmt::format("unknown split behavior \"{}\" (supported: Removed, Isolated, "
                  "MergedWithPrevious, MergedWithNext, Contiguous)",
                  name));
}

// Splits every word by the matches of `find` (a callable (text, matches&)).
template <class Find>
void split_words(Words& words, Words& scratch, SplitBehavior behavior, bool invert,
                 const Find& find) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  scratch.ranges.clear();
  for (auto [start, end] : words.ranges) {
    matches.clear();
    std::string_view word = std::string_view(words.text).substr(start, end - start);
    find(word, matches);
    for (auto& match : matches) {
      match.first += start;
      match.second += start;
    }
    split_range(start, end, matches, behavior, invert, scratch.ranges);
  }
  words.ranges.swap(scratch.ranges);
}

class Split final : public PreTokenizer {
 public:
  explicit Split(const JsonNode& node)
      : pattern_(node.at("pattern")),
        behavior_(behavior_of(node.at("behavior"))),
        invert_(node.boolean_or("invert", false)) {}
  void pre_tokenize(Words& words, Words& scratch) const override {
    split_words(words, scratch, behavior_, invert_,
                [&](std::string_view text, auto& matches) { pattern_.find_all(text, matches); });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pattern, which ByteLevel splits with when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Maps every byte to GPT-2's printable alphabet (after an optional space and regex split).
class ByteLevel final : public PreTokenizer {
 public:
  explicit ByteLevel(const JsonNode& node)
      : add_prefix_space_(node.boolean_or("add_prefix_space", true)) {
    if (node.boolean_or("use_regex", true)) {
      regex_ = std::make_unique<Regex>(kGpt2Pattern, node.file() + ": " + node.path());
    }
  }
  void pre_tokenize(Words& words, Words& scratch) const override {
    if (add_prefix_space_) {  // a space before every word that lacks one
      scratch.text.clear();
      scratch.ranges.clear();
      for (auto [start, end] : words.ranges) {
        auto begin = static_cast<uint32_t>(scratch.text.size());
        if (words.text[start] != ' ') scratch.text += ' ';
        scratch.text.append(words.text, start, end - start);
        scratch.ranges.emplace_back(begin, static_cast<uint32_t>(scratch.text.size()));
      }
      std::swap(words.text, scratch.text);
      words.ranges.swap(scratch.ranges);
    }
    if (regex_) {
      split_words(words, scratch, SplitBehavior::kIsolated, false,
                  [&](std::string_view text, auto& matches) { regex_->find_all(text, matches); });
    }
    const ByteAlphabet& alphabet = byte_alphabet();
    scratch.text.clear();
    scratch.ranges.clear();
    for (auto [start, end] : words.ranges) {
      auto begin = static_cast<uint32_t>(scratch.text.size());
      for (uint32_t i = start; i < end; ++i) {
        scratch.text += alphabet.char_of_byte[static_cast<unsigned char>(words.text[i])];
      }
      scratch.ranges.emplace_back(begin, static_cast<uint32_t>(scratch.text.size()));
    }
    std::swap(words.text, scratch.text);
    words.ranges.swap(scratch.ranges);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

// Digits: every Unicode number character (\p{N}, Rust's char::is_numeric) on its own, or runs.
class Digits final : public PreTokenizer {
 public:
  explicit Digits(const JsonNode& node)
      : individual_(node.boolean_or("individual_digits", false)),
        regex_(R"(\p{N})", node.file() + ": " + node.path()) {}
  void pre_tokenize(Words& words, Words& scratch) const override {
    split_words(words, scratch, individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                false,
                [&](std::string_view text, auto& matches) { regex_.find_all(text, matches); });
  }

 private:
  bool individual_;
  Regex regex_;
};

// Metaspace: spaces become the replacement character ("▁"), which is prepended by the
// prepend scheme and, with split, starts every word.
class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(const JsonNode& node)
      : replacement_(node.string_or("replacement", "\u2581")),
        split_(node.boolean_or("split", true)) {
    std::string scheme = node.string_or("prepend_scheme", "");
    if (scheme.empty()) scheme = node.boolean_or("add_prefix_space", true) ? "always" : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      node.at("prepend_scheme").fail("unknown prepend_scheme (supported: always, first, never)");
    }
    prepend_ = scheme == "always" ? 2 : scheme == "first" ? 1 : 0;
  }
  void pre_tokenize(Words& words, Words& scratch) const override {
    scratch.text.clear();
    scratch.ranges.clear();
    for (auto [start, end] : words.ranges) {
      auto begin = static_cast<uint32_t>(scratch.text.size());
      std::string_view word = std::string_view(words.text).substr(start, end - start);
      bool starts_with_replacement = word.starts_with(replacement_) || (word.starts_with(' '));
      // "first": only the word at the very start of the input (tokenizers: original offset 0).
      bool first = words.first_segment && start == 0;
      if (!starts_with_replacement && (prepend_ == 2 || (prepend_ == 1 && first))) {
        scratch.text += replacement_;
      }
      for (char c : word) {
        if (c == ' ') {
          scratch.text += replacement_;
        } else {
          scratch.text += c;
        }
      }
      scratch.ranges.emplace_back(begin, static_cast<uint32_t>(scratch.text.size()));
    }
    std::swap(words.text, scratch.text);
    words.ranges.swap(scratch.ranges);
    if (split_) {
      split_words(words, scratch, SplitBehavior::kMergedWithNext, false,
                  [&](std::string_view text, auto& matches) {
                    find_all_literal(text, replacement_, matches);
                  });
    }
  }

 private:
  std::string replacement_;
  bool split_;
  int prepend_;  // 0 never, 1 first, 2 always
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(const JsonNode& node) {
    for (const JsonNode& item : node.at("pretokenizers").items()) {
      members_.push_back(make_pre_tokenizer(item));
    }
  }
  void pre_tokenize(Words& words, Words& scratch) const override {
    for (const auto& member : members_) member->pre_tokenize(words, scratch);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> members_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonNode& node) {
  std::string type =
      node.type("pre-tokenizer", {"Split", "ByteLevel", "Digits", "Metaspace", "Sequence"});
  if (type == "Split") return std::make_unique<Split>(node);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(node);
  if (type == "Digits") return std::make_unique<Digits>(node);
  if (type == "Metaspace") return std::make_unique<Metaspace>(node);
  return std::make_unique<Sequence>(node);
}

}  // namespace pagedattn::tokenizer
