// The pattern of a Split pre-tokenizer or a Replace normalizer / decoder: {"String": literal} or
// {"Regex": PCRE2 pattern}.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json_node.h"
#include "regex.h"

namespace pagedattn::tokenizer {

class Pattern {
 public:
  explicit Pattern(const JsonNode& node);
  // Appends the [start, end) byte ranges of the matches in `text`.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;
  // Replaces every match in `text` by `content` (no copy when nothing matches).
  void replace_all(std::string& text, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;  // null for a literal
};

}  // namespace pagedattn::tokenizer
