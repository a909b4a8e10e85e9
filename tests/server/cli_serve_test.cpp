// `pagedattn serve` itself, as a user starts it on a fresh machine: the built binary with no
// --model (the embedded models/austen-3m on the CPU, its real tokenizer and chat template) on a
// free port, driven over loopback with the tests' HTTP client, then stopped with SIGTERM. It
// must answer /v1/models, a chat completion with logprobs (whose tokens' raw bytes, joined,
// are the message's text: the real tokenizer's token_bytes through the server), a streamed
// completion equal to the same request unstreamed (greedy), log a line per request, and exit 0
// reporting every KV page free. Skipped when the binary was not built.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>

#include "server/http_client.h"
#include "server/serve_process.h"
#include "server/server_support.h"
#include "tools/cli_util.h"

namespace pagedattn::server::testing {
namespace {

TEST(CliServe, EmbeddedModelAnswersAndStopsCleanlyOnSigterm) {
  if (!std::filesystem::exists(pagedattn::testing::cli_path())) {
    GTEST_SKIP() << "pagedattn binary not built at " << pagedattn::testing::cli_path();
  }
  ServeProcess serve({"serve", "--port", "0", "--max-connections", "16", "--grace", "5"});
  const int port = serve.wait_for_port(std::chrono::seconds(120));
  ASSERT_GT(port, 0) << serve.output();

  HttpResponse response = http_request(port, "GET", "/v1/models");
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string model = Json::parse(response.body)["data"][0]["id"];
  EXPECT_EQ(model, "austen-3m");

  // Chat with logprobs. ignore_eos, so that every sampled token is in the text unless it is one
  // of the model's special tokens (which the text leaves out and logprobs keep).
  const Json chat = {
      {"model", model},     {"messages", {{{"role", "user"}, {"content", "Who is Mr. Darcy?"}}}},
      {"temperature", 0},   {"max_tokens", 24},
      {"ignore_eos", true}, {"logprobs", true},
      {"top_logprobs", 3}};
  response = http_request(port, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  Json body = Json::parse(response.body);
  const std::string content = body["choices"][0]["message"]["content"];
  EXPECT_EQ(body["usage"]["completion_tokens"], 24);
  const Json& logprobs = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(logprobs.size(), 24u);
  std::string joined;
  for (const Json& item : logprobs) {
    std::string bytes;
    for (const Json& byte : item["bytes"]) bytes += static_cast<char>(byte.get<int>());
    const std::string token = item["token"];
    if (token == "<|endoftext|>" || token == "<|user|>" || token == "<|assistant|>") continue;
    joined += bytes;
    // `token` is the bytes when they are UTF-8, else spelled "bytes:...".
    if (token.rfind("bytes:", 0) != 0) {
      EXPECT_EQ(token, bytes);
    }
    EXPECT_EQ(item["top_logprobs"].size(), 3u);
    EXPECT_EQ(item["top_logprobs"][0]["logprob"], item["logprob"]);  // greedy: the best
  }
  EXPECT_EQ(joined, content);

  // A streamed completion equals the same request unstreamed (greedy).
  Json completion = {{"model", model},
                     {"prompt", "It is a truth universally acknowledged"},
                     {"temperature", 0},
                     {"max_tokens", 16},
                     {"ignore_eos", true}};
  response = http_request(port, "POST", "/v1/completions", completion.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string unstreamed = Json::parse(response.body)["choices"][0]["text"];
  completion["stream"] = true;
  const StreamResult stream = stream_request(port, "/v1/completions", completion.dump());
  ASSERT_EQ(stream.status, 200) << stream.failure;
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) {
    streamed += Json::parse(stream.events[i])["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, unstreamed);
  EXPECT_FALSE(unstreamed.empty());

  EXPECT_EQ(serve.stop(SIGTERM, std::chrono::seconds(60)), 0) << serve.output();
  const std::string output = serve.output();
  EXPECT_NE(output.find("request chatcmpl-"), std::string::npos) << output;
  const std::regex done("shutdown: done; (\\d+) of (\\d+) KV pages free");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(output, match, done)) << output;
  EXPECT_EQ(match[1], match[2]) << output;
}

// `serve --shape NAME --tokenizer DIR`: a random-weight model of a named shape (what the serving
// benchmark runs on a GPU) served with another model's tokenizer; /v1/models names the shape, a
// completion comes back with the tokens asked for, and SIGTERM still exits 0 with every page free.
// Without --tokenizer it refuses to start and says why.
TEST(CliServe, RandomShapeWithAGivenTokenizer) {
  if (!std::filesystem::exists(pagedattn::testing::cli_path())) {
    GTEST_SKIP() << "pagedattn binary not built at " << pagedattn::testing::cli_path();
  }
  const std::filesystem::path austen =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "models" /
      "austen-3m";
  const pagedattn::testing::CliRun refused = pagedattn::testing::run_cli("serve --shape tiny --port 0");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("--shape tiny needs --tokenizer DIR"), std::string::npos)
      << refused.output;
  // The embedded model's tokenizer (4096 ids) fits the tiny shape's vocabulary (10240).
  ServeProcess serve({"serve", "--shape", "tiny", "--tokenizer", austen.string(), "--device", "cpu",
                      "--port", "0", "--max-connections", "8", "--grace", "5"});
  const int port = serve.wait_for_port(std::chrono::seconds(120));
  ASSERT_GT(port, 0) << serve.output();
  HttpResponse response = http_request(port, "GET", "/v1/models");
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(Json::parse(response.body)["data"][0]["id"], "tiny");
  const Json completion = {{"model", "tiny"},
                           {"prompt", "It is a truth universally acknowledged"},
                           {"max_tokens", 7},
                           {"ignore_eos", true}};
  response = http_request(port, "POST", "/v1/completions", completion.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(Json::parse(response.body)["usage"]["completion_tokens"], 7) << response.body;
  EXPECT_EQ(serve.stop(SIGTERM, std::chrono::seconds(60)), 0) << serve.output();
  const std::regex done("shutdown: done; (\\d+) of (\\d+) KV pages free");
  std::smatch match;
  const std::string output = serve.output();
  ASSERT_TRUE(std::regex_search(output, match, done)) << output;
  EXPECT_EQ(match[1], match[2]) << output;
  EXPECT_NE(output.find("tiny (random bf16 weights)"), std::string::npos) << output;
}

// Tool calling's flags on the embedded model (a Llama whose template and family name no
// tool-call format): --enable-auto-tool-choice refuses to start without a parser and says which
// flag names one; with --tool-call-parser hermes a chat with tools is served (the model writes
// no call, so the reply is all content and finishes as usual).
TEST(CliServe, ToolCallParserFlags) {
  if (!std::filesystem::exists(pagedattn::testing::cli_path())) {
    GTEST_SKIP() << "pagedattn binary not built at " << pagedattn::testing::cli_path();
  }
  {
    ServeProcess refused({"serve", "--port", "0", "--enable-auto-tool-choice"});
    EXPECT_EQ(refused.wait_for_port(std::chrono::seconds(120)), -1) << refused.output();
    refused.stop(SIGTERM, std::chrono::seconds(10));
    EXPECT_NE(refused.output().find("--tool-call-parser"), std::string::npos) << refused.output();
  }
  ServeProcess serve(
      {"serve", "--port", "0", "--tool-call-parser", "hermes", "--grace", "5", "--quiet"});
  const int port = serve.wait_for_port(std::chrono::seconds(120));
  ASSERT_GT(port, 0) << serve.output();
  EXPECT_NE(serve.output().find("tool calls parsed as hermes"), std::string::npos)
      << serve.output();
  const Json chat = {{"model", "austen-3m"},
                     {"messages", {{{"role", "user"}, {"content", "Who is Mr. Darcy?"}}}},
                     {"tools",
                      {{{"type", "function"},
                        {"function", {{"name", "lookup"}, {"parameters", {{"type", "object"}}}}}}}},
                     {"temperature", 0},
                     {"max_tokens", 16},
                     {"ignore_eos", true}};
  const HttpResponse response = http_request(port, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const Json body = Json::parse(response.body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(serve.stop(SIGTERM, std::chrono::seconds(30)), 0) << serve.output();
}

}  // namespace
}  // namespace pagedattn::server::testing
