// The chat-template interpreter's errors: each names the line and column and what went wrong, at
// compile time (syntax, unknown tag / filter / test) or at render time (undefined used further,
// type errors, raise_exception with the template's own message, the sandbox's refusals).
#include "jinja_test_util.h"

namespace pagedattn::testing {
namespace {

TEST(JinjaErrors, UnknownFilterTestAndTag) {
  EXPECT_EQ(template_error("line one\n{{ x|frobnicate }}"),
            "chat template: line 2, column 6: No filter named 'frobnicate'.");
  EXPECT_EQ(template_error("{% if x is prime %}{% endif %}"),
            "chat template: line 1, column 12: No test named 'prime'.");
  EXPECT_EQ(template_error("a\n\n  {% include 'x' %}"),
            "chat template: line 3, column 6: Encountered unknown tag 'include'.");
}

TEST(JinjaErrors, UnclosedBlocksAndTags) {
  EXPECT_EQ(template_error("{% for x in xs %}\n{{ x }}"),
            "chat template: line 1, column 4: unexpected end of template: the 'for' block is not "
            "closed (expected 'endfor' or 'else')");
  EXPECT_EQ(template_error("ok\n{% if a %}x{% elif b %}y"),
            "chat template: line 2, column 4: unexpected end of template: the 'if' block is not "
            "closed (expected 'elif' or 'else' or 'endif')");
  EXPECT_EQ(template_error("{{ 1 + }}"),
            "chat template: line 1, column 8: unexpected end of "
            "print statement");
  EXPECT_EQ(template_error("{{ x "),
            "chat template: line 1, column 1: unexpected end of "
            "template, expected '}}'");
  EXPECT_EQ(template_error("{# never closed"),
            "chat template: line 1, column 1: Missing end of comment tag");
  EXPECT_EQ(template_error("{{ 'abc }}"),
            "chat template: line 1, column 4: unterminated string "
            "literal");
  EXPECT_EQ(template_error("{% endfor %}"),
            "chat template: line 1, column 4: Encountered unknown tag 'endfor'.");
  EXPECT_EQ(template_error("{% break %}"),
            "chat template: line 1, column 4: 'break' outside of a for loop");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  const std::string source =
      "{% for m in messages %}\n"
      "{% if m.role not in ['user', 'assistant'] %}\n"
      "  {{ raise_exception('Unsupported role: ' + m.role) }}\n"
      "{% endif %}{% endfor %}";
  try {
    render_template(source, R"({"messages": [{"role": "user"}, {"role": "robot"}]})");
    FAIL() << "no exception";
  } catch (const ChatTemplateError& error) {
    EXPECT_TRUE(error.raised_by_template());
    EXPECT_EQ(error.reason(), "Unsupported role: robot");
    EXPECT_EQ(error.line(), 3);
    EXPECT_STREQ(error.what(),
                 "chat template: line 3, column 6: raise_exception: Unsupported role: robot");
  }
}

TEST(JinjaErrors, UndefinedUsedFurther) {
  EXPECT_EQ(template_error("{{ missing.attr }}"),
            "chat template: line 1, column 11: 'missing' is undefined");
  EXPECT_EQ(template_error("\n{{ d.a.b }}", R"({"d": {}})"),
            "chat template: line 2, column 7: 'dict object' has no attribute 'a'");
  EXPECT_EQ(template_error("{{ m.content.startswith('x') }}", R"({"m": {"role": "user"}})"),
            "chat template: line 1, column 13: 'dict object' has no attribute 'content'");
  EXPECT_EQ(template_error("{{ missing + 1 }}"),
            "chat template: line 1, column 12: 'missing' is undefined");
  EXPECT_EQ(template_error("{{ missing() }}"),
            "chat template: line 1, column 4: 'missing' is undefined");
  EXPECT_EQ(template_error("{{ 'a' ~ 1 + 2 }}"),
            "chat template: line 1, column 12: can only concatenate str (not \"int\") to str");
}

TEST(JinjaErrors, TypeErrors) {
  EXPECT_EQ(template_error("{{ 'a' + 1 }}"),
            "chat template: line 1, column 8: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(template_error("{{ 1 / 0 }}"), "chat template: line 1, column 6: division by zero");
  EXPECT_EQ(template_error("{% for x in 5 %}{% endfor %}"),
            "chat template: line 1, column 4: 'int' object is not iterable");
  EXPECT_EQ(template_error("{% set a, b = [1] %}"),
            "chat template: line 1, column 4: not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(template_error("{{ 'x'.nosuchmethod() }}"),
            "chat template: line 1, column 7: 'str object' has no attribute 'nosuchmethod'");
  EXPECT_EQ(template_error("{% set x = 1 %}{% set x.a = 2 %}"),
            "chat template: line 1, column 19: cannot assign attribute 'a' on 'int object': only "
            "a namespace() takes attributes");
}

TEST(JinjaErrors, SandboxRefusesMutation) {
  EXPECT_EQ(template_error("{% set xs = [] %}{{ xs.append(1) }}"),
            "chat template: line 1, column 23: access to attribute 'append' of 'list' object is "
            "unsafe.");
}

TEST(JinjaErrors, RenderRejectsANonObjectContext) {
  EXPECT_THROW(ChatTemplate::compile("x").render(nlohmann::ordered_json::array()), Error);
}

}  // namespace
}  // namespace pagedattn::testing
