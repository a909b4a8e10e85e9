// The chat-template interpreter's statements: for (loop variables, loop controls, else, filters,
// unpacking), if / elif / else, set (plain, unpacking, block, namespace attributes) and Jinja2's
// scoping, macro / call, filter blocks, with, and the undefined semantics. Expected strings are
// written by hand.
#include "jinja_test_util.h"

namespace pagedattn::testing {
namespace {

TEST(JinjaFor, LoopVariables) {
  EXPECT_EQ(render_template("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                            "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};"
                            "{% endfor %}",
                            R"({"xs": ["a", "b"]})"),
            "1021TrueFalse2;2110FalseTrue2;");
  EXPECT_EQ(render_template("{% for x in 'abc' %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }},"
                            "{% endfor %}"),
            "ab,abc,bc,");
  EXPECT_EQ(render_template("{% for x in [1, 2, 3] %}{{ loop.cycle('o', 'e') }}{% endfor %}"),
            "oeo");
}

TEST(JinjaFor, BreakContinueElse) {
  EXPECT_EQ(render_template("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}"
                            "{{ x }}{% endfor %}"),
            "012");
  EXPECT_EQ(render_template("{% for x in range(5) %}{% if x is odd %}{% continue %}{% endif %}"
                            "{{ x }}{% endfor %}"),
            "024");
  EXPECT_EQ(render_template("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render_template("{% for x in undefined_name %}{{ x }}{% else %}none{% endfor %}"),
            "none");
}

TEST(JinjaFor, FilterAndUnpacking) {
  EXPECT_EQ(render_template("{% for x in range(6) if x is even %}{{ x }}/{{ loop.length }} "
                            "{% endfor %}"),
            "0/3 2/3 4/3 ");
  EXPECT_EQ(render_template("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                            R"({"d": {"z": 1, "a": [2]}})"),
            "z=1;a=[2];");
  EXPECT_EQ(render_template("{% for k in d %}{{ k }}{% endfor %}", R"({"d": {"b": 1, "a": 2}})"),
            "ba");
  EXPECT_EQ(render_template("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}"), "3,7,");
  EXPECT_EQ(render_template("{% for (a, b) in [(1, 2)] %}{{ b }}{{ a }}{% endfor %}"), "21");
}

TEST(JinjaFor, NestedLoopsHaveTheirOwnLoopVariable) {
  EXPECT_EQ(render_template("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{% endfor %}"
                            "{{ loop.index }} {% endfor %}"),
            "121 122 ");
}

TEST(JinjaIf, Branches) {
  const char* source =
      "{% if n > 2 %}big{% elif n == 2 %}two{% elif n %}small{% else %}zero"
      "{% endif %}";
  EXPECT_EQ(render_template(source, R"({"n": 5})"), "big");
  EXPECT_EQ(render_template(source, R"({"n": 2})"), "two");
  EXPECT_EQ(render_template(source, R"({"n": 1})"), "small");
  EXPECT_EQ(render_template(source, R"({"n": 0})"), "zero");
}

TEST(JinjaIf, Truthiness) {
  EXPECT_EQ(
      render_template("{% for v in [0, 0.0, '', [], {}, none, false, 1, 'a', [0], {'k': 0}] %}"
                      "{{ 'T' if v else 'F' }}{% endfor %}"),
      "FFFFFFFTTTT");
  EXPECT_EQ(render_template("{{ 'T' if missing else 'F' }}"), "F");
}

TEST(JinjaSet, ScopesFollowJinja) {
  // set inside if leaks (if is not a scope); inside a for loop it does not.
  EXPECT_EQ(render_template("{% if true %}{% set x = 1 %}{% endif %}{{ x }}"), "1");
  EXPECT_EQ(render_template("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 10 %}"
                            "{{ x }} {% endfor %}{{ x }}"),
            "111 112 1");
  EXPECT_EQ(render_template("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
}

TEST(JinjaSet, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(render_template("{% set ns = namespace(count=0, seen=false) %}"
                            "{% for x in [1, 2, 3] %}{% set ns.count = ns.count + x %}"
                            "{% set ns.seen = true %}{% endfor %}{{ ns.count }} {{ ns.seen }}"),
            "6 True");
  EXPECT_EQ(render_template("{% set ns = namespace() %}{% set ns.items = [] %}"
                            "{% for x in 'ab' %}{% set ns.items = ns.items + [x] %}{% endfor %}"
                            "{{ ns.items }}"),
            "['a', 'b']");
}

TEST(JinjaSet, BlockSet) {
  EXPECT_EQ(render_template("{% set greeting %}Hi {{ name }}!{% endset %}[{{ greeting }}]",
                            R"({"name": "Ann"})"),
            "[Hi Ann!]");
  EXPECT_EQ(render_template("{% set loud | upper %}quiet{% endset %}{{ loud }}"), "QUIET");
}

TEST(JinjaMacro, DefaultsKeywordsAndLateBinding) {
  EXPECT_EQ(render_template("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ x }}{% endmacro %}"
                            "{% set x = 9 %}{{ m(1) }} {{ m(1, b=3) }} {{ m(b=4, a=5) }}"),
            "129 139 549");
  EXPECT_EQ(render_template("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}"), "[]");
  EXPECT_EQ(render_template("{% macro twice(x) %}{{ x ~ x }}{% endmacro %}{{ twice('ab')|upper }}"),
            "ABAB");
}

TEST(JinjaMacro, CallBlockPassesCaller) {
  EXPECT_EQ(render_template("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>"
                            "{% endmacro %}{% call wrap('b') %}bold{% endcall %}"),
            "<b>bold</b>");
  EXPECT_EQ(render_template("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}"
                            "{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}"),
            "<1><2>");
}

TEST(JinjaBlocks, FilterWithAndGeneration) {
  EXPECT_EQ(render_template("{% filter upper %}abc {{ 'd' }}{% endfilter %}"), "ABC D");
  EXPECT_EQ(render_template("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_EQ(render_template("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaUndefined, PrintsEmptyAndTestsFalse) {
  EXPECT_EQ(render_template("[{{ missing }}]{{ missing is defined }}{{ missing is undefined }}"),
            "[]FalseTrue");
  EXPECT_EQ(render_template("[{{ d.nope }}]{{ d.nope is defined }}", R"({"d": {}})"), "[]False");
  EXPECT_EQ(render_template("{{ missing|length }}{{ missing|default('x') }}[{{ missing|trim }}]"),
            "0x[]");
  EXPECT_EQ(render_template("{{ missing == none }}{{ 'a' in missing }}"), "FalseFalse");
  EXPECT_EQ(render_template("{{ m['content'] is none }}", R"({"m": {"content": null}})"), "True");
}

}  // namespace
}  // namespace pagedattn::testing
