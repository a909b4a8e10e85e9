// The template lexer (see lexer.h). One pass over the source: find the next `{{`, `{%` or `{#`,
// emit the text before it with the whitespace control applied, then either skip a comment, copy a
// raw block, or cut the tag's inside into expression tokens until its closing delimiter (only
// when no bracket is open).
#include "jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "jinja/errors.h"
#include "jinja/value.h"

namespace pagedattn::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

// Python's "unicode-escape" decoding of a string literal's inside, as Jinja2 applies it.
std::string unescape(std::string_view body, Location location) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    auto hex = [&](int digits) {
      if (i + digits >= body.size()) {
        fail_at(location, "truncated \\x, \\u or \\U escape in a string literal");
      }
      uint32_t code_point = 0;
      for (int k = 1; k <= digits; ++k) {
        char h = body[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) {
          fail_at(location, "truncated \\x, \\u or \\U escape in a string literal");
        }
        code_point =
            code_point * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                   ? h - '0'
                                   : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
      }
      i += digits;
      append_utf8(out, code_point);
    };
    switch (e) {
      case '\n':
        break;  // a backslash-newline continues the line
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t code_point = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            code_point = code_point * 8 + (body[++i] - '0');
          }
          append_utf8(out, code_point);
        } else {
          out += '\\';  // an unknown escape stays as written
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : source_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t position = 0;
    while (position < source_.size()) {
      size_t tag = source_.find('{', position);
      while (tag != std::string::npos && tag + 1 < source_.size() && source_[tag + 1] != '{' &&
             source_[tag + 1] != '%' && source_[tag + 1] != '#') {
        tag = source_.find('{', tag + 1);
      }
      if (tag == std::string::npos || tag + 1 >= source_.size()) {
        emit_text(source_.substr(position), position);
        break;
      }
      char kind = source_[tag + 1];
      char sign = tag + 2 < source_.size() ? source_[tag + 2] : '\0';
      std::string text = source_.substr(position, tag - position);
      apply_left_control(text, position, kind, sign);
      emit_text(std::move(text), position);
      size_t inside = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        position = skip_comment(tag, inside);
      } else if (kind == '%' && is_raw(inside, "raw")) {
        position = copy_raw(tag, inside);
      } else {
        position = lex_tag(tag, inside, kind == '{');
      }
    }
    tokens_.push_back(Token{TokenKind::kEnd, "", location_of(source_.size())});
    return std::move(tokens_);
  }

 private:
  Location location_of(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t column = code_point_count(
        std::string_view(source_).substr(line_starts_[line - 1], offset - line_starts_[line - 1]));
    return Location{static_cast<int>(line), static_cast<int>(column) + 1};
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty())
      tokens_.push_back(Token{TokenKind::kText, std::move(text), location_of(offset)});
  }

  // `-` strips all whitespace before the tag; lstrip_blocks strips the spaces and tabs between
  // the line's start and a {% or {# (the line starts where the text starts if the source or the
  // previous tag ended there with a newline).
  void apply_left_control(std::string& text, size_t text_start, char kind, char sign) const {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      text.resize(end);
      return;
    }
    if (sign == '+' || kind == '{') return;
    size_t newline = text.rfind('\n');
    size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    bool line_starting = text_start == 0 || source_[text_start - 1] == '\n';
    if (line_start == 0 && !line_starting) return;
    if (line_start == text.size()) return;
    for (size_t i = line_start; i < text.size(); ++i) {
      if (!is_space(text[i])) return;
    }
    text.resize(line_start);
  }

  // After a closing delimiter: `-` strips all whitespace, `+` nothing, otherwise trim_blocks drops
  // one newline (for %} and #}, not for }}).
  size_t apply_right_control(size_t after, char sign, bool trim_newline) const {
    if (sign == '-') {
      while (after < source_.size() && is_space(source_[after])) ++after;
    } else if (sign != '+' && trim_newline && after < source_.size() && source_[after] == '\n') {
      ++after;
    }
    return after;
  }

  size_t skip_comment(size_t tag, size_t inside) {
    size_t end = source_.find("#}", inside);
    if (end == std::string::npos) fail_at(location_of(tag), "Missing end of comment tag");
    char sign = end > inside && (source_[end - 1] == '-' || source_[end - 1] == '+')
                    ? source_[end - 1]
                    : '\0';
    return apply_right_control(end + 2, sign, true);
  }

  // {% raw %} or {%- raw -%} at `inside`: the word alone between the delimiters.
  bool is_raw(size_t inside, std::string_view word) const {
    size_t i = inside;
    while (i < source_.size() && is_space(source_[i])) ++i;
    if (source_.compare(i, word.size(), word) != 0) return false;
    i += word.size();
    if (i < source_.size() &&
        (std::isalnum(static_cast<unsigned char>(source_[i])) || source_[i] == '_')) {
      return false;
    }
    while (i < source_.size() && is_space(source_[i])) ++i;
    if (i < source_.size() && source_[i] == '-') ++i;
    return source_.compare(i, 2, "%}") == 0;
  }

  size_t copy_raw(size_t tag, size_t inside) {
    size_t close = source_.find("%}", inside);
    size_t body = apply_right_control(close + 2, source_[close - 1] == '-' ? '-' : '\0', false);
    for (size_t search = body;;) {
      size_t end_tag = source_.find("{%", search);
      if (end_tag == std::string::npos) fail_at(location_of(tag), "Missing end of raw directive");
      char sign = end_tag + 2 < source_.size() ? source_[end_tag + 2] : '\0';
      size_t end_inside = end_tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (!is_raw(end_inside, "endraw")) {
        search = end_tag + 2;
        continue;
      }
      std::string text = source_.substr(body, end_tag - body);
      apply_left_control(text, body, '%', sign);
      emit_text(std::move(text), body);
      size_t end_close = source_.find("%}", end_inside);
      char close_sign = source_[end_close - 1] == '-' || source_[end_close - 1] == '+'
                            ? source_[end_close - 1]
                            : '\0';
      return apply_right_control(end_close + 2, close_sign, true);
    }
  }

  size_t lex_tag(size_t tag, size_t position, bool variable) {
    tokens_.push_back(Token{variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin,
                            variable ? "{{" : "{%", location_of(tag)});
    const std::string_view close = variable ? "}}" : "%}";
    std::vector<char> brackets;
    while (true) {
      while (position < source_.size() && is_space(source_[position])) ++position;
      if (position >= source_.size()) {
        fail_at(location_of(tag), variable ? "unexpected end of template, expected '}}'"
                                           : "unexpected end of template, expected '%}'");
      }
      if (brackets.empty()) {
        char sign = source_[position];
        size_t at = position + (sign == '-' || (sign == '+' && !variable) ? 1 : 0);
        if (source_.compare(at, 2, close) == 0) {
          tokens_.push_back(Token{variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd,
                                  std::string(close), location_of(position)});
          return apply_right_control(at + 2, at > position ? sign : '\0', !variable);
        }
      }
      position = lex_expression_token(position, brackets);
    }
  }

  size_t lex_expression_token(size_t position, std::vector<char>& brackets) {
    const Location location = location_of(position);
    const char c = source_[position];
    auto digit = [&](size_t i) {
      return i < source_.size() && std::isdigit(static_cast<unsigned char>(source_[i]));
    };
    if (digit(position)) {
      size_t end = position;
      auto digits = [&] {
        while (digit(end) || (source_[end] == '_' && digit(end + 1))) ++end;
      };
      digits();
      bool is_float = false;
      bool after_dot = position > 0 && source_[position - 1] == '.';
      if (!after_dot && end + 1 < source_.size() && source_[end] == '.' && digit(end + 1)) {
        ++end;
        digits();
        is_float = true;
      }
      if (!after_dot && end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
        size_t exponent = end + 1;
        if (exponent < source_.size() && (source_[exponent] == '+' || source_[exponent] == '-')) {
          ++exponent;
        }
        if (digit(exponent)) {
          end = exponent;
          digits();
          is_float = true;
        }
      }
      std::string text;
      for (size_t i = position; i < end; ++i) {
        if (source_[i] != '_') text += source_[i];
      }
      Token token{is_float ? TokenKind::kFloat : TokenKind::kInteger, text, location};
      if (is_float) {
        token.number = std::stod(text);
      } else {
        try {
          token.integer = std::stoll(text);
        } catch (const std::out_of_range&) {
          fail_at(location, fmt::format("integer literal {} does not fit in 64 bits", text));
        }
      }
      tokens_.push_back(std::move(token));
      return end;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = position;
      while (end < source_.size() &&
             (std::isalnum(static_cast<unsigned char>(source_[end])) || source_[end] == '_')) {
        ++end;
      }
      tokens_.push_back(
          Token{TokenKind::kName, source_.substr(position, end - position), location});
      return end;
    }
    if (c == '\'' || c == '"') {
      size_t end = position + 1;
      while (end < source_.size() && source_[end] != c) end += source_[end] == '\\' ? 2 : 1;
      if (end >= source_.size()) fail_at(location, "unterminated string literal");
      std::string_view body = std::string_view(source_).substr(position + 1, end - position - 1);
      tokens_.push_back(Token{TokenKind::kString, unescape(body, location), location});
      return end + 1;
    }
    static constexpr std::string_view kTwoCharacter[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoCharacter) {
      if (source_.compare(position, 2, op) == 0) {
        tokens_.push_back(Token{TokenKind::kOperator, std::string(op), location});
        return position + 2;
      }
    }
    static constexpr std::string_view kSingle = "+-/*%~[](){}=<>.:|,;";
    if (kSingle.find(c) == std::string_view::npos) {
      fail_at(location, fmt::format("unexpected char '{}'", c));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail_at(location, fmt::format("unexpected '{}'", c));
      if (brackets.back() != c) {
        fail_at(location, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
      }
      brackets.pop_back();
    }
    tokens_.push_back(Token{TokenKind::kOperator, std::string(1, c), location});
    return position + 1;
  }

  std::string source_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace pagedattn::jinja
