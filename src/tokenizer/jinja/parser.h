// The parser's expression half and the token cursor both halves share (see ast.h for the tree,
// parser.cpp for the statements). Jinja2's precedence, lowest first: a if c else b < or < and <
// not < comparisons (==, in, not in, ...) < + - < ~ < * / // % < ** < unary - + < postfix ([], .,
// ()), then filters `|` and tests `is`, which bind tighter than any operator.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/errors.h"

namespace pagedattn::jinja {

std::string describe(const Token& token);

class ExpressionParser {
 public:
  explicit ExpressionParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

 protected:
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(position_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& token = tokens_[position_];
    if (position_ + 1 < tokens_.size()) ++position_;
    return token;
  }
  bool at_operator(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_expected(std::string_view what) {
    fail_at(peek().location, fmt::format("expected {}, got {}", what, describe(peek())));
  }
  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) fail_expected(fmt::format("'{}'", op));
  }
  void expect_name(std::string_view name) {
    if (!skip_name(name)) fail_expected(fmt::format("'{}'", name));
  }
  std::string expect_identifier() {
    if (peek().kind != TokenKind::kName) fail_expected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) fail_expected("end of statement block");
    next();
  }

  ExpressionPtr node(Expression::Kind kind, Location location);
  // `a, b` as a tuple where Jinja2 allows one: {{ }}, set values, for iterables.
  ExpressionPtr parse_tuple_or_expression(bool conditional = true);
  ExpressionPtr parse_expression();
  ExpressionPtr binary(Expression::Kind kind, Location location, ExpressionPtr left,
                       ExpressionPtr right, std::string op = "");
  ExpressionPtr parse_or();
  ExpressionPtr parse_and();
  ExpressionPtr parse_not();
  ExpressionPtr parse_compare();
  ExpressionPtr parse_math1();
  ExpressionPtr parse_concat();
  ExpressionPtr parse_math2();
  ExpressionPtr parse_pow();
  ExpressionPtr parse_unary(bool with_filters);
  ExpressionPtr parse_primary();
  ExpressionPtr parse_postfix(ExpressionPtr value);
  ExpressionPtr parse_subscript(ExpressionPtr value);
  void parse_arguments(Expression& target);
  ExpressionPtr parse_call(ExpressionPtr callee);
  ExpressionPtr parse_filter(ExpressionPtr operand);
  ExpressionPtr parse_filters(ExpressionPtr value);

  std::vector<Token> tokens_;
  size_t position_ = 0;
};

}  // namespace pagedattn::jinja
