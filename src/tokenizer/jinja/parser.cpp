// The parser: tokens -> Program. Recursive descent with Jinja2's grammar and precedence, lowest
// first:  a if c else b  <  or  <  and  <  not  <  comparisons (==, in, not in, ...)  <  + -  <
// ~  <  * / // %  <  **  <  unary - +  <  postfix ([], ., ()), then filters `|` and tests `is`
// (which bind tighter than any operator: `x|length - 1` is `(x|length) - 1`). Statements are
// parsed until the tag that ends their block; an unknown tag, filter or test, or a block left open,
// is an error naming where.
#include <fmt/format.h>

#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/errors.h"

namespace pagedattn::jinja {
namespace {

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kEnd: return "end of template";
    case TokenKind::kBlockEnd: return "end of statement block";
    case TokenKind::kVariableEnd: return "end of print statement";
    case TokenKind::kText: return "template data";
    default: return "'" + token.text + "'";
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() {
    Body body = parse_body({}, nullptr);
    return body;
  }

 private:
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
                            "(expected {})", opener->text, expected));
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

  // ---- expressions ----

  ExpressionPtr node(Expression::Kind kind, Location location) {
    auto expression = std::make_unique<Expression>();
    expression->kind = kind;
    expression->location = location;
    return expression;
  }

  // `a, b` as a tuple where Jinja2 allows one: {{ }}, set values, for iterables.
  ExpressionPtr parse_tuple_or_expression(bool conditional = true) {
    Location location = peek().location;
    ExpressionPtr first = conditional ? parse_expression() : parse_or();
    if (!at_operator(",")) return first;
    auto tuple = node(Expression::Kind::kTuple, location);
    tuple->children.push_back(std::move(first));
    while (skip_operator(",")) {
      if (peek().kind == TokenKind::kBlockEnd || peek().kind == TokenKind::kVariableEnd ||
          at_operator(")")) {
        break;  // a trailing comma: (1,)
      }
      tuple->children.push_back(conditional ? parse_expression() : parse_or());
    }
    return tuple;
  }

  ExpressionPtr parse_expression() {
    ExpressionPtr value = parse_or();
    while (at_name("if")) {
      auto conditional = node(Expression::Kind::kConditional, next().location);
      conditional->children.push_back(std::move(value));
      conditional->children.push_back(parse_or());
      conditional->children.push_back(skip_name("else") ? parse_expression() : nullptr);
      value = std::move(conditional);
    }
    return value;
  }

  ExpressionPtr binary(Expression::Kind kind, Location location, ExpressionPtr left,
                       ExpressionPtr right, std::string op = "") {
    auto expression = node(kind, location);
    expression->name = std::move(op);
    expression->children.push_back(std::move(left));
    expression->children.push_back(std::move(right));
    return expression;
  }

  ExpressionPtr parse_or() {
    ExpressionPtr left = parse_and();
    while (at_name("or")) {
      Location location = next().location;
      left = binary(Expression::Kind::kOr, location, std::move(left), parse_and());
    }
    return left;
  }

  ExpressionPtr parse_and() {
    ExpressionPtr left = parse_not();
    while (at_name("and")) {
      Location location = next().location;
      left = binary(Expression::Kind::kAnd, location, std::move(left), parse_not());
    }
    return left;
  }

  ExpressionPtr parse_not() {
    if (at_name("not")) {
      auto expression = node(Expression::Kind::kNot, next().location);
      expression->children.push_back(parse_not());
      return expression;
    }
    return parse_compare();
  }

  ExpressionPtr parse_compare() {
    Location location = peek().location;
    ExpressionPtr first = parse_math1();
    std::vector<std::string> operators;
    std::vector<ExpressionPtr> operands;
    while (true) {
      std::string op;
      const Token& token = peek();
      if (token.kind == TokenKind::kOperator &&
          (token.text == "==" || token.text == "!=" || token.text == "<" || token.text == ">" ||
           token.text == "<=" || token.text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      operators.push_back(std::move(op));
      operands.push_back(parse_math1());
    }
    if (operators.empty()) return first;
    auto compare = node(Expression::Kind::kCompare, location);
    compare->children.push_back(std::move(first));
    for (auto& operand : operands) compare->children.push_back(std::move(operand));
    compare->operators = std::move(operators);
    return compare;
  }

  ExpressionPtr parse_math1() {
    ExpressionPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      const Token& op = next();
      left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_concat(),
                    op.text);
    }
    return left;
  }

  ExpressionPtr parse_concat() {
    ExpressionPtr left = parse_math2();
    while (at_operator("~")) {
      const Token& op = next();
      left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_math2(), "~");
    }
    return left;
  }

  ExpressionPtr parse_math2() {
    ExpressionPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const Token& op = next();
      left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_pow(), op.text);
    }
    return left;
  }

  ExpressionPtr parse_pow() {
    ExpressionPtr left = parse_unary(true);
    while (at_operator("**")) {
      const Token& op = next();
      left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_unary(true),
                    "**");
    }
    return left;
  }

  ExpressionPtr parse_unary(bool with_filters) {
    ExpressionPtr value;
    if (at_operator("-") || at_operator("+")) {
      const Token& op = next();
      value = node(op.text == "-" ? Expression::Kind::kNegate : Expression::Kind::kPositive,
                   op.location);
      value->children.push_back(parse_unary(false));
    } else {
      value = parse_primary();
    }
    value = parse_postfix(std::move(value));
    return with_filters ? parse_filters(std::move(value)) : std::move(value);
  }

  ExpressionPtr parse_primary() {
    const Token& token = peek();
    Location location = token.location;
    if (token.kind == TokenKind::kName) {
      const std::string& name = next().text;
      auto literal = node(Expression::Kind::kLiteral, location);
      if (name == "true" || name == "True") literal->literal = Value(true);
      else if (name == "false" || name == "False") literal->literal = Value(false);
      else if (name == "none" || name == "None") literal->literal = Value::none();
      else {
        literal->kind = Expression::Kind::kName;
        literal->name = name;
      }
      return literal;
    }
    if (token.kind == TokenKind::kString) {
      std::string text;
      while (peek().kind == TokenKind::kString) text += next().text;  // adjacent literals join
      auto literal = node(Expression::Kind::kLiteral, location);
      literal->literal = Value(std::move(text));
      return literal;
    }
    if (token.kind == TokenKind::kInteger || token.kind == TokenKind::kFloat) {
      const Token& number = next();
      auto literal = node(Expression::Kind::kLiteral, location);
      literal->literal = number.kind == TokenKind::kInteger ? Value(number.integer)
                                                            : Value(number.number);
      return literal;
    }
    if (skip_operator("(")) {
      if (skip_operator(")")) return node(Expression::Kind::kTuple, location);
      ExpressionPtr inner = parse_tuple_or_expression();
      expect_operator(")");
      return inner;
    }
    if (skip_operator("[")) {
      auto list = node(Expression::Kind::kList, location);
      while (!at_operator("]")) {
        if (!list->children.empty()) expect_operator(",");
        if (at_operator("]")) break;
        list->children.push_back(parse_expression());
      }
      next();
      return list;
    }
    if (skip_operator("{")) {
      auto dict = node(Expression::Kind::kDict, location);
      while (!at_operator("}")) {
        if (!dict->children.empty()) expect_operator(",");
        if (at_operator("}")) break;
        dict->children.push_back(parse_expression());
        expect_operator(":");
        dict->children.push_back(parse_expression());
      }
      next();
      return dict;
    }
    fail_at(location, fmt::format("unexpected {}", describe(token)));
  }

  ExpressionPtr parse_postfix(ExpressionPtr value) {
    while (true) {
      if (at_operator(".")) {
        Location location = next().location;
        auto attribute = node(Expression::Kind::kAttribute, location);
        if (peek().kind == TokenKind::kInteger) {
          // `items.0` is items[0] in Jinja2
          attribute->kind = Expression::Kind::kSubscript;
          auto index = node(Expression::Kind::kLiteral, peek().location);
          index->literal = Value(next().integer);
          attribute->children.push_back(std::move(value));
          attribute->children.push_back(std::move(index));
        } else {
          attribute->name = expect_identifier();
          attribute->children.push_back(std::move(value));
        }
        value = std::move(attribute);
      } else if (at_operator("[")) {
        value = parse_subscript(std::move(value));
      } else if (at_operator("(")) {
        value = parse_call(std::move(value));
      } else {
        return value;
      }
    }
  }

  ExpressionPtr parse_subscript(ExpressionPtr value) {
    Location location = next().location;
    ExpressionPtr parts[3];
    int colons = 0;
    while (!at_operator("]")) {
      if (skip_operator(":")) {
        if (++colons > 2) fail_expected("']'");
        continue;
      }
      if (parts[colons]) fail_expected("']'");
      parts[colons] = parse_expression();
    }
    next();
    auto subscript = node(colons > 0 ? Expression::Kind::kSlice : Expression::Kind::kSubscript,
                          location);
    subscript->children.push_back(std::move(value));
    if (colons == 0) {
      if (!parts[0]) fail_at(location, "expected an expression inside []");
      subscript->children.push_back(std::move(parts[0]));
    } else {
      for (auto& part : parts) subscript->children.push_back(std::move(part));
    }
    return subscript;
  }

  // Arguments in parentheses: positional, then name=value.
  void parse_arguments(Expression& target) {
    expect_operator("(");
    bool first = true;
    while (!at_operator(")")) {
      if (!first) expect_operator(",");
      first = false;
      if (at_operator(")")) break;
      if (peek().kind == TokenKind::kName && at_operator("=", 1)) {
        std::string name = next().text;
        next();
        target.keywords.emplace_back(std::move(name), parse_expression());
      } else {
        if (!target.keywords.empty()) {
          fail_at(peek().location, "positional argument follows keyword argument");
        }
        target.children.push_back(parse_expression());
      }
    }
    next();
  }

  // A call's errors point at the callee (the `raise_exception` of raise_exception(...)).
  ExpressionPtr parse_call(ExpressionPtr callee) {
    auto call = node(Expression::Kind::kCall, callee->location);
    call->children.push_back(std::move(callee));
    parse_arguments(*call);
    return call;
  }

  ExpressionPtr parse_filter(ExpressionPtr operand) {
    Location location = peek().location;
    std::string name = expect_identifier();
    while (at_operator(".")) {
      next();
      name += "." + expect_identifier();
    }
    if (!has_filter(name)) fail_at(location, fmt::format("No filter named '{}'.", name));
    auto filter = node(Expression::Kind::kFilter, location);
    filter->name = std::move(name);
    filter->children.push_back(std::move(operand));
    if (at_operator("(")) parse_arguments(*filter);
    return filter;
  }

  ExpressionPtr parse_filters(ExpressionPtr value) {
    while (true) {
      if (at_operator("|")) {
        next();
        value = parse_filter(std::move(value));
      } else if (at_name("is")) {
        next();
        auto test = node(Expression::Kind::kTest, peek().location);
        test->negated = skip_name("not");
        Location name_location = peek().location;
        test->name = expect_identifier();
        while (at_operator(".")) {
          next();
          test->name += "." + expect_identifier();
        }
        if (!has_test(test->name)) {
          fail_at(name_location, fmt::format("No test named '{}'.", test->name));
        }
        test->children.push_back(std::move(value));
        const Token& token = peek();
        if (at_operator("(")) {
          parse_arguments(*test);
        } else if ((token.kind == TokenKind::kName || token.kind == TokenKind::kString ||
                    token.kind == TokenKind::kInteger || token.kind == TokenKind::kFloat ||
                    at_operator("[") || at_operator("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and")) {
          // `x is divisibleby 3`: one argument without parentheses
          if (at_name("is")) fail_at(token.location, "You cannot chain multiple tests with is");
          test->children.push_back(parse_postfix(parse_primary()));
        }
        value = std::move(test);
      } else if (at_operator("(")) {
        value = parse_call(std::move(value));
      } else {
        return value;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t position_ = 0;
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
