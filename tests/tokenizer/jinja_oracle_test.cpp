// The chat-template interpreter against its two oracles, on the real templates of the fetched
// tokenizers (Qwen3, DeepSeek-V3, Llama 3 Instruct; Llama 2 ships none) and on the templates of
// tests/data/tokenizer/templates, over the conversations of chat_conversations.json:
// - Jinja2 (tests/tokenizer/render_jinja2.py, set up as transformers sets it up), run here;
// - transformers' apply_chat_template itself, through the fixture chat_templates.jsonl that
//   scripts/fixtures/chat_template_fixtures.py wrote on a machine with transformers.
// The strings must be identical; where the oracle fails (raise_exception, a type error) this engine
// must fail too, with the template's own message for raise_exception.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/chat_template.h"

namespace pagedattn::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kSourceDir = PAGEDATTN_SOURCE_DIR;
// The real tokenizers' files: $PAGEDATTN_TOKENIZERS when set (as real_tokenizers.cpp reads it),
// else the build tree's copy.
fs::path tokenizer_dir() {
  if (const char* directory = std::getenv("PAGEDATTN_TOKENIZERS")) return directory;
  return PAGEDATTN_TOKENIZER_DATA_DIR;
}
const char* const kRealTokenizers[] = {"qwen3", "deepseek_v3", "llama3"};

Json read_json(const fs::path& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return Json::parse(file);
}

std::string read_text(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

Json tokenizer_config(const std::string& name) {
  fs::path path = tokenizer_dir() / name / "tokenizer_config.json";
  if (!fs::exists(path)) {
    throw std::runtime_error(path.string() +
                             " is missing: the fetch_tokenizers test fixture "
                             "(scripts/fetch-tokenizers) puts it there");
  }
  return read_json(path);
}

// One rendering: a template, a conversation and one variant of keyword arguments.
struct Case {
  std::string label;  // template / conversation / variant, for messages
  std::string source;
  Json config;  // tokenizer_config.json (the special tokens)
  Json messages;
  Json tools = nullptr;
  bool add_generation_prompt = false;
  bool continue_final_message = false;
  Json variables = Json::object();
};

std::vector<Case> build_cases() {
  Json conversations = read_json(kSourceDir / "tests/data/tokenizer/chat_conversations.json");
  std::vector<std::pair<std::string, std::pair<std::string, Json>>> templates;
  for (const char* name : kRealTokenizers) {
    Json config = tokenizer_config(name);
    templates.push_back({name, {config.at("chat_template").get<std::string>(), config}});
  }
  Json own_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  for (const auto& entry : fs::directory_iterator(kSourceDir / "tests/data/tokenizer/templates")) {
    templates.push_back({entry.path().stem().string(), {read_text(entry.path()), own_tokens}});
  }
  std::sort(templates.begin(), templates.end());
  std::vector<Case> cases;
  for (const auto& [template_name, source_and_config] : templates) {
    for (const Json& conversation : conversations.at("conversations")) {
      int variant_index = 0;
      for (const Json& variant : conversation.at("variants")) {
        Case c;
        c.label = template_name + " / " + conversation.at("id").get<std::string>() + " / " +
                  std::to_string(variant_index++) + " " + variant.dump();
        c.source = source_and_config.first;
        c.config = source_and_config.second;
        c.messages = conversation.at("messages");
        for (const auto& [key, value] : variant.items()) {
          if (key == "with_tools")
            c.tools = conversations.at("tools");
          else if (key == "add_generation_prompt")
            c.add_generation_prompt = value.get<bool>();
          else if (key == "continue_final_message")
            c.continue_final_message = value.get<bool>();
          else
            c.variables[key] = value;
        }
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

// This engine's result: {"text": ...} or {"error": ..., "raised": ..., "reason": ...}.
Json render_here(const Case& c) {
  try {
    ChatOptions options = chat_options_from_config(nlohmann::json::parse(c.config.dump()));
    options.add_generation_prompt = c.add_generation_prompt;
    options.continue_final_message = c.continue_final_message;
    options.tools = c.tools;
    for (const auto& [key, value] : c.variables.items()) options.variables[key] = value;
    return {{"text", render_chat(ChatTemplate::compile(c.source), c.messages, options)}};
  } catch (const ChatTemplateError& error) {
    return {{"error", error.what()},
            {"raised", error.raised_by_template()},
            {"reason", error.reason()}};
  } catch (const Error& error) {
    return {{"error", error.what()}, {"raised", false}};
  }
}

// Both rendered the same text, or both failed (with the same message for raise_exception).
void expect_same(const Case& c, const Json& oracle, const Json& here, int& texts) {
  if (oracle.contains("text")) {
    ++texts;
    ASSERT_TRUE(here.contains("text"))
        << c.label << "\noracle rendered:\n"
        << oracle["text"].get<std::string>() << "\nthis engine failed: " << here["error"];
    EXPECT_EQ(here["text"].get<std::string>(), oracle["text"].get<std::string>()) << c.label;
    return;
  }
  ASSERT_TRUE(here.contains("error"))
      << c.label << "\noracle failed: " << oracle["error"] << "\nthis engine rendered:\n"
      << here["text"];
  if (oracle.value("raised", false)) {
    EXPECT_TRUE(here.value("raised", false)) << c.label << ": " << here["error"];
    EXPECT_EQ(here.value("reason", ""), oracle["error"].get<std::string>()) << c.label;
  }
}

TEST(ChatTemplateOracle, SameAsJinja2OnRealAndOwnTemplates) {
  std::vector<Case> cases = build_cases();
  Json request = {{"cases", Json::array()}};
  for (const Case& c : cases) {
    request["cases"].push_back({{"template", c.source},
                                {"messages", c.messages},
                                {"tools", c.tools},
                                {"add_generation_prompt", c.add_generation_prompt},
                                {"continue_final_message", c.continue_final_message},
                                {"tokenizer_config", c.config},
                                {"variables", c.variables}});
  }
  fs::path request_path = fs::temp_directory_path() /
                          ("pagedattn_jinja2_request_" + std::to_string(::getpid()) + ".json");
  std::ofstream(request_path) << request.dump();
  std::string command = "python3 '" + (kSourceDir / "tests/tokenizer/render_jinja2.py").string() +
                        "' '" + request_path.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string output;
  char buffer[65536];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  int status = pclose(pipe);
  fs::remove(request_path);
  ASSERT_EQ(status, 0) << command
                       << " failed (python3 with jinja2 is needed: "
                          "scripts/setup-debian installs python3-jinja2)";
  Json results = Json::parse(output);
  ASSERT_EQ(results.size(), cases.size());
  int texts = 0;
  for (size_t i = 0; i < cases.size(); ++i)
    expect_same(cases[i], results[i], render_here(cases[i]), texts);
  // Most renderings succeed: a comparison of failures alone would prove little.
  EXPECT_GT(texts, static_cast<int>(cases.size() * 3 / 4)) << texts << " of " << cases.size();
}

TEST(ChatTemplateOracle, SameAsTransformersFixture) {
  std::ifstream fixture(kSourceDir / "tests/data/tokenizer/chat_templates.jsonl");
  ASSERT_TRUE(fixture) << "tests/data/tokenizer/chat_templates.jsonl is missing";
  std::vector<Case> cases = build_cases();
  int compared = 0, texts = 0;
  for (std::string line; std::getline(fixture, line);) {
    if (line.empty()) continue;
    Json expected = Json::parse(line);
    const std::string label = expected.at("label").get<std::string>();
    auto it =
        std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.label == label; });
    ASSERT_NE(it, cases.end()) << "the fixture's case '" << label
                               << "' is not among this test's cases; regenerate the fixture";
    expect_same(*it, expected, render_here(*it), texts);
    ++compared;
  }
  EXPECT_GT(compared, 50);
  EXPECT_GT(texts, compared * 3 / 4);
}

TEST(ChatTemplateOracle, Llama2ShipsNoTemplate) {
  // transformers refuses apply_chat_template without a template; the caller must supply one.
  EXPECT_FALSE(tokenizer_config("llama2").contains("chat_template"));
}

TEST(ChatTemplateOracle, SpecialTokensFromConfig) {
  // DeepSeek-V3 writes its tokens as AddedToken objects; Qwen3 has no bos_token (null).
  ChatOptions deepseek =
      chat_options_from_config(nlohmann::json::parse(tokenizer_config("deepseek_v3").dump()));
  EXPECT_EQ(deepseek.variables.at("bos_token"),
            "<\xEF\xBD\x9C"
            "begin\xE2\x96\x81of\xE2\x96\x81"
            "sentence\xEF\xBD\x9C>");
  ChatOptions qwen =
      chat_options_from_config(nlohmann::json::parse(tokenizer_config("qwen3").dump()));
  EXPECT_FALSE(qwen.variables.contains("bos_token"));
  EXPECT_EQ(qwen.variables.at("eos_token"), "<|im_end|>");
}

}  // namespace
}  // namespace pagedattn::testing
