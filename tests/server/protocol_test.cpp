// prepare_request without HTTP: each OpenAI field lands in the engine's SamplingParams as the
// API reference defines it (values written out here by hand), the chat rendering and prompt
// forms, and the error for each class of bad request (status, param, code).
#include <gtest/gtest.h>

#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

using Prompts = std::vector<std::vector<int32_t>>;

ParseContext test_context(const ByteFront& front) {
  ParseContext context;
  context.model_name = "m";
  context.limits = {kVocab, 128};
  context.front = &front;
  return context;
}

PreparedRequest expect_ok(std::string_view body, Endpoint endpoint) {
  static const ByteFront front;
  auto result = prepare_request(body, endpoint, test_context(front));
  if (auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "unexpected error: " << error->message;
    return {};
  }
  return std::get<PreparedRequest>(result);
}

ApiError expect_error(std::string_view body, Endpoint endpoint) {
  static const ByteFront front;
  auto result = prepare_request(body, endpoint, test_context(front));
  if (!std::holds_alternative<ApiError>(result)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(result);
}

TEST(Protocol, ChatFieldsMapToSamplingParams) {
  const PreparedRequest request = expect_ok(R"({
    "model": "m", "messages": [{"role": "system", "content": "S"},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
    "temperature": 0.7, "top_p": 0.9, "top_k": 12, "min_p": 0.05, "seed": -1, "n": 2,
    "stop": "xy", "max_completion_tokens": 9, "presence_penalty": 0.5,
    "frequency_penalty": -0.25, "repetition_penalty": 1.1, "logit_bias": {"65": -100, "7": 2.5},
    "logprobs": true, "top_logprobs": 4, "ignore_eos": true, "stop_token_ids": [3, 4],
    "stream": true, "stream_options": {"include_usage": true}, "user": "u", "store": false,
    "response_format": {"type": "text"}})",
                                            Endpoint::kChat);
  const engine::SamplingParams& params = request.params;
  EXPECT_EQ(request.model, "m");
  EXPECT_EQ(request.prompts, Prompts{bytes_of("system: S\nuser: ab\nassistant: ")});
  EXPECT_DOUBLE_EQ(params.temperature, 0.7);
  EXPECT_DOUBLE_EQ(params.top_p, 0.9);
  EXPECT_EQ(params.top_k, 12);
  EXPECT_DOUBLE_EQ(params.min_p, 0.05);
  ASSERT_TRUE(params.seed.has_value());
  EXPECT_EQ(*params.seed, ~uint64_t{0});
  EXPECT_EQ(params.n, 2);
  EXPECT_EQ(params.stop, std::vector<std::string>{"xy"});
  EXPECT_EQ(params.max_tokens, 9);
  EXPECT_DOUBLE_EQ(params.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(params.frequency_penalty, -0.25);
  EXPECT_DOUBLE_EQ(params.repetition_penalty, 1.1);
  const std::vector<std::pair<int32_t, float>> bias = {{65, -100.0f}, {7, 2.5f}};
  EXPECT_EQ(params.logit_bias, bias);
  EXPECT_TRUE(request.logprobs);
  EXPECT_EQ(params.logprobs, 4);
  EXPECT_TRUE(params.ignore_eos);
  EXPECT_EQ(params.stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
}

TEST(Protocol, DefaultsAndCompletionForms) {
  PreparedRequest request = expect_ok(R"({"model":"m","prompt":"hey"})", Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, Prompts{bytes_of("hey")});
  EXPECT_FALSE(request.echo);
  EXPECT_TRUE(request.prompt_texts.empty());
  EXPECT_DOUBLE_EQ(request.params.temperature, 1.0);
  EXPECT_EQ(request.params.n, 1);
  EXPECT_FALSE(request.params.max_tokens.has_value());
  EXPECT_FALSE(request.params.logprobs.has_value());
  EXPECT_FALSE(request.stream);
  request = expect_ok(R"({"model":"m","prompt":[1,2,300],"logprobs":3,"stop":["a","b"],
                          "max_tokens":null,"best_of":1})",
                      Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, (std::vector<std::vector<int32_t>>{{1, 2, 300}}));
  EXPECT_EQ(request.params.logprobs, 3);
  EXPECT_EQ(request.params.stop, (std::vector<std::string>{"a", "b"}));
  request = expect_ok(R"({"model":"m","prompt":["one"]})", Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, Prompts{bytes_of("one")});
  request = expect_ok(R"({"model":"m","prompt":[[9,8]]})", Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, (std::vector<std::vector<int32_t>>{{9, 8}}));
  // Exactly the model length: 100 prompt + 28 = 128.
  const std::string prompt(100, 'z');
  expect_ok(R"({"model":"m","max_tokens":28,"prompt":")" + prompt + "\"}", Endpoint::kCompletions);
}

TEST(Protocol, Errors) {
  struct Case {
    std::string body;
    Endpoint endpoint;
    int status;
    std::string param;
    std::string code;
  };
  const std::string prompt(100, 'z');
  const std::vector<Case> cases = {
      {"{", Endpoint::kChat, 400, "", "invalid_json"},
      {"null", Endpoint::kChat, 400, "", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"seed":"1"})", Endpoint::kChat,
       400, "seed", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":2.5})",
       Endpoint::kChat, 400, "temperature", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":65})", Endpoint::kChat, 400,
       "n", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a",1]})",
       Endpoint::kChat, 400, "stop", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":""})", Endpoint::kChat,
       400, "stop", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{}})",
       Endpoint::kChat, 400, "stream_options", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       Endpoint::kChat, 400, "messages[0].content[0]", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user"}]})", Endpoint::kChat, 400, "messages[0].content",
       "invalid_type"},
      {R"({"model":"m","messages":[1]})", Endpoint::kChat, 400, "messages[0]", "invalid_type"},
      {R"({"model":"m","prompt":""})", Endpoint::kCompletions, 400, "prompt", "invalid_value"},
      {R"({"model":"m","prompt":"x","echo":1})", Endpoint::kCompletions, 400, "echo",
       "invalid_type"},
      {R"({"model":"m","prompt":"x","suffix":"y"})", Endpoint::kCompletions, 400, "suffix",
       "invalid_value"},
      {R"({"model":"m","prompt":"x","best_of":3})", Endpoint::kCompletions, 400, "best_of",
       "invalid_value"},
      {R"({"model":"m","prompt":"x","messages":[]})", Endpoint::kCompletions, 400, "messages",
       "unknown_parameter"},
      {R"({"model":"m","prompt":"x","logprobs":true})", Endpoint::kCompletions, 400, "logprobs",
       "invalid_type"},
      {R"({"model":"m","max_tokens":29,"prompt":")" + prompt + "\"}", Endpoint::kCompletions, 400,
       "prompt", "context_length_exceeded"},
      {R"({"model":"other","prompt":"x"})", Endpoint::kCompletions, 404, "model",
       "model_not_found"},
      // A malformed field wins over an unknown model: the request is bad whatever it names.
      {R"({"model":"other","prompt":"x","top_k":-2})", Endpoint::kCompletions, 400, "top_k",
       "invalid_value"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.body);
    const ApiError error = expect_error(test.body, test.endpoint);
    EXPECT_EQ(error.status, test.status) << error.message;
    EXPECT_EQ(error.param, test.param) << error.message;
    EXPECT_EQ(error.code, test.code) << error.message;
    EXPECT_FALSE(error.message.empty());
    const Json body = Json::parse(error_body(error));
    EXPECT_EQ(body["error"]["message"], error.message);
    EXPECT_EQ(body["error"]["type"], error.type);
  }
}

TEST(Protocol, CompletionBatchesInEveryForm) {
  // An array of strings, of arrays of token ids; prompts in order, each its own token list.
  PreparedRequest request =
      expect_ok(R"({"model":"m","prompt":["ab","c","dé"],"n":2})", Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, (Prompts{bytes_of("ab"), bytes_of("c"), bytes_of("d\xC3\xA9")}));
  EXPECT_EQ(request.params.n, 2);
  request = expect_ok(R"({"model":"m","prompt":[[1,2],[300],[4,5,6]]})", Endpoint::kCompletions);
  EXPECT_EQ(request.prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {300}, {4, 5, 6}}));
  // A batch at the bound is taken.
  Json batch = {{"model", "m"}, {"prompt", Json::array()}};
  for (size_t i = 0; i < kMaxPrompts; ++i) batch["prompt"].push_back("p" + std::to_string(i));
  EXPECT_EQ(expect_ok(batch.dump(), Endpoint::kCompletions).prompts.size(), kMaxPrompts);
}

TEST(Protocol, EchoTakesThePromptTextAndScoresItWithLogprobs) {
  // A string prompt's text as given; a token-id prompt's text its tokens' bytes.
  PreparedRequest request =
      expect_ok(R"({"model":"m","prompt":["hi","yo"],"echo":true,"logprobs":2,"max_tokens":0})",
                Endpoint::kCompletions);
  EXPECT_TRUE(request.echo);
  EXPECT_EQ(request.prompt_texts, (std::vector<std::string>{"hi", "yo"}));
  EXPECT_EQ(request.params.logprobs, 2);
  EXPECT_EQ(request.params.prompt_logprobs, 2);
  EXPECT_EQ(request.params.max_tokens, 0);
  request = expect_ok(R"({"model":"m","prompt":[[104,105],[300,121]],"echo":true})",
                      Endpoint::kCompletions);
  EXPECT_EQ(request.prompt_texts, (std::vector<std::string>{"hi", "<|special_300|>y"}));
  EXPECT_FALSE(request.params.prompt_logprobs.has_value()) << "no logprobs: nothing to score";
  // Echo with max_tokens 1 (lm-evaluation-harness' loglikelihood request) scores too.
  request = expect_ok(R"({"model":"m","prompt":[1,2,3],"echo":true,"logprobs":1,"max_tokens":1,
                          "temperature":0,"seed":1234})",
                      Endpoint::kCompletions);
  EXPECT_EQ(request.params.prompt_logprobs, 1);
  EXPECT_EQ(request.params.max_tokens, 1);
  // Without echo, logprobs score the generated tokens only.
  request = expect_ok(R"({"model":"m","prompt":"x","logprobs":1})", Endpoint::kCompletions);
  EXPECT_FALSE(request.params.prompt_logprobs.has_value());
}

TEST(Protocol, BatchErrorsNameTheElement) {
  struct Case {
    std::string body;
    std::string param;
    std::string code;
    std::string fragment;
  };
  const std::string long_prompt(128, 'z');
  const std::vector<Case> cases = {
      {R"({"model":"m","prompt":["a",[1,2]]})", "prompt[1]", "invalid_type",
       "'prompt[1]': expected a string like prompt[0]"},
      {R"({"model":"m","prompt":[[1],"b"]})", "prompt[1]", "invalid_type",
       "'prompt[1]': expected an array of token ids like prompt[0]"},
      {R"({"model":"m","prompt":["a","b",""]})", "prompt[2]", "invalid_value",
       "'prompt[2]': must not be empty"},
      {R"({"model":"m","prompt":[[1],[]]})", "prompt[1]", "invalid_value",
       "'prompt[1]': must not be empty"},
      {R"({"model":"m","prompt":[[1],[2,320]]})", "prompt[1]", "invalid_value",
       "'prompt[1][1]': 320 is not a token id in [0, 320)"},
      {R"({"model":"m","prompt":[[1],[2,"x"]]})", "prompt[1]", "invalid_value",
       R"('prompt[1][1]': "x" is not a token id)"},
      {R"({"model":"m","prompt":[5,-1]})", "prompt", "invalid_value",
       "'prompt[1]': -1 is not a token id"},
      {R"({"model":"m","prompt":[5,1.5]})", "prompt", "invalid_value", "'prompt[1]': 1.5"},
      {R"({"model":"m","prompt":[{"a":1}]})", "prompt[0]", "invalid_type",
       "'prompt[0]': expected an array of token ids"},
      {R"({"model":"m","prompt":[]})", "prompt", "invalid_value", "must not be empty"},
      {R"({"model":"m","prompt":{}})", "prompt", "invalid_type", "expected a string, an array"},
      {R"({"model":"m","prompt":["a",")" + long_prompt + R"("]})", "prompt[1]",
       "context_length_exceeded", "(128 in the prompt[1]"},
      {R"({"model":"m","prompt":"abc","max_tokens":0})", "max_tokens", "invalid_value",
       "0 is allowed only with 'echo': true"},
      {R"({"model":"m","prompt":"abc","max_tokens":-1,"echo":true})", "max_tokens", "invalid_value",
       "out of range [0,"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens",
       "invalid_value", "out of range [1,"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.body);
    const ApiError error = expect_error(test.body, test.body.find("messages") != std::string::npos
                                                       ? Endpoint::kChat
                                                       : Endpoint::kCompletions);
    EXPECT_EQ(error.status, 400) << error.message;
    EXPECT_EQ(error.param, test.param) << error.message;
    EXPECT_EQ(error.code, test.code) << error.message;
    EXPECT_NE(error.message.find(test.fragment), std::string::npos) << error.message;
  }
  // Over the bounds: prompts, and prompts x n.
  Json batch = {{"model", "m"}, {"prompt", Json::array()}};
  for (size_t i = 0; i <= kMaxPrompts; ++i) batch["prompt"].push_back({1, 2});
  ApiError error = expect_error(batch.dump(), Endpoint::kCompletions);
  EXPECT_EQ(error.param, "prompt");
  EXPECT_NE(error.message.find("a batch of 257 prompts (at most 256"), std::string::npos)
      << error.message;
  batch = {{"model", "m"}, {"prompt", Json::array()}, {"n", 64}, {"max_tokens", 1}};
  for (size_t i = 0; i < 17; ++i) batch["prompt"].push_back("x");
  error = expect_error(batch.dump(), Endpoint::kCompletions);
  EXPECT_EQ(error.param, "prompt");
  EXPECT_NE(error.message.find("17 prompts x n = 64 make 1088 choices (at most 1024"),
            std::string::npos)
      << error.message;
}

}  // namespace
}  // namespace pagedattn::server::testing
