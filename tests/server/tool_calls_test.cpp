// The tool-call parser (server_tool_calls.h) per format, against hand-written expectations: the
// content and the calls (name, arguments as compact JSON) of each model output. Every case is
// also fed streamed: cut at every single point, at every pair of points, one byte at a time and
// in random pieces; each way must give exactly the same content and calls, which is what keeps
// a marker fragment out of streamed content (content, once sent, cannot be taken back). Plus
// the format names and `auto`'s choice over the real templates' markers and model types.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "pagedattn/server_tool_calls.h"

namespace pagedattn::server {
namespace {

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};

struct Parsed {
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Parsed&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Parsed& parsed) {
  out << "content '" << parsed.content << "', calls [";
  for (const Call& call : parsed.calls) out << " " << call.name << " " << call.arguments;
  return out << " ]";
}

void collect(const std::vector<ToolCallPiece>& pieces, Parsed& parsed) {
  for (const ToolCallPiece& piece : pieces) {
    if (piece.call) {
      EXPECT_TRUE(piece.content.empty());
      parsed.calls.push_back({piece.call->name, piece.call->arguments});
    } else {
      EXPECT_FALSE(piece.content.empty()) << "an empty content piece";
      parsed.content += piece.content;
    }
  }
}

// Feeds `text` cut at `cuts` (increasing offsets).
Parsed parse_pieces(ToolCallFormat format, const std::string& text,
                    const std::vector<size_t>& cuts) {
  ToolCallParser parser(format);
  Parsed parsed;
  size_t from = 0;
  for (const size_t cut : cuts) {
    collect(parser.push(text.substr(from, cut - from)), parsed);
    from = cut;
  }
  collect(parser.push(text.substr(from)), parsed);
  collect(parser.finish(), parsed);
  return parsed;
}

struct Case {
  std::string label;
  ToolCallFormat format;
  std::string text;
  Parsed expected;
};

const std::string kWeatherParis = R"({"location":"Paris","unit":"celsius"})";
const std::string kWeatherTokyo = "{\"location\":\"\xE6\x9D\xB1\xE4\xBA\xAC\"}";  // 東京

std::vector<Case> cases() {
  const ToolCallFormat hermes = ToolCallFormat::kHermes;
  const ToolCallFormat llama = ToolCallFormat::kLlama3Json;
  const ToolCallFormat deepseek = ToolCallFormat::kDeepSeekV3;
  const std::string paris_call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", "
      "\"unit\": \"celsius\"}}\n</tool_call>";
  const std::string tokyo_call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
      "\"\xE6\x9D\xB1\xE4\xBA\xAC\"}}\n</tool_call>";
  const std::string bad_call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {location: Paris}}\n</tool_call>";
  const std::string ds_begin = "<｜tool▁calls▁begin｜>", ds_end = "<｜tool▁calls▁end｜>";
  const auto ds_call = [](const std::string& name, const std::string& arguments) {
    return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + arguments +
           "\n```<｜tool▁call▁end｜>";
  };
  return {
      {"hermes plain text", hermes, "Hello there, how are you?", {"Hello there, how are you?", {}}},
      {"hermes text with angle brackets",
       hermes,
       "a < b and <tool> or <tool_cal x",
       {"a < b and <tool> or <tool_cal x", {}}},
      {"hermes trailing whitespace kept", hermes, "Hi \n", {"Hi \n", {}}},
      {"hermes text ends inside a marker", hermes, "see <tool_ca", {"see <tool_ca", {}}},
      {"hermes one call", hermes, paris_call, {"", {{"get_weather", kWeatherParis}}}},
      {"hermes content then two calls",
       hermes,
       "Let me check both.\n" + paris_call + "\n" + tokyo_call,
       {"Let me check both.", {{"get_weather", kWeatherParis}, {"get_weather", kWeatherTokyo}}}},
      {"hermes text after the call",
       hermes,
       paris_call + "\n\nDone.",
       {"Done.", {{"get_weather", kWeatherParis}}}},
      {"hermes invalid JSON stays text", hermes, "Try: " + bad_call, {"Try: " + bad_call, {}}},
      {"hermes invalid then valid",
       hermes,
       bad_call + "\n" + paris_call,
       {bad_call, {{"get_weather", kWeatherParis}}}},
      {"hermes no name",
       hermes,
       "<tool_call>{\"arguments\": {}}</tool_call>",
       {"<tool_call>{\"arguments\": {}}</tool_call>", {}}},
      {"hermes arguments as a string",
       hermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}</tool_call>",
       {"", {{"f", R"({"x":[1,2]})"}}}},
      {"hermes parameters key, no arguments",
       hermes,
       "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": \"}\"}}</tool_call>"
       "<tool_call>{\"name\": \"g\"}</tool_call>",
       {"", {{"f", R"({"a":"}"})"}, {"g", "{}"}}}},
      {"hermes key order kept",
       hermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": 2}}</tool_call>",
       {"", {{"f", R"({"z":1,"a":2})"}}}},
      {"hermes unterminated valid call",
       hermes,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
       {"", {{"f", "{}"}}}},
      {"hermes unterminated invalid call",
       hermes,
       "ok <tool_call>\n{\"name\": \"f\", \"argu",
       {"ok <tool_call>\n{\"name\": \"f\", \"argu", {}}},
      {"llama3_json one call",
       llama,
       R"({"name": "get_weather", "parameters": {"location": "Paris", "unit": "celsius"}})",
       {"", {{"get_weather", kWeatherParis}}}},
      {"llama3_json two calls and whitespace",
       llama,
       " \n{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\", \"unit\": "
       "\"celsius\"}}; {\"name\": \"search\", \"arguments\": {\"query\": \"a;b {c}\"}}",
       {"", {{"get_weather", kWeatherParis}, {"search", R"({"query":"a;b {c}"})"}}}},
      {"llama3_json text", llama, "The weather is {nice}.", {"The weather is {nice}.", {}}},
      {"llama3_json JSON that is no call", llama, R"({"answer": 42})", {R"({"answer": 42})", {}}},
      {"llama3_json invalid JSON",
       llama,
       R"({"name": "f", "parameters": {oops}})",
       {R"({"name": "f", "parameters": {oops}})", {}}},
      {"llama3_json call then text",
       llama,
       R"({"name": "f", "parameters": {}}; and then)",
       {"and then", {{"f", "{}"}}}},
      {"llama3_json unterminated",
       llama,
       R"({"name": "f", "param)",
       {R"({"name": "f", "param)", {}}},
      {"deepseek_v3 one call",
       deepseek,
       ds_begin + ds_call("get_weather", R"({"location": "Paris", "unit": "celsius"})") + ds_end,
       {"", {{"get_weather", kWeatherParis}}}},
      {"deepseek_v3 content and two calls",
       deepseek,
       "Checking.\n" + ds_begin +
           ds_call("get_weather", R"({"location": "Paris", "unit": "celsius"})") + "\n" +
           ds_call("search", R"({"query": "x"})") + ds_end,
       {"Checking.", {{"get_weather", kWeatherParis}, {"search", R"({"query":"x"})"}}}},
      {"deepseek_v3 invalid call before a valid one",
       deepseek,
       ds_begin + ds_call("f", "{oops") + "\n" + ds_call("g", "{}") + ds_end,
       {ds_call("f", "{oops"), {{"g", "{}"}}}},
      {"deepseek_v3 section without a valid call",
       deepseek,
       "A" + ds_begin + ds_call("f", "{oops") + ds_end + "B",
       {"A" + ds_begin + ds_call("f", "{oops") + ds_end + "B", {}}},
      {"deepseek_v3 plain text", deepseek, "Just text <｜tool▁", {"Just text <｜tool▁", {}}},
  };
}

void PrintTo(const Case& c, std::ostream* out) { *out << c.label; }

class ToolCallParserCases : public ::testing::TestWithParam<Case> {};

TEST_P(ToolCallParserCases, WholeText) {
  const Case& c = GetParam();
  EXPECT_EQ(parse_pieces(c.format, c.text, {}), c.expected);
}

TEST_P(ToolCallParserCases, EverySplitGivesTheSameResult) {
  const Case& c = GetParam();
  const size_t n = c.text.size();
  for (size_t cut = 0; cut <= n; ++cut) {
    ASSERT_EQ(parse_pieces(c.format, c.text, {cut}), c.expected) << "cut at " << cut;
  }
  for (size_t first = 1; first < n; ++first) {
    for (size_t second = first + 1; second < n; ++second) {
      ASSERT_EQ(parse_pieces(c.format, c.text, {first, second}), c.expected)
          << "cuts at " << first << ", " << second;
    }
  }
  std::vector<size_t> bytes;
  for (size_t cut = 1; cut < n; ++cut) bytes.push_back(cut);
  ASSERT_EQ(parse_pieces(c.format, c.text, bytes), c.expected) << "one byte at a time";
  std::mt19937 random(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t cut = 1; cut < n; ++cut) {
      if (random() % 4 == 0) cuts.push_back(cut);
    }
    ASSERT_EQ(parse_pieces(c.format, c.text, cuts), c.expected) << "random trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ToolCallParserCases, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name;
                           for (const char c : info.param.label) {
                             name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           }
                           return name;
                         });

TEST(ToolCallParser, HoldsBackOnlyWhatMayBeAMarker) {
  ToolCallParser parser(ToolCallFormat::kHermes);
  Parsed parsed;
  collect(parser.push("Sure"), parsed);
  EXPECT_EQ(parsed.content, "Sure");  // nothing to hold: out at once
  collect(parser.push(", one moment <tool"), parsed);
  EXPECT_EQ(parsed.content, "Sure, one moment");  // " <tool" may start a call
  collect(parser.push("box>"), parsed);
  EXPECT_EQ(parsed.content, "Sure, one moment <toolbox>");
  EXPECT_TRUE(parsed.calls.empty());
}

TEST(ToolCallParser, CallComesOutWhenItsEndArrives) {
  ToolCallParser parser(ToolCallFormat::kHermes);
  Parsed parsed;
  collect(parser.push("<tool_call>{\"name\": \"f\", \"arguments\": {}}"), parsed);
  EXPECT_TRUE(parsed.calls.empty());
  collect(parser.push("</tool_call>"), parsed);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0], (Call{"f", "{}"}));
}

TEST(ToolCallFormat, NamesRoundTrip) {
  for (const char* name : {"none", "hermes", "llama3_json", "deepseek_v3"}) {
    const auto format = tool_call_format_from_name(name);
    ASSERT_TRUE(format.has_value()) << name;
    EXPECT_EQ(tool_call_format_name(*format), name);
  }
  EXPECT_FALSE(tool_call_format_from_name("mistral").has_value());
  EXPECT_FALSE(tool_call_format_from_name("auto").has_value());
}

TEST(ToolCallFormat, AutoDetection) {
  // The markers as the shipped templates write them (Qwen3; DeepSeek-V3; Meta's Llama 3.1).
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n{\"name\": \"' }}", "llama"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{'<｜Assistant｜><｜tool▁calls▁begin｜>'}}", ""),
            ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(detect_tool_call_format("{{- \"Environment: ipython\\n\" }}{{- '\"parameters\": ' }}",
                                    "llama"),
            ToolCallFormat::kLlama3Json);
  // No markers: the family decides; a family without a format gets none.
  EXPECT_EQ(detect_tool_call_format("{{ messages }}", "qwen2"), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}", "qwen3_moe"), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}", "deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}", "llama"), ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format("", ""), ToolCallFormat::kNone);
}

}  // namespace
}  // namespace pagedattn::server
