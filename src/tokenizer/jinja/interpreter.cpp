// The evaluator's statements (see interpreter.h): text and {{ }} output, if, for with its loop
// variable, set / block set / namespace attributes, macros and call blocks, filter and with
// blocks. Expressions are in expressions.cpp.
#include "jinja/interpreter.h"

#include <fmt/format.h>

#include "jinja/builtins.h"
#include "jinja/errors.h"
#include "pagedattn/chat_template.h"

namespace pagedattn::jinja {
namespace {

constexpr int kMaxCallDepth = 200;

}  // namespace

void fail_undefined(const Value& value) { throw Error(value.undefined_hint()); }

std::string type_object(const Value& value) {
  return value.is_none() ? "'None'" : "'" + value.type_name() + " object'";
}

std::string Interpreter::render(const Value& context) {
  scope_ = std::make_shared<Scope>();
  for (const auto& [name, value] : context.as_dict().entries) scope_->variables[name] = value;
  std::string out;
  output_ = &out;
  try {
    execute(program_.body);
  } catch (const ChatTemplateError&) {
    throw;
  } catch (const Error& error) {
    fail_at(location_, error.what());
  }
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* scope = scope_.get(); scope != nullptr; scope = scope->parent.get()) {
    auto it = scope->variables.find(name);
    if (it != scope->variables.end()) return it->second;
  }
  if (auto function = global_function(name)) return *function;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

// ---- statements ----

Interpreter::Flow Interpreter::execute(const Body& body) {
  for (const StatementPtr& statement : body) {
    Flow flow = execute(*statement);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::execute(const Statement& statement) {
  LocationGuard guard(location_, statement.location);
  switch (statement.kind) {
    case Statement::Kind::kText:
      *output_ += statement.text;
      break;
    case Statement::Kind::kOutput:
      *output_ += to_str(evaluate(*statement.expression));
      break;
    case Statement::Kind::kIf: {
      Flow flow = Flow::kNormal;
      execute_if(statement, flow);
      return flow;
    }
    case Statement::Kind::kFor:
      execute_for(statement);
      break;
    case Statement::Kind::kSet:
      assign(statement.target, evaluate(*statement.expression));
      break;
    case Statement::Kind::kSetBlock: {
      Value text(render_body(statement.body, scope_));
      if (statement.expression) {
        const Value* saved = filter_input_;
        filter_input_ = &text;
        Value filtered = evaluate(*statement.expression);
        filter_input_ = saved;
        assign(statement.target, filtered);
      } else {
        assign(statement.target, text);
      }
      break;
    }
    case Statement::Kind::kMacro:
      scope_->variables[statement.name] =
          make_macro(statement.parameters, statement.body, statement.name);
      break;
    case Statement::Kind::kCallBlock: {
      Value caller = make_macro(statement.parameters, statement.body, "caller");
      const Expression& call = *statement.expression;
      Value callee = evaluate(*call.children[0]);
      CallArguments arguments;
      evaluate_arguments(call, 1, arguments);
      arguments.keyword.emplace_back("caller", caller);
      *output_ += to_str(this->call(callee, arguments));
      break;
    }
    case Statement::Kind::kFilterBlock: {
      Value text(render_body(statement.body, scope_));
      const Value* saved = filter_input_;
      filter_input_ = &text;
      Value filtered = evaluate(*statement.expression);
      filter_input_ = saved;
      *output_ += to_str(filtered);
      break;
    }
    case Statement::Kind::kWith: {
      auto scope = std::make_shared<Scope>();
      scope->parent = scope_;
      std::vector<Value> values;
      for (const ExpressionPtr& value : statement.with_values) values.push_back(evaluate(*value));
      std::shared_ptr<Scope> saved = scope_;
      scope_ = scope;
      for (size_t i = 0; i < values.size(); ++i) assign(statement.with_targets[i], values[i]);
      Flow flow = execute(statement.body);
      scope_ = saved;
      return flow;
    }
    case Statement::Kind::kBreak:
      return Flow::kBreak;
    case Statement::Kind::kContinue:
      return Flow::kContinue;
    case Statement::Kind::kScope:
      return execute(statement.body);
  }
  return Flow::kNormal;
}

void Interpreter::execute_if(const Statement& statement, Flow& flow) {
  for (size_t i = 0; i < statement.bodies.size(); ++i) {
    if (i < statement.conditions.size() && !evaluate(*statement.conditions[i]).truthy()) continue;
    flow = execute(statement.bodies[i]);
    return;
  }
}

void Interpreter::assign(const Target& target, const Value& value) {
  if (!target.attribute.empty()) {
    Value object = lookup(target.names[0]);
    if (!object.is_namespace()) {
      throw Error(
          fmt::format("cannot assign attribute '{}' on {}: only a namespace() takes "
                      "attributes",
                      target.attribute, type_object(object)));
    }
    object.as_namespace().attributes.set(target.attribute, value);
    return;
  }
  if (target.names.size() == 1) {
    scope_->variables[target.names[0]] = value;
    return;
  }
  List items = iterate(value);
  if (items.size() != target.names.size()) {
    throw Error(items.size() < target.names.size()
                    ? fmt::format("not enough values to unpack (expected {}, got {})",
                                  target.names.size(), items.size())
                    : fmt::format("too many values to unpack (expected {})", target.names.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) scope_->variables[target.names[i]] = items[i];
}

void Interpreter::execute_for(const Statement& statement) {
  List items = iterate(evaluate(*statement.expression));
  std::shared_ptr<Scope> outer = scope_;
  if (statement.condition) {
    List kept;
    for (const Value& item : items) {
      scope_ = std::make_shared<Scope>();
      scope_->parent = outer;
      assign(statement.target, item);
      bool keep = evaluate(*statement.condition).truthy();
      scope_ = outer;
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    scope_ = std::make_shared<Scope>();
    scope_->parent = outer;
    assign(statement.target, items[i]);
    auto loop = std::make_shared<Dict>();
    loop->entries.reserve(12);
    loop->set("index", Value(i + 1));
    loop->set("index0", Value(i));
    loop->set("revindex", Value(length - i));
    loop->set("revindex0", Value(length - i - 1));
    loop->set("first", Value(i == 0));
    loop->set("last", Value(i == length - 1));
    loop->set("length", Value(length));
    loop->set("depth", Value(1));
    loop->set("depth0", Value(0));
    loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop->set("nextitem",
              i + 1 < length ? items[i + 1] : Value::undefined("there is no next item"));
    auto cycle = std::make_shared<Callable>();
    cycle->name = "loop.cycle";
    cycle->function = [i](Interpreter&, CallArguments& arguments) -> Value {
      if (arguments.positional.empty()) throw Error("loop.cycle: no items to cycle");
      return arguments.positional[i % arguments.positional.size()];
    };
    loop->set("cycle", Value(std::shared_ptr<const Callable>(std::move(cycle))));
    scope_->variables["loop"] = Value(std::shared_ptr<const Dict>(std::move(loop)));
    Flow flow = execute(statement.body);
    scope_ = outer;
    if (flow == Flow::kBreak) break;
  }
  if (length == 0 && !statement.else_body.empty()) execute(statement.else_body);
}

std::string Interpreter::render_body(const Body& body, std::shared_ptr<Scope> scope) {
  std::string text;
  std::string* saved_output = output_;
  std::shared_ptr<Scope> saved_scope = scope_;
  output_ = &text;
  scope_ = std::move(scope);
  execute(body);
  output_ = saved_output;
  scope_ = saved_scope;
  return text;
}

// A macro (or a call block's `caller`) as a callable: each call runs the body in a new scope
// whose parent is the scope the macro was defined in, with the parameters bound.
Value Interpreter::make_macro(const std::vector<Parameter>& parameters, const Body& body,
                              const std::string& name) {
  auto callable = std::make_shared<Callable>();
  callable->name = name;
  // Weak: the scope holds the macro, so a strong reference back would be a cycle that is never
  // freed. A macro called after its scope ended (carried out of a loop in a namespace) fails.
  std::weak_ptr<Scope> closure = scope_;
  callable->function = [&parameters, &body, name, closure](Interpreter& self,
                                                           CallArguments& arguments) -> Value {
    if (arguments.positional.size() > parameters.size()) {
      throw Error(
          fmt::format("macro '{}' takes not more than {} argument(s)", name, parameters.size()));
    }
    if (self.depth_ >= kMaxCallDepth) {
      throw Error(fmt::format("macro '{}': calls nested deeper than {}", name, kMaxCallDepth));
    }
    auto scope = std::make_shared<Scope>();
    scope->parent = closure.lock();
    if (!scope->parent) {
      throw Error(fmt::format("macro '{}' called after the block that defined it ended", name));
    }
    std::vector<bool> bound(parameters.size(), false);
    for (size_t i = 0; i < arguments.positional.size(); ++i) {
      scope->variables[parameters[i].name] = arguments.positional[i];
      bound[i] = true;
    }
    for (auto& [keyword, value] : arguments.keyword) {
      size_t i = 0;
      while (i < parameters.size() && parameters[i].name != keyword) ++i;
      if (i == parameters.size()) {
        if (keyword != "caller") {
          throw Error(fmt::format("macro '{}' takes no keyword argument '{}'", name, keyword));
        }
        scope->variables["caller"] = value;
        continue;
      }
      if (bound[i]) {
        throw Error(fmt::format("macro '{}' got multiple values for argument '{}'", name, keyword));
      }
      scope->variables[keyword] = value;
      bound[i] = true;
    }
    std::shared_ptr<Scope> saved = self.scope_;
    self.scope_ = scope;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (bound[i]) continue;
      scope->variables[parameters[i].name] =
          parameters[i].default_value ? self.evaluate(*parameters[i].default_value)
                                      : Value::undefined(fmt::format(
                                            "parameter '{}' was not provided", parameters[i].name));
    }
    self.scope_ = saved;
    ++self.depth_;
    std::string text = self.render_body(body, scope);
    --self.depth_;
    return Value(std::move(text));
  };
  return Value(std::shared_ptr<const Callable>(std::move(callable)));
}

}  // namespace pagedattn::jinja
