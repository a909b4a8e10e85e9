// The official OpenAI Node client against the server: tests/server/node/openai_client.cjs run
// with node against a live server, given the texts it must parse. Two servers:
// - the test server (fake model, byte-level front), the expected texts and logprobs computed
//   here with no engine (the greedy reference; a scored batch's logprob sums from the fake
//   model's rows, log-softmax in float64);
// - `pagedattn serve` itself over the embedded model (the binary, as a user starts it), the
//   expected texts read first with the tests' own HTTP client (greedy, so the same request
//   gives the same text): what the official client parses must be what a plain client reads.
// Runs under CTest as server_openai_node_client after the fixture server_node_setup installed
// the npm package into the build tree; elsewhere (the environment variables absent) it is
// skipped.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "server/http_client.h"
#include "server/serve_process.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

constexpr int kMaxTokens = 24;
const std::string kChatPrompt = "Tell me about Emma.";
const std::string kCompletionPrompt = "It is a truth universally acknowledged";

struct NodeClient {
  const char* module = std::getenv("PAGEDATTN_OPENAI_NODE");
  const char* node = std::getenv("PAGEDATTN_NODE");
  const char* script = std::getenv("PAGEDATTN_NODE_SCRIPT");
  bool available() const { return module != nullptr && node != nullptr && script != nullptr; }

  // Runs the script against the server on `port` with `expected`; its output.
  std::string run(int port, const Json& expected) const {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() /
        ("pagedattn_node_expected_" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << expected.dump();
    const std::string command = std::string("OPENAI_MODULE_DIR='") + module + "' '" + node + "' '" +
                                script + "' http://127.0.0.1:" + std::to_string(port) + "/v1 '" +
                                path.string() + "' 2>&1";
    std::string output;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return "popen failed";
    char buffer[4096];
    while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
    const int status = ::pclose(pipe);
    std::filesystem::remove(path);
    std::printf("%s", output.c_str());
    return output + fmt::format("(exit status {})\n", status);
  }
};

TEST(OpenAiNodeClient, ParsesWhatTheServerSends) {
  const NodeClient client;
  if (!client.available()) {
    GTEST_SKIP() << "run through CTest (server_openai_node_client), which installs the client";
  }
  ASSERT_TRUE(std::filesystem::exists(client.module)) << client.module;
  TestServer server;
  const std::vector<int32_t> chat_tokens =
      greedy_tokens(bytes_of("user: " + kChatPrompt + "\nassistant: "), kMaxTokens, true);
  // The chat tokens' logprobs as the client must parse them: each byte token's byte, and its
  // spelling (ASCII as itself; a byte >= 0x80 is part of a character: "bytes:\xNN").
  Json token_bytes = Json::array(), token_strings = Json::array();
  for (const int32_t token : chat_tokens) {
    const std::string bytes = server.front().token_bytes(token);
    Json list = Json::array();
    for (const char c : bytes) list.push_back(static_cast<unsigned char>(c));
    token_bytes.push_back(list);
    token_strings.push_back(token >= 0x80 && token < 0x100 ? fmt::format("bytes:\\x{:02x}", token)
                                                           : bytes);
  }
  EXPECT_TRUE(std::any_of(chat_tokens.begin(), chat_tokens.end(), [](int32_t token) {
    return token >= 0x80 && token < 0x100;
  })) << "no partial character among the tokens: the bytes: spelling goes unchecked";
  // A batch scored as lm-evaluation-harness does (echo, logprobs 1, max_tokens 1).
  Json batch_prompts = Json::array(), batch_texts = Json::array(), batch_sums = Json::array();
  for (const std::string& text : {"Emma Woodhouse", "handsome, clever", "and rich"}) {
    const std::vector<int32_t> prompt = bytes_of(text);
    double sum = 0.0;
    for (size_t i = 1; i < prompt.size(); ++i) {
      std::vector<float> logits(kVocab);
      engine::testing::reference_logits(std::span<const int32_t>(prompt).first(i), logits);
      double max_logit = -INFINITY, total = 0.0;
      for (const float v : logits) max_logit = std::max<double>(max_logit, v);
      for (const float v : logits) total += std::exp(double{v} - max_logit);
      sum += logits[static_cast<size_t>(prompt[i])] - max_logit - std::log(total);
    }
    batch_prompts.push_back(prompt);
    batch_texts.push_back(text + naive_decode(greedy_tokens(prompt, 1, false)));
    batch_sums.push_back(sum);
  }
  const Json expected = {{"model", "test-model"},
                         {"batch_prompts", batch_prompts},
                         {"batch_texts", batch_texts},
                         {"batch_logprob_sums", batch_sums},
                         {"max_tokens", kMaxTokens},
                         {"chat_prompt", kChatPrompt},
                         {"chat_text", naive_decode(chat_tokens)},
                         {"chat_token_bytes", token_bytes},
                         {"chat_token_strings", token_strings},
                         {"completion_prompt", kCompletionPrompt},
                         {"completion_text", naive_decode(greedy_tokens(bytes_of(kCompletionPrompt),
                                                                        kMaxTokens, true))}};
  const std::string output = client.run(server.port(), expected);
  EXPECT_NE(output.find(" passed, 0 failed"), std::string::npos) << output;
  EXPECT_NE(output.find("(exit status 0)"), std::string::npos) << output;
  EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
}

TEST(OpenAiNodeClient, ParsesToolCalls) {
  const NodeClient client;
  if (!client.available()) {
    GTEST_SKIP() << "run through CTest (server_openai_node_client), which installs the client";
  }
  TestServerOptions options;
  options.max_model_length = 4096;
  TestServer server(options);
  // The model writes text, then two calls in the hermes format (Qwen's), the second with a
  // non-ASCII argument.
  server.model().set_script(
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
      "{\"query\": \"Tokyo \xE5\xA4\xA9\xE6\xB0\x97\", \"n\": 2}}\n</tool_call>");
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"location": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Web search.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                     "n": {"type": "integer"}}}}}])");
  // Arguments as the client sees them after JSON.parse (key order as written).
  const Json expected = {
      {"model", "test-model"},
      {"tools", tools},
      {"content", "Checking."},
      {"calls",
       Json::array({{{"name", "get_weather"}, {"arguments", {{"location", "Paris"}}}},
                    {{"name", "search"},
                     {"arguments", Json::parse("{\"query\": \"Tokyo \xE5\xA4\xA9\xE6\xB0\x97\", "
                                               "\"n\": 2}")}}})}};
  const std::string output = client.run(server.port(), expected);
  EXPECT_NE(output.find(" passed, 0 failed"), std::string::npos) << output;
  EXPECT_NE(output.find("(exit status 0)"), std::string::npos) << output;
}

TEST(OpenAiNodeClient, ParsesWhatPagedattnServeSends) {
  const NodeClient client;
  if (!client.available()) {
    GTEST_SKIP() << "run through CTest (server_openai_node_client), which installs the client";
  }
  ASSERT_TRUE(std::filesystem::exists(client.module)) << client.module;
  if (!std::filesystem::exists(pagedattn::testing::cli_path())) {
    GTEST_SKIP() << "pagedattn binary not built at " << pagedattn::testing::cli_path();
  }
  ServeProcess serve({"serve", "--port", "0", "--max-connections", "32", "--grace", "5"});
  const int port = serve.wait_for_port(std::chrono::seconds(120));
  ASSERT_GT(port, 0) << serve.output();
  HttpResponse response = http_request(port, "GET", "/v1/models");
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string model = Json::parse(response.body)["data"][0]["id"];
  const Json common = {
      {"model", model}, {"temperature", 0}, {"max_tokens", kMaxTokens}, {"ignore_eos", true}};
  Json chat = common;
  chat["messages"] = {{{"role", "user"}, {"content", kChatPrompt}}};
  response = http_request(port, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string chat_text = Json::parse(response.body)["choices"][0]["message"]["content"];
  Json completion = common;
  completion["prompt"] = kCompletionPrompt;
  response = http_request(port, "POST", "/v1/completions", completion.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string completion_text = Json::parse(response.body)["choices"][0]["text"];
  const Json expected = {{"model", model},
                         {"max_tokens", kMaxTokens},
                         {"chat_prompt", kChatPrompt},
                         {"chat_text", chat_text},
                         {"completion_prompt", kCompletionPrompt},
                         {"completion_text", completion_text}};
  const std::string output = client.run(port, expected);
  EXPECT_NE(output.find(" passed, 0 failed"), std::string::npos) << output;
  EXPECT_NE(output.find("(exit status 0)"), std::string::npos) << output;
  EXPECT_EQ(serve.stop(SIGTERM, std::chrono::seconds(60)), 0) << serve.output();
}

}  // namespace
}  // namespace pagedattn::server::testing
