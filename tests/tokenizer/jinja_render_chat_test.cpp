// render_chat and chat_options_from_config: the context apply_chat_template builds (tools and
// documents present as none when not given, special tokens, extra variables overriding them) and
// transformers 5's continue_final_message cut. Expected strings written by hand.
#include "jinja_test_util.h"

namespace pagedattn::testing {
namespace {

using Json = nlohmann::ordered_json;

TEST(RenderChat, ContextAsApplyChatTemplateBuildsIt) {
  ChatTemplate chat = ChatTemplate::compile(
      "{{ tools is none }} {{ tools is defined }} {{ documents is none }} "
      "{{ add_generation_prompt }} {{ bos_token }}{{ messages|length }} {{ enable_thinking }}");
  ChatOptions options = chat_options_from_config(nlohmann::json::parse(
      R"({"bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "</E>",
          "unk_token": null, "chat_template": "ignored"})"));
  EXPECT_EQ(options.variables.dump(), R"({"bos_token":"<B>","eos_token":"</E>"})");
  options.variables["enable_thinking"] = false;
  options.add_generation_prompt = true;
  EXPECT_EQ(render_chat(chat, Json::parse(R"([{"role": "user", "content": "hi"}])"), options),
            "True True True True <B>1 False");
  options.tools = Json::array({Json{{"name", "f"}}});
  options.variables["bos_token"] = "<override>";
  EXPECT_EQ(render_chat(chat, Json::array(), options), "False True True True <override>0 False");
}

TEST(RenderChat, ContinueFinalMessageCutsAtTheEndOfTheLastMessage) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "Hello "}])");
  ChatOptions options;
  options.continue_final_message = true;
  ChatTemplate plain = ChatTemplate::compile(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}");
  EXPECT_EQ(render_chat(plain, messages, options), "<user>hi</user><assistant>Hello ");
  // a template that trims the content also loses the message's trailing space
  ChatTemplate trimming = ChatTemplate::compile(
      "{% for m in messages %}<{{ m.role }}>{{ m.content|trim }}</{{ m.role }}>{% endfor %}");
  EXPECT_EQ(render_chat(trimming, messages, options), "<user>hi</user><assistant>Hello");
  // content given as blocks: the last text block is the one continued
  const Json blocks = Json::parse(R"([{"role": "assistant", "content": [
      {"type": "text", "text": "A"}, {"type": "image"}, {"type": "text", "text": "B"}]}])");
  ChatTemplate block_template =
      ChatTemplate::compile("{% for b in messages[0].content %}[{{ b.text }}]{% endfor %}<end>");
  EXPECT_EQ(render_chat(block_template, blocks, options), "[A][][B");
}

TEST(RenderChat, BadArguments) {
  ChatTemplate chat = ChatTemplate::compile("{{ messages[0].content }}");
  ChatOptions options;
  options.continue_final_message = true;
  options.add_generation_prompt = true;
  const Json messages = Json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_THROW(render_chat(chat, messages, options), Error);
  EXPECT_THROW(render_chat(chat, Json::object(), ChatOptions{}), Error);
  // the template drops the final message: nothing to continue
  options.add_generation_prompt = false;
  EXPECT_THROW(render_chat(ChatTemplate::compile("content? no"), messages, options), Error);
}

}  // namespace
}  // namespace pagedattn::testing
