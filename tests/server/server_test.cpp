// The endpoints over loopback with the tests' own HTTP client: non-streaming and streaming chat
// and completions compared with the greedy reference (no engine) decoded by the whole-buffer
// UTF-8 decoder; the SSE framing (role first, content, the finish chunk, usage, [DONE]); n > 1;
// logprobs shape; stop strings; /v1/models, /health, /metrics; the request log line; streams
// over a model that overlaps its steps (as a CUDA model does).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

TEST(Server, ChatNonStreamingMatchesGreedyReference) {
  TestServer server;
  const Json request = {{"model", "test-model"},
                        {"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                        {"temperature", 0},
                        {"max_tokens", 24},
                        {"ignore_eos", true}};
  const HttpResponse response =
      http_request(server.port(), "POST", "/v1/chat/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const Json body = Json::parse(response.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "test-model");
  ASSERT_EQ(body["choices"].size(), 1u);
  const std::vector<int32_t> prompt = bytes_of("user: Hello there\nassistant: ");
  const std::vector<int32_t> expected = greedy_tokens(prompt, 24, true);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], naive_decode(expected));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 24);
  EXPECT_EQ(body["usage"]["total_tokens"], prompt.size() + 24);
}

TEST(Server, CompletionsStopsAtEos) {
  TestServer server;
  // Find a prompt whose greedy output reaches EOS within 400 tokens: the reference says when.
  std::string prompt;
  std::vector<int32_t> expected;
  for (int seed = 0; seed < 200; ++seed) {
    prompt = fmt::format("p{}", seed);
    expected = greedy_tokens(bytes_of(prompt), 400, false);
    if (expected.back() == kEos) break;
  }
  ASSERT_EQ(expected.back(), kEos) << "no prompt reaches EOS; the fake model changed?";
  const Json request = {
      {"model", "test-model"}, {"prompt", prompt}, {"temperature", 0.0}, {"max_tokens", 400}};
  const HttpResponse response =
      http_request(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const Json body = Json::parse(response.body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], naive_decode(expected));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["completion_tokens"], expected.size());
}

TEST(Server, ChatStreamFraming) {
  TestServer server;
  const Json request = {{"model", "test-model"},
                        {"messages",
                         {{{"role", "system"}, {"content", "Be brief."}},
                          {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
                        {"temperature", 0},
                        {"max_completion_tokens", 40},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
  const StreamResult result = stream_request(server.port(), "/v1/chat/completions", request.dump());
  ASSERT_EQ(result.status, 200);
  ASSERT_GE(result.events.size(), 4u);
  EXPECT_EQ(result.events.back(), "[DONE]");
  const Json first = Json::parse(result.events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  std::string text;
  std::string id = first["id"];
  for (size_t i = 1; i + 3 < result.events.size(); ++i) {
    const Json chunk = Json::parse(result.events[i]);
    EXPECT_EQ(chunk["id"], id);
    EXPECT_FALSE(chunk["choices"][0]["delta"].contains("role"));
    EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    text += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  const Json last = Json::parse(result.events[result.events.size() - 3]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  const Json usage = Json::parse(result.events[result.events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  const std::vector<int32_t> prompt = bytes_of("system: Be brief.\nuser: Hi\nassistant: ");
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 40);
  EXPECT_EQ(text, naive_decode(greedy_tokens(prompt, 40, true)));
}

TEST(Server, CompletionsStreamWithTokenPromptAndN) {
  TestServer server;
  const std::vector<int32_t> prompt = {5, 300, 17, 99, 256, 3};
  const Json request = {{"model", "test-model"}, {"prompt", prompt},   {"temperature", 0},
                        {"max_tokens", 30},      {"ignore_eos", true}, {"n", 3},
                        {"stream", true}};
  const StreamResult result = stream_request(server.port(), "/v1/completions", request.dump());
  ASSERT_EQ(result.status, 200);
  EXPECT_EQ(result.events.back(), "[DONE]");
  std::vector<std::string> texts(3);
  std::vector<int> finishes(3, 0);
  for (size_t i = 0; i + 1 < result.events.size(); ++i) {
    const Json chunk = Json::parse(result.events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_FALSE(chunk.contains("usage"));
    const Json& choice = chunk["choices"][0];
    const size_t index = choice["index"];
    ASSERT_LT(index, 3u);
    EXPECT_EQ(finishes[index], 0) << "text after the finish chunk";
    texts[index] += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) {
      EXPECT_EQ(choice["finish_reason"], "length");
      ++finishes[index];
    }
  }
  const std::string expected = naive_decode(greedy_tokens(prompt, 30, true));
  for (int index = 0; index < 3; ++index) {
    EXPECT_EQ(finishes[index], 1);
    EXPECT_EQ(texts[index], expected) << "choice " << index;  // greedy: all choices equal
  }
}

TEST(Server, LogprobsShapes) {
  TestServer server;
  const Json chat = {{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                     {"temperature", 0},      {"max_tokens", 5},
                     {"ignore_eos", true},    {"logprobs", true},
                     {"top_logprobs", 3}};
  HttpResponse response = http_request(server.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  Json body = Json::parse(response.body);
  const Json& content = body["choices"][0]["logprobs"]["content"];
  const std::vector<int32_t> expected = greedy_tokens(bytes_of("user: x\nassistant: "), 5, true);
  ASSERT_EQ(content.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(content[i]["top_logprobs"].size(), 3u);
    EXPECT_LE(content[i]["logprob"].get<double>(), 0.0);
    // Greedy: the chosen token is the best alternative, with the same logprob.
    EXPECT_EQ(content[i]["top_logprobs"][0]["logprob"], content[i]["logprob"]);
    const std::string bytes = server.front().token_bytes(expected[i]);
    ASSERT_EQ(content[i]["bytes"].size(), bytes.size());
    for (size_t b = 0; b < bytes.size(); ++b) {
      EXPECT_EQ(content[i]["bytes"][b], static_cast<unsigned char>(bytes[b]));
    }
  }
  const Json completion = {{"model", "test-model"}, {"prompt", "x"},      {"temperature", 0},
                           {"max_tokens", 4},       {"ignore_eos", true}, {"logprobs", 2}};
  response = http_request(server.port(), "POST", "/v1/completions", completion.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  body = Json::parse(response.body);
  const Json& logprobs = body["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["tokens"].size(), 4u);
  EXPECT_EQ(logprobs["token_logprobs"].size(), 4u);
  EXPECT_EQ(logprobs["top_logprobs"].size(), 4u);
  EXPECT_EQ(logprobs["text_offset"].size(), 4u);
  EXPECT_LE(logprobs["top_logprobs"][0].size(), 2u);
}

TEST(Server, StopStringCutsTheText) {
  TestServer server;
  const std::vector<int32_t> prompt = bytes_of("user: stop test\nassistant: ");
  const std::string full = naive_decode(greedy_tokens(prompt, 60, true));
  // A stop string taken from the middle of the reference output (ASCII, so no replacement char
  // is split).
  size_t at = std::string::npos;
  for (size_t i = 5; i + 2 < full.size() && i < 40; ++i) {
    if (std::isalnum(static_cast<unsigned char>(full[i])) &&
        std::isalnum(static_cast<unsigned char>(full[i + 1]))) {
      at = i;
      break;
    }
  }
  ASSERT_NE(at, std::string::npos) << full;
  const std::string stop = full.substr(at, 2);
  const Json request = {
      {"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "stop test"}}}},
      {"temperature", 0},      {"max_tokens", 60},
      {"ignore_eos", true},    {"stop", {stop, "\x01\x02never"}}};
  const HttpResponse response =
      http_request(server.port(), "POST", "/v1/chat/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const Json body = Json::parse(response.body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["message"]["content"], full.substr(0, full.find(stop)));
}

// Overlap scheduling through the server, as a CUDA model runs it: the model samples its rows and
// each step is launched before the previous one is taken in. Concurrent streams each get the
// greedy reference, and /metrics counts the overlapped steps (the server's steps must overlap as
// the offline engine's do: issue 17's overhead against offline depends on it).
TEST(Server, ConcurrentStreamsOverlapTheirSteps) {
  TestServerOptions options;
  options.overlap = true;
  TestServer server(options);
  constexpr int kStreams = 8;
  constexpr int kTokens = 24;
  const auto prompt_of = [](int i) { return std::vector<int32_t>{5 + i, 300, 17, 99}; };
  std::vector<std::string> texts(kStreams);
  std::vector<int> statuses(kStreams, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      const Json request = {{"model", "test-model"}, {"prompt", prompt_of(i)}, {"temperature", 0},
                            {"max_tokens", kTokens}, {"ignore_eos", true},     {"stream", true}};
      const StreamResult result = stream_request(server.port(), "/v1/completions", request.dump());
      statuses[i] = result.status;
      for (const std::string& event : result.events) {
        if (event == "[DONE]") continue;
        texts[i] += Json::parse(event)["choices"][0]["text"].get<std::string>();
      }
    });
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(statuses[i], 200) << "stream " << i;
    EXPECT_EQ(texts[i], naive_decode(greedy_tokens(prompt_of(i), kTokens, true))) << "stream " << i;
  }
  const HttpResponse metrics = http_request(server.port(), "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  const auto counter = [&](const std::string& name) {
    const size_t at = metrics.body.find("\n" + name + " ");
    return at == std::string::npos ? -1L : std::stol(metrics.body.substr(at + name.size() + 2));
  };
  const long steps = counter("pagedattn_engine_steps_total");
  const long overlapped = counter("pagedattn_engine_overlapped_steps_total");
  EXPECT_GE(steps, kTokens) << metrics.body;  // one new token per sequence per step at most
  // Every step launched while another was in flight overlaps; only the steps after an idle
  // engine (a first arrival) and the drain at the end may not.
  EXPECT_GT(overlapped, steps / 2) << metrics.body;
}

TEST(Server, ModelsHealthMetricsAndLog) {
  TestServer server;
  HttpResponse response = http_request(server.port(), "GET", "/v1/models");
  ASSERT_EQ(response.status, 200);
  Json body = Json::parse(response.body);
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "test-model");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(http_request(server.port(), "GET", "/v1/models/test-model").status, 200);
  EXPECT_EQ(http_request(server.port(), "GET", "/v1/models/other").status, 404);
  response = http_request(server.port(), "GET", "/health");
  EXPECT_EQ(response.status, 200);

  const Json request = {
      {"model", "test-model"}, {"prompt", "metrics"}, {"max_tokens", 7}, {"ignore_eos", true}};
  ASSERT_EQ(http_request(server.port(), "POST", "/v1/completions", request.dump()).status, 200);
  ASSERT_EQ(http_request(server.port(), "POST", "/v1/completions", "{").status, 400);
  response = http_request(server.port(), "GET", "/metrics");
  ASSERT_EQ(response.status, 200);
  const std::string& text = response.body;
  const auto has = [&](const std::string& line) { return text.find(line) != std::string::npos; };
  EXPECT_TRUE(has("pagedattn_http_requests_total{status=\"200\"} ")) << text;
  EXPECT_TRUE(has("pagedattn_http_requests_total{status=\"400\"} 1\n")) << text;
  EXPECT_TRUE(has("pagedattn_request_success_total{finished_reason=\"length\"} 1\n")) << text;
  EXPECT_TRUE(has("pagedattn_prompt_tokens_total 7\n")) << text;
  EXPECT_TRUE(has("pagedattn_generation_tokens_total 7\n")) << text;
  EXPECT_TRUE(has("pagedattn_time_to_first_token_seconds_count 1\n")) << text;
  EXPECT_TRUE(has("pagedattn_time_per_output_token_seconds_count 1\n")) << text;
  EXPECT_TRUE(has("pagedattn_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 1\n")) << text;
  EXPECT_TRUE(has("pagedattn_kv_pages_total 4096\n")) << text;
  EXPECT_TRUE(has("pagedattn_num_requests_running 0\n")) << text;
  EXPECT_TRUE(has("pagedattn_prefix_cache_hit_rate ")) << text;
  EXPECT_TRUE(has("pagedattn_num_preemptions_total 0\n")) << text;
  // The CPU model runs steps one at a time: none overlapped.
  EXPECT_TRUE(has("pagedattn_engine_overlapped_steps_total 0\n")) << text;
  EXPECT_FALSE(has("pagedattn_engine_steps_total 0\n")) << text;

  int request_lines = 0;
  for (const std::string& line : server.log_lines()) {
    if (line.rfind("request cmpl-", 0) == 0) {
      ++request_lines;
      EXPECT_NE(line.find("prompt_tokens=7 completion_tokens=7"), std::string::npos) << line;
      EXPECT_NE(line.find("finish=length"), std::string::npos) << line;
      EXPECT_NE(line.find("ttft_ms="), std::string::npos) << line;
      EXPECT_NE(line.find("total_ms="), std::string::npos) << line;
    }
  }
  EXPECT_EQ(request_lines, 1);
}

}  // namespace
}  // namespace pagedattn::server::testing
