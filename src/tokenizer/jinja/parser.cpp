// The parser: tokens -> Program. This file holds the statements, each parsed until the tag that
// ends its block; parse_expressions.cpp the expressions (Jinja2's grammar and precedence). An
// unknown tag, filter or test, or a block left open, is an error naming where.
#include "jinja/parser.h"

#include <fmt/format.h>

#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/errors.h"

namespace pagedattn::jinja {
namespace {

class Parser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  Body parse_template() {
    Body body = parse_body({}, nullptr);
    return body;
  }

 private:
  // ---- statements ----

  // Parses statements until a {% tag %} whose name is in `end_tags` (left unconsumed, after its
  // {%), or the end of the template when end_tags is empty. `opener` names the open block.
  Body parse_body(std::initializer_list<std::string_view> end_tags, const Token* opener) {
    Body body;
    while (true) {
      const Token& token = peek();
      if (token.kind == TokenKind::kEnd) {
        if (end_tags.size() == 0) return body;
        std::string expected;
        for (std::string_view tag : end_tags) {
          expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
        }
        fail_at(opener->location,
                fmt::format("unexpected end of template: the '{}' block is not closed "
                            "(expected {})",
                            opener->text, expected));
      }
      if (token.kind == TokenKind::kText) {
        auto statement = make(Statement::Kind::kText, token.location);
        statement->text = next().text;
        body.push_back(std::move(statement));
      } else if (token.kind == TokenKind::kVariableBegin) {
        next();
        auto statement = make(Statement::Kind::kOutput, token.location);
        statement->expression = parse_tuple_or_expression();
        if (peek().kind != TokenKind::kVariableEnd) fail_expected("end of print statement");
        next();
        body.push_back(std::move(statement));
      } else if (token.kind == TokenKind::kBlockBegin) {
        const Token& tag = peek(1);
        for (std::string_view end_tag : end_tags) {
          if (tag.kind == TokenKind::kName && tag.text == end_tag) {
            next();
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail_at(token.location, fmt::format("unexpected {}", describe(token)));
      }
    }
  }

  StatementPtr make(Statement::Kind kind, Location location) {
    auto statement = std::make_unique<Statement>();
    statement->kind = kind;
    statement->location = location;
    return statement;
  }

  StatementPtr parse_statement() {
    const Token& tag = peek();
    if (tag.kind != TokenKind::kName) fail_at(tag.location, "tag name expected");
    const std::string& name = tag.text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "break" || name == "continue") {
      auto statement = make(name == "break" ? Statement::Kind::kBreak : Statement::Kind::kContinue,
                            next().location);
      if (loop_depth_ == 0) {
        fail_at(statement->location, fmt::format("'{}' outside of a for loop", name));
      }
      expect_block_end();
      return statement;
    }
    if (name == "generation") {
      const Token& opener = next();
      auto statement = make(Statement::Kind::kScope, opener.location);
      expect_block_end();
      statement->body = parse_body({"endgeneration"}, &opener);
      next();
      expect_block_end();
      return statement;
    }
    fail_at(tag.location, fmt::format("Encountered unknown tag '{}'.", name));
  }

  StatementPtr parse_if() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kIf, opener.location);
    statement->conditions.push_back(parse_expression());
    expect_block_end();
    while (true) {
      statement->bodies.push_back(parse_body({"elif", "else", "endif"}, &opener));
      const Token& tag = next();
      if (tag.text == "elif") {
        statement->conditions.push_back(parse_expression());
        expect_block_end();
      } else if (tag.text == "else") {
        expect_block_end();
        statement->bodies.push_back(parse_body({"endif"}, &opener));
        next();
        expect_block_end();
        return statement;
      } else {
        expect_block_end();
        return statement;
      }
    }
  }

  Target parse_target(bool allow_attribute) {
    Target target;
    target.names.push_back(expect_identifier());
    if (allow_attribute && at_operator(".")) {
      next();
      target.attribute = expect_identifier();
      return target;
    }
    while (skip_operator(",")) {
      if (peek().kind != TokenKind::kName || at_name("in")) break;
      target.names.push_back(expect_identifier());
    }
    return target;
  }

  StatementPtr parse_for() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kFor, opener.location);
    bool parenthesized = skip_operator("(");
    statement->target = parse_target(false);
    if (parenthesized) expect_operator(")");
    expect_name("in");
    statement->expression = parse_tuple_or_expression(/*conditional=*/false);
    if (skip_name("if")) statement->condition = parse_expression();
    if (at_name("recursive")) fail_at(peek().location, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    statement->body = parse_body({"endfor", "else"}, &opener);
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      statement->else_body = parse_body({"endfor"}, &opener);
      next();
    }
    expect_block_end();
    return statement;
  }

  StatementPtr parse_set() {
    const Token& opener = next();
    Target target = parse_target(true);
    if (skip_operator("=")) {
      auto statement = make(Statement::Kind::kSet, opener.location);
      statement->target = std::move(target);
      statement->expression = parse_tuple_or_expression();
      expect_block_end();
      return statement;
    }
    auto statement = make(Statement::Kind::kSetBlock, opener.location);
    statement->target = std::move(target);
    if (at_operator("|")) statement->expression = parse_filters(nullptr);
    expect_block_end();
    statement->body = parse_body({"endset"}, &opener);
    next();
    expect_block_end();
    return statement;
  }

  std::vector<Parameter> parse_parameters() {
    std::vector<Parameter> parameters;
    expect_operator("(");
    while (!at_operator(")")) {
      if (!parameters.empty()) expect_operator(",");
      if (at_operator(")")) break;
      Parameter parameter;
      parameter.name = expect_identifier();
      if (skip_operator("=")) parameter.default_value = parse_expression();
      parameters.push_back(std::move(parameter));
    }
    next();
    return parameters;
  }

  StatementPtr parse_macro() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kMacro, opener.location);
    statement->name = expect_identifier();
    statement->parameters = parse_parameters();
    expect_block_end();
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    statement->body = parse_body({"endmacro"}, &opener);
    loop_depth_ = saved_depth;
    next();
    expect_block_end();
    return statement;
  }

  StatementPtr parse_call_block() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kCallBlock, opener.location);
    if (at_operator("(")) statement->parameters = parse_parameters();
    statement->expression = parse_expression();
    if (statement->expression->kind != Expression::Kind::kCall) {
      fail_at(statement->location, "expected a call after 'call'");
    }
    expect_block_end();
    statement->body = parse_body({"endcall"}, &opener);
    next();
    expect_block_end();
    return statement;
  }

  StatementPtr parse_filter_block() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kFilterBlock, opener.location);
    statement->expression = parse_filter(nullptr);
    while (at_operator("|")) {
      next();
      statement->expression = parse_filter(std::move(statement->expression));
    }
    expect_block_end();
    statement->body = parse_body({"endfilter"}, &opener);
    next();
    expect_block_end();
    return statement;
  }

  StatementPtr parse_with() {
    const Token& opener = next();
    auto statement = make(Statement::Kind::kWith, opener.location);
    while (peek().kind != TokenKind::kBlockEnd) {
      if (!statement->with_targets.empty()) expect_operator(",");
      statement->with_targets.push_back(parse_target(false));
      expect_operator("=");
      statement->with_values.push_back(parse_expression());
    }
    expect_block_end();
    statement->body = parse_body({"endwith"}, &opener);
    next();
    expect_block_end();
    return statement;
  }

  int loop_depth_ = 0;
};

}  // namespace

std::shared_ptr<const Program> parse(std::string source) {
  auto program = std::make_shared<Program>();
  program->body = Parser(tokenize(source)).parse_template();
  program->source = std::move(source);
  return program;
}

}  // namespace pagedattn::jinja
