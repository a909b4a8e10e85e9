// A compiled regular expression of a tokenizer file (PCRE2, UTF + UCP, JIT-compiled), with the
// match iteration `tokenizers` uses: leftmost non-overlapping matches, scanning on one character
// past an empty match.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedattn::tokenizer {

class Regex {
 public:
  // `where` names the pattern's file and JSON path for a compile error.
  Regex(std::string_view pattern, std::string_view where);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // Appends the [start, end) byte ranges of every match in `text` (valid UTF-8).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

// A literal string as a pattern (the "String" form of a pattern in tokenizer.json).
void find_all_literal(std::string_view text, std::string_view literal,
                      std::vector<std::pair<size_t, size_t>>& matches);

}  // namespace pagedattn::tokenizer
