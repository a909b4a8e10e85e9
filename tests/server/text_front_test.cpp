// What the server hands a chat template for a conversation with tool calls
// (server_text_front.h): the OpenAI messages read by the request parser become, in each of the
// three forms, exactly the openai_tool_round_trip_* conversations of
// tests/data/tokenizer/chat_conversations.json (which the tokenizer tests render with this
// engine and with Jinja2 and require identical); and render_chat_forms picks for each real
// template the form written here, the first it renders, after the earlier forms fail:
//   Qwen3        vllm     (content none breaks its `'</think>' in content`)
//   DeepSeek-V3  string   (it concatenates arguments as strings)
//   Llama 3      mapping  (renders whatever it gets)
//   Llama-3.1-style tool template (tests/data/tokenizer/templates)  mapping (arguments | tojson)
// The real templates come from the tokenizer files fetch_tokenizers puts in the build tree;
// without them those cases are skipped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pagedattn/chat_template.h"
#include "pagedattn/server_text_front.h"
#include "server/chat_request.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

const fs::path kSource = PAGEDATTN_SOURCE_DIR;

OrderedJson conversations() {
  std::ifstream file(kSource / "tests/data/tokenizer/chat_conversations.json");
  return OrderedJson::parse(file);
}

OrderedJson conversation(const OrderedJson& all, const std::string& id) {
  for (const OrderedJson& entry : all.at("conversations")) {
    if (entry.at("id") == id) return entry.at("messages");
  }
  throw std::runtime_error("no conversation " + id);
}

const char* form_name(ToolCallForm form) {
  return form == ToolCallForm::kMapping  ? "mapping"
         : form == ToolCallForm::kString ? "string"
                                         : "vllm";
}

// The conversation as a client sends it (OpenAI's form is the string form: content null,
// arguments JSON text) read by the request parser.
std::vector<ChatMessage> parsed_messages(const OrderedJson& openai_messages) {
  static const ByteFront front;
  ParseContext context;
  context.model_name = "m";
  context.limits = {kVocab, 1 << 20};
  context.front = &front;
  const OrderedJson request = {{"model", "m"}, {"messages", openai_messages}};
  const std::string body = request.dump();
  return detail::read_chat_input(detail::Json::parse(body), body, context).messages;
}

TEST(TextFrontForms, ServerMessagesAreTheOracleConversations) {
  const OrderedJson all = conversations();
  const std::vector<ChatMessage> messages =
      parsed_messages(conversation(all, "openai_tool_round_trip_string"));
  for (const ToolCallForm form :
       {ToolCallForm::kMapping, ToolCallForm::kString, ToolCallForm::kVllm}) {
    const OrderedJson expected =
        conversation(all, std::string("openai_tool_round_trip_") + form_name(form));
    // dump() compares key order too: templates print mappings in their order.
    EXPECT_EQ(template_messages(messages, form).dump(), expected.dump()) << form_name(form);
  }
}

struct RealTemplate {
  std::string name;
  ToolCallForm expected;
};

class TextFrontRealTemplates : public ::testing::TestWithParam<RealTemplate> {};

TEST_P(TextFrontRealTemplates, FirstFormThatRenders) {
  const RealTemplate& param = GetParam();
  std::string source;
  nlohmann::json config;
  if (param.name == "llama31_tools_style") {
    std::ifstream file(kSource / "tests/data/tokenizer/templates/llama31_tools_style.jinja");
    std::stringstream text;
    text << file.rdbuf();
    source = text.str();
    config = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  } else {
    const char* overridden = std::getenv("PAGEDATTN_TOKENIZERS");
    const fs::path path = fs::path(overridden ? overridden : PAGEDATTN_TOKENIZERS_DIR) /
                          param.name / "tokenizer_config.json";
    if (!fs::exists(path)) GTEST_SKIP() << path << " absent (the fetch_tokenizers CTest fixture)";
    std::ifstream file(path);
    config = nlohmann::json::parse(file);
    source = config.at("chat_template").get<std::string>();
  }
  const ChatTemplate chat = ChatTemplate::compile(source);
  ChatOptions options = chat_options_from_config(config);
  options.add_generation_prompt = true;
  const OrderedJson all = conversations();
  options.tools = all.at("tools");
  const std::vector<ChatMessage> messages =
      parsed_messages(conversation(all, "openai_tool_round_trip_string"));

  for (const ToolCallForm form :
       {ToolCallForm::kMapping, ToolCallForm::kString, ToolCallForm::kVllm}) {
    if (form == param.expected) break;
    EXPECT_THROW(render_chat(chat, template_messages(messages, form), options), ChatTemplateError)
        << form_name(form) << " renders: the expected form would not be reached";
  }
  const std::string expected = render_chat(
      chat, conversation(all, std::string("openai_tool_round_trip_") + form_name(param.expected)),
      options);
  EXPECT_EQ(render_chat_forms(chat, messages, options), expected);
  // The calls reached the prompt (not dropped by a form that renders without them).
  if (param.name != "llama3") EXPECT_NE(expected.find("get_weather"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Templates, TextFrontRealTemplates,
    ::testing::Values(RealTemplate{"qwen3", ToolCallForm::kVllm},
                      RealTemplate{"deepseek_v3", ToolCallForm::kString},
                      RealTemplate{"llama3", ToolCallForm::kMapping},
                      RealTemplate{"llama31_tools_style", ToolCallForm::kMapping}),
    [](const ::testing::TestParamInfo<RealTemplate>& info) { return info.param.name; });

TEST(TextFrontForms, TemplateRefusalIsFinal) {
  // raise_exception in the first form is the answer; no other form is tried.
  const ChatTemplate chat = ChatTemplate::compile(
      "{% for m in messages %}{% if m.content is none %}{{ raise_exception('no none') }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  std::vector<ChatMessage> messages(1);
  messages[0].role = "assistant";
  messages[0].content_null = true;
  messages[0].tool_calls = {{"id", "f", "{}"}};
  try {
    render_chat_forms(chat, messages, ChatOptions{});
    ADD_FAILURE() << "rendered";
  } catch (const ChatTemplateError& error) {
    EXPECT_TRUE(error.raised_by_template());
    EXPECT_EQ(error.reason(), "no none");
  }
}

}  // namespace
}  // namespace pagedattn::server::testing
