// The chat-template interpreter's filters, tests, str / dict methods and globals. Expected strings
// are written by hand from Jinja2's and Python's documented behaviour (transformers' tojson:
// json.dumps with ensure_ascii=False).
#include "jinja_test_util.h"

namespace pagedattn::testing {
namespace {

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(render_template("[{{ '  a b \n'|trim }}] [{{ 'xxaxx'|trim('x') }}]"), "[a b] [a]");
  EXPECT_EQ(render_template("{{ 'abC'|upper }} {{ 'AbC'|lower }} {{ 'hELLO world'|capitalize }}"),
            "ABC abc Hello world");
  EXPECT_EQ(render_template("{{ 'hello big-world(x)'|title }}"), "Hello Big-World(X)");
  EXPECT_EQ(render_template("{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }}"),
            "bbb bba");
  EXPECT_EQ(render_template("{{ 'a<b>&\"'|escape }} {{ '<x>'|safe }}"), "a&lt;b&gt;&amp;&#34; <x>");
  EXPECT_EQ(render_template("{{ 12|string ~ 'x' }} {{ 'one two  three'|wordcount }}"), "12x 3");
  EXPECT_EQ(render_template("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"),
            "a\n  b\n\n  c|  a\n  b");
}

TEST(JinjaFilters, Sequences) {
  const char* context = R"({"xs": [3, 1, 2], "people": [{"n": "b", "a": 2}, {"n": "a", "a": 1}]})";
  EXPECT_EQ(
      render_template("{{ xs|length }} {{ xs|count }} {{ 'héllo'|length }} {{ {'a': 1}|length }}",
                      context),
      "3 3 5 1");
  EXPECT_EQ(
      render_template("{{ xs|first }} {{ xs|last }} {{ xs|join(', ') }} {{ xs|join }}", context),
      "3 2 3, 1, 2 312");
  EXPECT_EQ(
      render_template("{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ xs|reverse|list }}", context),
      "[1, 2, 3] [3, 2, 1] [2, 1, 3]");
  EXPECT_EQ(render_template("{{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|unique|list }}"),
            "['A', 'a', 'b'] ['b', 'A']");
  EXPECT_EQ(render_template("{{ people|map(attribute='n')|join }} {{ people|sort(attribute='a')"
                            "|map(attribute='n')|list }}",
                            context),
            "ba ['a', 'b']");
  EXPECT_EQ(render_template("{{ people|selectattr('a', 'equalto', 2)|map(attribute='n')|list }} "
                            "{{ people|rejectattr('a', '==', 2)|map(attribute='n')|first }}",
                            context),
            "['b'] a");
  EXPECT_EQ(
      render_template("{{ [1, 0, 2, none]|select|list }} {{ [1, 2, 3, 4]|select('odd')|list }}"
                      " {{ [1, 2, 3]|reject('divisibleby', 3)|list }}"),
      "[1, 2] [1, 3] [1, 2]");
  EXPECT_EQ(render_template("{{ ['a', 'b']|map('upper')|list }} {{ 'ab'|list }} "
                            "{{ {'k': 1}|items|list }}"),
            "['A', 'B'] ['a', 'b'] [('k', 1)]");
  EXPECT_EQ(render_template("{{ [1, 2, 3]|sum }} {{ [2, 5, 1]|max }} {{ [2, 5, 1]|min }}"),
            "6 5 1");
}

TEST(JinjaFilters, Numbers) {
  EXPECT_EQ(render_template("{{ '42'|int + 1 }} {{ 'x'|int }} {{ '3.7'|int }} {{ 3.9|int }}"),
            "43 0 3 3");
  EXPECT_EQ(render_template("{{ '2.5'|float }} {{ 'y'|float }} {{ 2|float }}"), "2.5 0.0 2.0");
  EXPECT_EQ(render_template("{{ -3|abs }} {{ (-2.5)|abs }} {{ 2.5|round }} {{ 3.5|round }} "
                            "{{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 7|round }}"),
            "3 2.5 2.0 4.0 2.67 3.0 7");
}

TEST(JinjaFilters, DefaultAndTojson) {
  EXPECT_EQ(
      render_template("{{ missing|default('d') }} {{ ''|default('d') }}|{{ ''|d('d', true) }}"),
      "d |d");
  EXPECT_EQ(
      render_template("{{ x|tojson }}", R"({"x": {"b": [1, 2.5, null, true], "a": "é\n\"<"}})"),
      R"({"b": [1, 2.5, null, true], "a": "é\n\"<"})");
  EXPECT_EQ(render_template("{{ x|tojson(indent=2) }}", R"({"x": {"a": [1, {}], "b": []}})"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(render_template("{{ x|tojson(sort_keys=true) }} {{ x|tojson(separators=(',', ':')) }}",
                            R"({"x": {"b": 1, "a": 2}})"),
            R"({"a": 2, "b": 1} {"b":1,"a":2})");
  EXPECT_EQ(render_template("{{ 'tab\there'|tojson }} {{ 1.0|tojson }} {{ none|tojson }}"),
            R"("tab\there" 1.0 null)");
}

TEST(JinjaTests, TypeTests) {
  EXPECT_EQ(
      render_template("{{ 'a' is string }}{{ 1 is string }}{{ 1 is number }}{{ 1.5 is number }}"
                      "{{ true is number }}{{ 1 is integer }}{{ true is integer }}"
                      "{{ 1.5 is float }}"),
      "TrueFalseTrueTrueTrueTrueFalseTrue");
  EXPECT_EQ(render_template("{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}"
                            "{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}"
                            "{{ 1 is sequence }}"),
            "TrueFalseTrueTrueFalseTrueFalse");
  EXPECT_EQ(render_template("{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}"
                            "{{ 1 is true }}{{ false is false }}{{ none is none }}{{ 0 is none }}"),
            "TrueFalseTrueFalseTrueTrueFalse");
  EXPECT_EQ(render_template("{{ x is not none }}{{ x is not defined }}", R"({"x": 1})"),
            "TrueFalse");
}

TEST(JinjaTests, ValueTests) {
  EXPECT_EQ(render_template("{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}"
                            "{{ 9 is divisibleby(4) }}{{ 2 is in [1, 2] }}{{ 'x' is in 'abc' }}"),
            "TrueFalseTrueFalseTrueFalse");
  EXPECT_EQ(render_template("{{ 'a' is equalto 'a' }}{{ 1 is eq 2 }}{{ 2 is gt 1 }}"
                            "{{ 2 is ne 2 }}{{ 1 is lt 2 }}"),
            "TrueFalseTrueFalseTrue");
}

TEST(JinjaMethods, Strings) {
  EXPECT_EQ(render_template("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}"),
            "TrueTrue");
  EXPECT_EQ(render_template(
                "[{{ '  a  '.strip() }}][{{ 'xxaxx'.lstrip('x') }}][{{ '\na\n'.rstrip('\n') }}]"),
            "[a][axx][\na]");
  EXPECT_EQ(render_template("{{ 'a</think>b</think>c'.split('</think>') }} "
                            "{{ 'a</think>b</think>c'.split('</think>')[-1] }} "
                            "{{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} "
                            "{{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', 'c'] c ['a', 'b'] ['a', 'b,c'] ['a,b', 'c']");
  EXPECT_EQ(render_template("{{ 'aXa'.replace('a', 'b') }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} "
                            "{{ 'hi there'.title() }} {{ 'hI'.capitalize() }}"),
            "bXb AB ab Hi There Hi");
  EXPECT_EQ(
      render_template("{{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} "
                      "{{ '-'.join(['a', 'b']) }}"),
      "2 -1 2 a-b");
}

TEST(JinjaMethods, DictsAndGlobals) {
  const char* context = R"({"d": {"a": 1, "b": null}})";
  EXPECT_EQ(render_template("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d['b'] }}",
                            context),
            "1 None 5 None");
  EXPECT_EQ(
      render_template("{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}", context),
      "['a', 'b'] [1, None] [('a', 1), ('b', None)]");
  EXPECT_EQ(
      render_template("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }}"),
      "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  EXPECT_EQ(render_template("{{ dict(a=1, b='x') }}"), "{'a': 1, 'b': 'x'}");
  // strftime_now is the local time; its year is four digits
  EXPECT_EQ(render_template("{{ strftime_now('%Y')|length }}"), "4");
}

}  // namespace
}  // namespace pagedattn::testing
