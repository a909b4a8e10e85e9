// The chat-template interpreter's syntax: delimiters, whitespace control with transformers'
// trim_blocks + lstrip_blocks, comments, raw blocks, literals, operators and their precedence.
// Every expected string is written by hand from Jinja2's documented behaviour.
#include "jinja_test_util.h"

namespace pagedattn::testing {
namespace {

TEST(JinjaSyntax, TextAndPrint) {
  EXPECT_EQ(render_template("Hello {{ name }}!", R"({"name": "world"})"), "Hello world!");
  EXPECT_EQ(render_template("{{ '}}' }}"), "}}");  // a closing delimiter inside a string
  EXPECT_EQ(render_template("{{ {'a': {'b': 1}}['a']['b'] }}"), "1");  // }} inside brackets
  EXPECT_EQ(render_template("a { b } c"), "a { b } c");
  EXPECT_EQ(render_template(""), "");
}

TEST(JinjaSyntax, TrailingNewlineOfTheSourceIsDropped) {
  EXPECT_EQ(render_template("x\n"), "x");
  EXPECT_EQ(render_template("x\n\n"), "x\n");
  EXPECT_EQ(render_template("a\r\nb\rc"), "a\nb\nc");
}

TEST(JinjaSyntax, TrimBlocksDropsOneNewlineAfterABlockTag) {
  EXPECT_EQ(render_template("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render_template("{% if true %}\n\nyes{% endif %}"), "\nyes");
  // not after a print tag
  EXPECT_EQ(render_template("{{ 1 }}\n2"), "1\n2");
  // nor with +%}
  EXPECT_EQ(render_template("{% if true +%}\nyes{% endif %}"), "\nyes");
}

TEST(JinjaSyntax, LstripBlocksRemovesIndentationBeforeBlockTags) {
  EXPECT_EQ(render_template("  {% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  // not when text precedes the tag on its line, and not before {{
  EXPECT_EQ(render_template("a {% if true %}b{% endif %}"), "a b");
  EXPECT_EQ(render_template("  {{ 1 }}"), "  1");
  // {%+ keeps the indentation
  EXPECT_EQ(render_template("  {%+ if true %}x{% endif %}"), "  x");
  // comments too
  EXPECT_EQ(render_template("a\n    {# note #}\nb"), "a\nb");
}

TEST(JinjaSyntax, MinusStripsAllWhitespace) {
  EXPECT_EQ(render_template("a  \n {{- 'b' -}} \n\n c"), "abc");
  EXPECT_EQ(render_template("a\n\n{%- if true -%}\n\n  b  {%- endif %}"), "ab");
  EXPECT_EQ(render_template("x {#- comment -#}   y"), "xy");
}

TEST(JinjaSyntax, RawBlocksAreVerbatim) {
  EXPECT_EQ(render_template("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(JinjaSyntax, Literals) {
  EXPECT_EQ(render_template("{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 2.5 }} {{ 1e3 }} {{ 1.0 }}"),
            "42 -7 1000 2.5 1000.0 1.0");
  EXPECT_EQ(render_template("{{ true }} {{ False }} {{ none }} {{ None }}"),
            "True False None None");
  EXPECT_EQ(render_template(R"({{ 'a\nb' }}|{{ "tab\tq\"" }}|{{ '\x41\u00e9' }}|{{ 'x' 'y' }})"),
            "a\nb|tab\tq\"|A\xC3\xA9|xy");
  EXPECT_EQ(render_template("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
  EXPECT_EQ(render_template("{{ {'k': 'v', 'n': [1]} }}"), "{'k': 'v', 'n': [1]}");
  EXPECT_EQ(render_template("{{ (1, 2) }} {{ () }} {{ (1,) }} {{ (1, 2) == [1, 2] }}"),
            "(1, 2) () (1,) False");
  EXPECT_EQ(render_template(R"({{ ["it's", 'say "hi"'] }})"), R"(["it's", 'say "hi"'])");
}

TEST(JinjaSyntax, FloatsPrintAsPython) {
  EXPECT_EQ(render_template("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }}"),
            "0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001");
}

TEST(JinjaSyntax, Arithmetic) {
  EXPECT_EQ(render_template("{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 6 / 3 }}"),
            "10 -3 42 3.5 2.0");
  EXPECT_EQ(render_template("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }}"),
            "3 -4 1 2 1.5");
  EXPECT_EQ(render_template("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}"), "1024 0.5 64");
  EXPECT_EQ(render_template("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }}"),
            "ababab [1, 1] [1, 2] ab");
  EXPECT_EQ(render_template("{{ 1 ~ 'x' ~ none ~ undefined_name }}"), "1xNone");
  EXPECT_EQ(render_template("{{ true + 1 }}"), "2");
}

TEST(JinjaSyntax, Precedence) {
  EXPECT_EQ(render_template("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }}"), "7 9 4");
  // ~ binds tighter than + and -, looser than * and /
  EXPECT_EQ(render_template("{{ 'a' ~ 2 * 3 }} {{ 1 ~ 2 + 3 ~ 4 }}"), "a6 1234");
  // filters bind tighter than arithmetic: (items|length) - 1
  EXPECT_EQ(render_template("{{ items|length - 1 }}", R"({"items": [1, 2, 3]})"), "2");
  EXPECT_EQ(render_template("{{ not true or true }} {{ not (true or true) }}"), "True False");
  EXPECT_EQ(render_template("{{ 1 if false else 2 if true else 3 }}"), "2");
  EXPECT_EQ(render_template("[{{ 1 if false }}]"), "[]");
}

TEST(JinjaSyntax, LogicReturnsOperands) {
  EXPECT_EQ(render_template("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|"), "x b |");
}

TEST(JinjaSyntax, Comparisons) {
  EXPECT_EQ(render_template("{{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True True True False");
  EXPECT_EQ(render_template("{{ 'b' >= 'a' }} {{ [1, 2] < [1, 3] }} {{ 2 <= 2 }}"),
            "True True True");
  EXPECT_EQ(render_template("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}"),
            "True True True");
  EXPECT_EQ(render_template("{{ 3 not in [1, 2] }} {{ 'z' not in 'abc' }}"), "True True");
  EXPECT_EQ(render_template("{{ {'a': [1]} == {'a': [1]} }} {{ none == none }} {{ 1 == '1' }}"),
            "True True False");
}

TEST(JinjaSyntax, SubscriptsAndSlices) {
  const char* context = R"({"xs": [1, 2, 3, 4], "s": "héllo"})";
  EXPECT_EQ(render_template("{{ xs[0] }} {{ xs[-1] }} {{ xs.1 }} {{ s[1] }}", context), "1 4 2 é");
  EXPECT_EQ(render_template("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::2] }}", context),
            "[4, 3, 2, 1] [2, 3, 4] [1, 2, 3] [1, 3]");
  EXPECT_EQ(render_template("{{ s[::-1] }} {{ s[1:3] }} {{ xs[10:] }} {{ xs[-10:1] }}", context),
            "olléh él [] [1]");
  EXPECT_EQ(render_template("[{{ xs[9] }}]", context), "[]");  // missing element: undefined
}

}  // namespace
}  // namespace pagedattn::testing
