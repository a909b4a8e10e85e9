// Pattern (see pattern.h): literal search or a PCRE2 regex.
#include "pattern.h"

namespace pagedattn::tokenizer {

Pattern::Pattern(const JsonNode& node) {
  if (auto literal = node.find("String")) {
    literal_ = literal->string();
  } else if (auto regex = node.find("Regex")) {
    regex_ = std::make_unique<Regex>(regex->string(), node.file() + ": " + regex->path());
  } else {
    node.fail("expected a pattern {\"String\": ...} or {\"Regex\": ...}");
  }
}

void Pattern::find_all(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>& matches) const {
  if (regex_) {
    regex_->find_all(text, matches);
  } else {
    find_all_literal(text, literal_, matches);
  }
}

void Pattern::replace_all(std::string& text, std::string_view content) const {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  find_all(text, matches);
  if (matches.empty()) return;
  std::string result;
  result.reserve(text.size() + matches.size() * content.size());
  size_t previous = 0;
  for (auto [start, end] : matches) {
    result.append(text, previous, start - previous);
    result.append(content);
    previous = end;
  }
  result.append(text, previous);
  text = std::move(result);
}

}  // namespace pagedattn::tokenizer
