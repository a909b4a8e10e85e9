// The parsed template: a tree of statements whose leaves are expressions. One node type for each
// (with a kind) rather than a class per construct: the evaluator switches on the kind, and the
// fields each kind uses are listed beside it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/lexer.h"
#include "jinja/value.h"

namespace pagedattn::jinja {

struct Expression;
using ExpressionPtr = std::unique_ptr<Expression>;

struct Expression {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // children: the elements
    kTuple,      // children: the elements
    kDict,       // children: key, value, key, value, ...
    kAttribute,  // children[0].name
    kSubscript,  // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]] (null: omitted)
    kCall,       // children[0](children[1..], keywords)
    kFilter,     // children[0] | name(children[1..], keywords); children[0] null in a filter block
    kTest,       // children[0] is [not] name(children[1..], keywords); negated
    kNegate,     // -children[0]
    kPositive,   // +children[0]
    kNot,        // not children[0]
    kAnd,        // children[0] and children[1]
    kOr,         // children[0] or children[1]
    kBinary,     // children[0] name children[1]: + - * / // % ** ~
    kCompare,    // children[0] operators[0] children[1] operators[1] ... (chained as Python)
    kConditional,  // children[0] if children[1] else children[2] (null: undefined)
  };

  Kind kind;
  Location location;
  Value literal;
  std::string name;
  std::vector<ExpressionPtr> children;
  std::vector<std::pair<std::string, ExpressionPtr>> keywords;
  std::vector<std::string> operators;  // ==, !=, <, <=, >, >=, in, not in
  bool negated = false;
};

struct Statement;
using StatementPtr = std::unique_ptr<Statement>;
using Body = std::vector<StatementPtr>;

// A variable a statement assigns: `x`, `a, b` (a tuple to unpack) or `ns.x` (an attribute).
struct Target {
  std::vector<std::string> names;
  std::string attribute;  // non-empty: names[0].attribute
};

struct Parameter {
  std::string name;
  ExpressionPtr default_value;  // null: required (undefined when not passed)
};

struct Statement {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expression }}
    kIf,           // conditions[i] -> bodies[i]; a trailing body without condition is the else
    kFor,          // for target in expression [if condition]: body [else: else_body]
    kSet,          // set target = expression
    kSetBlock,     // set target [| filter]: body (filter: a kFilter expression, or null)
    kMacro,        // macro name(parameters): body
    kCallBlock,    // call(parameters) expression: body, the body is `caller`
    kFilterBlock,  // filter expression: body
    kWith,         // with target_i = values_i: body
    kBreak,
    kContinue,
    kScope,  // a body run as it is ({% generation %})
  };

  Kind kind;
  Location location;
  std::string text;
  ExpressionPtr expression;
  ExpressionPtr condition;
  Target target;
  std::vector<ExpressionPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::string name;
  std::vector<Parameter> parameters;
  std::vector<Target> with_targets;
  std::vector<ExpressionPtr> with_values;
};

struct Program {
  std::string source;
  Body body;
};

// Parses a whole template; throws ChatTemplateError at the first syntax error.
std::shared_ptr<const Program> parse(std::string source);

}  // namespace pagedattn::jinja
