// The template lexer: source text in, a flat token stream out, the way Jinja2's lexer cuts it with
// the settings transformers uses (trim_blocks, lstrip_blocks, keep_trailing_newline off):
//   text between tags                          -> kText (whitespace control already applied)
//   {{ ... }}, {% ... %}                       -> kVariableBegin / kBlockBegin, the expression
//                                                 tokens, kVariableEnd / kBlockEnd
//   {# ... #}                                  -> nothing
//   {% raw %} ... {% endraw %}                 -> kText, verbatim
// Whitespace control: `-` after an opening delimiter strips all whitespace before it, `-` before a
// closing one all whitespace after it; trim_blocks drops the first newline after %} and #};
// lstrip_blocks drops spaces and tabs between a line's start and {% or {# ; `+` turns either off.
// "\r\n" and "\r" become "\n" first, and one trailing newline of the source is dropped. An end
// delimiter inside brackets does not close the tag (as in Jinja2: `{{ {'a': {'b': 1}} }}`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedattn::jinja {

struct Location {
  int line = 1;
  int column = 1;
};

enum class TokenKind {
  kText,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEnd,  // end of the template
};

struct Token {
  TokenKind kind;
  std::string text;  // kText: the data; kName / kOperator: as written; kString: unescaped
  Location location;
  int64_t integer = 0;
  double number = 0.0;
};

// Throws pagedattn::Error naming the line and column for an unclosed tag, comment or string, an
// unbalanced bracket or a character that is not part of the expression language.
std::vector<Token> tokenize(const std::string& source);

}  // namespace pagedattn::jinja
