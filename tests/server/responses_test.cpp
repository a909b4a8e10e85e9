// The logprobs in the response bodies (src/server/responses.h) for tokens that are not whole
// characters: `bytes` are the raw bytes, `token` is the text when the bytes are UTF-8 and
// OpenAI's "bytes:\xNN" spelling when not, text_offset counts characters and continues across
// streamed chunks. Expected values written out by hand from the bytes.
#include "server/responses.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/byte_front.h"

namespace pagedattn::server::testing {
namespace {

using Json = nlohmann::json;
using detail::token_string;

TEST(Responses, TokenStringKeepsUtf8AndSpellsTheRest) {
  EXPECT_EQ(token_string("Hello"), "Hello");
  EXPECT_EQ(token_string(" caf\xC3\xA9"), " caf\xC3\xA9");
  EXPECT_EQ(token_string("\xF0\x9F\x98\x8A"), "\xF0\x9F\x98\x8A");
  EXPECT_EQ(token_string(""), "");
  // Part of a character: every non-ASCII byte escaped, printable ASCII as it is.
  EXPECT_EQ(token_string("\xE4"), "bytes:\\xe4");
  EXPECT_EQ(token_string("\xE4\xBD"), "bytes:\\xe4\\xbd");
  EXPECT_EQ(token_string(" \xF0\x9F"), "bytes: \\xf0\\x9f");
  EXPECT_EQ(token_string("\xA0!"), "bytes:\\xa0!");
  // A whole character beside a partial one is escaped too (the token is not UTF-8 as a whole);
  // a backslash is escaped so that the spelling cannot be read two ways.
  EXPECT_EQ(token_string("\xC3\xA9\xE4"), "bytes:\\xc3\\xa9\\xe4");
  EXPECT_EQ(token_string("a\\\xFF"), "bytes:a\\x5c\\xff");
  EXPECT_EQ(token_string("\n\xFF"), "bytes:\\x0a\\xff");
  // Not UTF-8 though each byte has the right shape: an overlong form, a surrogate, > U+10FFFF.
  EXPECT_EQ(token_string("\xC0\x80"), "bytes:\\xc0\\x80");
  EXPECT_EQ(token_string("\xED\xA0\x80"), "bytes:\\xed\\xa0\\x80");
  EXPECT_EQ(token_string("\xF4\x90\x80\x80"), "bytes:\\xf4\\x90\\x80\\x80");
}

TEST(Responses, TextOffsetCountsCharacters) {
  // "Hi 你!😊" in tokens that split both multi-byte characters: H0 i1 ' '2 你3 !4 😊5.
  const std::vector<std::string> tokens = {"Hi", " \xE4\xBD", "\xA0", "!", "\xF0\x9F\x98", "\x8A"};
  const std::vector<int64_t> expected = {0, 2, 3, 4, 5, 5};
  detail::TextOffset offset;
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(offset.next(tokens[i]), expected[i]) << "token " << i;
  }
  EXPECT_EQ(offset.next(""), 6);
  EXPECT_EQ(offset.next("x"), 6);
}

detail::ChoiceOutput choice_of(const std::vector<int32_t>& tokens) {
  detail::ChoiceOutput choice;
  for (const int32_t token : tokens) {
    // Alternatives: the token itself, then byte 0xE4 (a lone lead byte) and '!'.
    choice.logprobs.push_back({token, -0.5f, {{token, -0.5f}, {0xE4, -1.5f}, {'!', -2.5f}}});
  }
  return choice;
}

// The byte front's tokens are single bytes: "é" (C3 A9) and "😊" (F0 9F 98 8A) arrive byte by byte.
const std::vector<int32_t> kTokens = {'a', 0xC3, 0xA9, ' ', 0xF0, 0x9F, 0x98, 0x8A, '.'};

TEST(Responses, ChatLogprobsCarryRawBytes) {
  ByteFront front;
  detail::ResponseHead head{Endpoint::kChat, "chatcmpl-1", 0, "m"};
  const Json body =
      Json::parse(detail::completion_body(head, {choice_of(kTokens)}, true, {}, front));
  const Json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), kTokens.size());
  const std::vector<std::string> spelled = {"a",           "bytes:\\xc3", "bytes:\\xa9",
                                            " ",           "bytes:\\xf0", "bytes:\\x9f",
                                            "bytes:\\x98", "bytes:\\x8a", "."};
  for (size_t i = 0; i < kTokens.size(); ++i) {
    EXPECT_EQ(content[i]["token"], spelled[i]) << i;
    EXPECT_EQ(content[i]["bytes"], Json::array({kTokens[i]})) << i;
    ASSERT_EQ(content[i]["top_logprobs"].size(), 3u);
    EXPECT_EQ(content[i]["top_logprobs"][1]["token"], "bytes:\\xe4");
    EXPECT_EQ(content[i]["top_logprobs"][1]["bytes"], Json::array({0xE4}));
    EXPECT_EQ(content[i]["top_logprobs"][2]["token"], "!");
  }
  // The bytes of the tokens, joined, are the text's bytes.
  std::string joined;
  for (const Json& item : content) {
    for (const Json& byte : item["bytes"]) joined += static_cast<char>(byte.get<int>());
  }
  EXPECT_EQ(joined, "a\xC3\xA9 \xF0\x9F\x98\x8A.");
}

TEST(Responses, CompletionTextOffsetContinuesAcrossChunks) {
  ByteFront front;
  // "aé 😊." : a0 é1 ' '2 😊3 .4
  const std::vector<int64_t> offsets = {0, 1, 1, 2, 3, 3, 3, 3, 4};
  detail::ResponseHead head{Endpoint::kCompletions, "cmpl-1", 0, "m"};
  const Json body =
      Json::parse(detail::completion_body(head, {choice_of(kTokens)}, true, {}, front));
  const Json& logprobs = body["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["text_offset"], Json(offsets));
  EXPECT_EQ(logprobs["tokens"][1], "bytes:\\xc3");
  EXPECT_EQ(logprobs["top_logprobs"][0], Json({{"a", -0.5}, {"bytes:\\xe4", -1.5}, {"!", -2.5}}));

  // Streamed in chunks of 2, 3 and 4 tokens with one TextOffset: the same offsets.
  detail::TextOffset offset;
  std::vector<int64_t> streamed;
  for (const auto& [begin, end] : {std::pair{0, 2}, {2, 5}, {5, 9}}) {
    const std::vector<int32_t> piece(kTokens.begin() + begin, kTokens.begin() + end);
    const std::string event =
        detail::chunk_event(head, choice_of(piece), false, true, false, front, offset);
    ASSERT_TRUE(event.starts_with("data: ")) << event;
    const Json chunk = Json::parse(event.substr(6));
    for (const Json& value : chunk["choices"][0]["logprobs"]["text_offset"]) {
      streamed.push_back(value.get<int64_t>());
    }
  }
  EXPECT_EQ(streamed, offsets);
}

TEST(Responses, EchoedPromptEntriesAndTheTokenAmongItsAlternatives) {
  ByteFront front;
  detail::ResponseHead head{Endpoint::kCompletions, "cmpl-1", 0, "m"};
  detail::ChoiceOutput choice;
  choice.text = "xyz";
  choice.first_logprob_null = true;  // echo: 'x' is the prompt's first token
  choice.logprobs = {{'x', 0.0f, {}},
                     {'y', -3.0f, {{'a', -0.25f}, {'!', -1.0f}}},  // y is not in its top 2
                     {'z', -0.25f, {{'z', -0.25f}}}};
  const Json body = Json::parse(detail::completion_body(head, {choice}, true, {}, front));
  const Json& logprobs = body["choices"][0]["logprobs"];
  EXPECT_EQ(body["choices"][0]["text"], "xyz");
  EXPECT_EQ(logprobs["tokens"], Json({"x", "y", "z"}));
  EXPECT_EQ(logprobs["token_logprobs"], Json({nullptr, -3.0, -0.25}));
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  EXPECT_EQ(logprobs["top_logprobs"][1], Json({{"a", -0.25}, {"!", -1.0}, {"y", -3.0}}));
  EXPECT_EQ(logprobs["top_logprobs"][2], Json({{"z", -0.25}}));
  EXPECT_EQ(logprobs["text_offset"], Json({0, 1, 2}));
  // Without echo the first entry is a token like the others.
  choice.first_logprob_null = false;
  const Json plain = Json::parse(detail::completion_body(head, {choice}, true, {}, front));
  EXPECT_EQ(plain["choices"][0]["logprobs"]["token_logprobs"][0], 0.0);
  EXPECT_EQ(plain["choices"][0]["logprobs"]["top_logprobs"][0], Json({{"x", 0.0}}));
}

}  // namespace
}  // namespace pagedattn::server::testing
