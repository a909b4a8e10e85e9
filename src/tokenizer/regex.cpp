// Regex over PCRE2 (see regex.h). \s and \S are rewritten as Unicode White_Space classes first
// (see with_white_space_spelled_out), the one difference from Oniguruma these patterns hit. The
// patterns of real tokenizer files use Unicode properties
// (\p{L}, \p{N}), case-insensitive groups and look-ahead: PCRE2 compiles all of them, and its JIT
// makes matching several times faster than the interpreter. Each thread keeps its own match data
// and JIT stack, so one compiled pattern serves every thread.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include <memory>

#include "core/check.h"
#include "unicode.h"

namespace pagedattn::tokenizer {
namespace {

struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

// Unicode's White_Space characters: what \s means in Oniguruma (the engine `tokenizers` runs
// these patterns with) and in Rust's char::is_whitespace.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// PCRE2's \s (UCP) also takes U+180E MONGOLIAN VOWEL SEPARATOR (no longer White_Space since
// Unicode 6.3); spelling \s and \S out as White_Space classes makes PCRE2 split as Oniguruma.
std::string with_white_space_spelled_out(std::string_view pattern, std::string_view where) {
  std::string result;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[++i];
      if (next == 's') {
        result += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S') {
        PA_CHECK(!in_class, "{}: \\S inside a character class is not supported (pattern \"{}\")",
                 where, pattern);
        result += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        result += c;
        result += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      result += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') result += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') result += pattern[++i];  // literal ]
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      size_t end = pattern.find(":]", i + 2);  // a POSIX class [:name:]
      if (end != std::string_view::npos) {
        result.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    result += c;
  }
  return result;
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view where) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::string translated = with_white_space_spelled_out(pattern, where);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    PA_FAIL("{}: the regular expression \"{}\" does not compile (PCRE2, at offset {}): {}", where,
            pattern, offset, reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  MatchState& state = match_state();
  auto* code = static_cast<pcre2_code*>(code_);
  auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t position = 0;
  while (position <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), position, PCRE2_NO_UTF_CHECK, state.data,
                         state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    PA_CHECK(rc >= 0, "regular expression \"{}\": PCRE2 match error {}", pattern_, rc);
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    size_t start = ovector[0], end = ovector[1];
    matches.emplace_back(start, end);
    if (end > start) {
      position = end;
    } else {  // an empty match: go on from the next character
      if (start >= text.size()) break;
      position = start + utf8_length(static_cast<unsigned char>(text[start]));
    }
  }
}

void find_all_literal(std::string_view text, std::string_view literal,
                      std::vector<std::pair<size_t, size_t>>& matches) {
  if (literal.empty()) return;
  size_t position = 0;
  while ((position = text.find(literal, position)) != std::string_view::npos) {
    matches.emplace_back(position, position + literal.size());
    position += literal.size();
  }
}

}  // namespace pagedattn::tokenizer
