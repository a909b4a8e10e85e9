// The parser's expressions (see parser.h): recursive descent, one function per precedence level.
#include <fmt/format.h>

#include "jinja/builtins.h"
#include "jinja/errors.h"
#include "jinja/parser.h"

namespace pagedattn::jinja {

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kEnd:
      return "end of template";
    case TokenKind::kBlockEnd:
      return "end of statement block";
    case TokenKind::kVariableEnd:
      return "end of print statement";
    case TokenKind::kText:
      return "template data";
    default:
      return "'" + token.text + "'";
  }
}

ExpressionPtr ExpressionParser::node(Expression::Kind kind, Location location) {
  auto expression = std::make_unique<Expression>();
  expression->kind = kind;
  expression->location = location;
  return expression;
}

// `a, b` as a tuple where Jinja2 allows one: {{ }}, set values, for iterables.
ExpressionPtr ExpressionParser::parse_tuple_or_expression(bool conditional) {
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

ExpressionPtr ExpressionParser::parse_expression() {
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

ExpressionPtr ExpressionParser::binary(Expression::Kind kind, Location location, ExpressionPtr left,
                                       ExpressionPtr right, std::string op) {
  auto expression = node(kind, location);
  expression->name = std::move(op);
  expression->children.push_back(std::move(left));
  expression->children.push_back(std::move(right));
  return expression;
}

ExpressionPtr ExpressionParser::parse_or() {
  ExpressionPtr left = parse_and();
  while (at_name("or")) {
    Location location = next().location;
    left = binary(Expression::Kind::kOr, location, std::move(left), parse_and());
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_and() {
  ExpressionPtr left = parse_not();
  while (at_name("and")) {
    Location location = next().location;
    left = binary(Expression::Kind::kAnd, location, std::move(left), parse_not());
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_not() {
  if (at_name("not")) {
    auto expression = node(Expression::Kind::kNot, next().location);
    expression->children.push_back(parse_not());
    return expression;
  }
  return parse_compare();
}

ExpressionPtr ExpressionParser::parse_compare() {
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

ExpressionPtr ExpressionParser::parse_math1() {
  ExpressionPtr left = parse_concat();
  while (at_operator("+") || at_operator("-")) {
    const Token& op = next();
    left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_concat(), op.text);
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_concat() {
  ExpressionPtr left = parse_math2();
  while (at_operator("~")) {
    const Token& op = next();
    left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_math2(), "~");
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_math2() {
  ExpressionPtr left = parse_pow();
  while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
    const Token& op = next();
    left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_pow(), op.text);
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_pow() {
  ExpressionPtr left = parse_unary(true);
  while (at_operator("**")) {
    const Token& op = next();
    left = binary(Expression::Kind::kBinary, op.location, std::move(left), parse_unary(true), "**");
  }
  return left;
}

ExpressionPtr ExpressionParser::parse_unary(bool with_filters) {
  ExpressionPtr value;
  if (at_operator("-") || at_operator("+")) {
    const Token& op = next();
    value =
        node(op.text == "-" ? Expression::Kind::kNegate : Expression::Kind::kPositive, op.location);
    value->children.push_back(parse_unary(false));
  } else {
    value = parse_primary();
  }
  value = parse_postfix(std::move(value));
  return with_filters ? parse_filters(std::move(value)) : std::move(value);
}

ExpressionPtr ExpressionParser::parse_primary() {
  const Token& token = peek();
  Location location = token.location;
  if (token.kind == TokenKind::kName) {
    const std::string& name = next().text;
    auto literal = node(Expression::Kind::kLiteral, location);
    if (name == "true" || name == "True")
      literal->literal = Value(true);
    else if (name == "false" || name == "False")
      literal->literal = Value(false);
    else if (name == "none" || name == "None")
      literal->literal = Value::none();
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
    literal->literal =
        number.kind == TokenKind::kInteger ? Value(number.integer) : Value(number.number);
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

ExpressionPtr ExpressionParser::parse_postfix(ExpressionPtr value) {
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

ExpressionPtr ExpressionParser::parse_subscript(ExpressionPtr value) {
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
  auto subscript =
      node(colons > 0 ? Expression::Kind::kSlice : Expression::Kind::kSubscript, location);
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
void ExpressionParser::parse_arguments(Expression& target) {
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
ExpressionPtr ExpressionParser::parse_call(ExpressionPtr callee) {
  auto call = node(Expression::Kind::kCall, callee->location);
  call->children.push_back(std::move(callee));
  parse_arguments(*call);
  return call;
}

ExpressionPtr ExpressionParser::parse_filter(ExpressionPtr operand) {
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

ExpressionPtr ExpressionParser::parse_filters(ExpressionPtr value) {
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

}  // namespace pagedattn::jinja
