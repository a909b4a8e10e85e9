// The evaluator: runs a Program over a context of variables and returns the text. Scopes follow
// Jinja2: each for-loop iteration, macro call and `with` block has its own (an assignment inside
// does not leak out, hence namespace()), `if` has none; names not found in any scope fall back to
// the global functions, then to undefined. Errors carry the location of the innermost expression
// being evaluated. interpreter.cpp runs the statements, expressions.cpp evaluates expressions.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace pagedattn::jinja {

// Sets the interpreter's current location for the lifetime of an evaluation and restores the
// previous one on a normal exit; while an exception unwinds, the innermost location stays.
class LocationGuard {
 public:
  LocationGuard(Location& current, Location location)
      : current_(current), saved_(current), exceptions_(std::uncaught_exceptions()) {
    current_ = location;
  }
  ~LocationGuard() {
    if (std::uncaught_exceptions() == exceptions_) current_ = saved_;
  }

 private:
  Location& current_;
  Location saved_;
  int exceptions_;
};

// Throws the error a use of an undefined value raises (its hint: "'x' is undefined", ...).
[[noreturn]] void fail_undefined(const Value& value);
// How Jinja2's messages name a value's type: "'dict object'", "'None'".
std::string type_object(const Value& value);

struct Scope {
  std::unordered_map<std::string, Value> variables;
  std::shared_ptr<Scope> parent;
};

class Interpreter {
 public:
  explicit Interpreter(const Program& program) : program_(program) {}

  // Renders the program with the context's entries (a dict) as the top-level variables.
  std::string render(const Value& context);

  // Operations the built-ins need.
  Value call(const Value& callee, CallArguments& arguments);
  Value get_attribute(const Value& object, const std::string& name);
  Value get_item(const Value& object, const Value& key);
  Location location() const { return location_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow execute(const Body& body);
  Flow execute(const Statement& statement);
  void execute_for(const Statement& statement);
  void execute_if(const Statement& statement, Flow& flow);
  void assign(const Target& target, const Value& value);
  std::string render_body(const Body& body, std::shared_ptr<Scope> scope);
  Value make_macro(const std::vector<Parameter>& parameters, const Body& body,
                   const std::string& name);

  Value evaluate(const Expression& expression);
  Value evaluate_call(const Expression& expression);
  Value evaluate_binary(const std::string& op, const Value& left, const Value& right);
  bool evaluate_compare(const std::string& op, const Value& left, const Value& right);
  Value lookup(const std::string& name) const;
  void evaluate_arguments(const Expression& expression, size_t first, CallArguments& arguments);

  const Program& program_;
  std::shared_ptr<Scope> scope_;
  std::string* output_ = nullptr;
  Location location_;
  const Value* filter_input_ = nullptr;  // the text of a filter block / filtered set block
  int depth_ = 0;                        // macro recursion, bounded
};

}  // namespace pagedattn::jinja
