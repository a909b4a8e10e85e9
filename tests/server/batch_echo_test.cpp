// /v1/completions as lm-evaluation-harness and batch clients use it, over loopback with the tests'
// own HTTP client: a batch of prompts (strings or token ids) x n choices numbered prompt * n +
// choice, in one body (usage summed) or interleaved SSE chunks with one [DONE]; echo (the prompt's
// text first, and with logprobs its tokens' entries: the first null, the others the log-softmax of
// the fake model's row before them, computed here in float64 from reference_logits, with the top
// k and the token itself among the alternatives); max_tokens 0
// with echo (scoring only); a bad element refusing the whole batch before anything runs; and a
// client leaving a batch (non-streaming or streaming) cancelling every prompt, all pages back;
// vLLM's prompt_logprobs field (token, rank and top n of every prompt token after the first).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <thread>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

using std::chrono::milliseconds;

// float64 log-softmax of the fake model's row after `prefix`.
std::vector<double> reference_logprobs(const std::vector<int32_t>& prefix) {
  std::vector<float> logits(kVocab);
  engine::testing::reference_logits(prefix, logits);
  double max_logit = -INFINITY, total = 0.0;
  for (const float v : logits) max_logit = std::max<double>(max_logit, v);
  for (const float v : logits) total += std::exp(double{v} - max_logit);
  std::vector<double> out(kVocab);
  for (size_t v = 0; v < out.size(); ++v) out[v] = logits[v] - max_logit - std::log(total);
  return out;
}

// Checks one completions `logprobs` object whose first prompt.size() entries are the echoed
// prompt and the rest the generated tokens, top-k alternatives each.
void expect_echo_logprobs(const Json& logprobs, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& generated, size_t top_k,
                          const std::string& what) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  ASSERT_EQ(logprobs["tokens"].size(), all.size()) << what;
  ASSERT_EQ(logprobs["token_logprobs"].size(), all.size()) << what;
  ASSERT_EQ(logprobs["top_logprobs"].size(), all.size()) << what;
  ASSERT_EQ(logprobs["text_offset"].size(), all.size()) << what;
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null()) << what;
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null()) << what;
  for (size_t i = 0; i < all.size(); ++i) {
    // The test prompts and the fake model's ASCII tokens are one character each here.
    if (all[i] >= 0x20 && all[i] < 0x7F) {
      EXPECT_EQ(logprobs["tokens"][i], std::string(1, static_cast<char>(all[i]))) << what;
    }
    if (i == 0) continue;
    const std::vector<int32_t> prefix(all.begin(), all.begin() + static_cast<ptrdiff_t>(i));
    const std::vector<double> expected = reference_logprobs(prefix);
    EXPECT_NEAR(logprobs["token_logprobs"][i].get<double>(), expected[static_cast<size_t>(all[i])],
                1e-5)
        << what << " token " << i;
    // The top k alternatives and the token itself (k + 1 entries when it is not among them).
    const Json& top = logprobs["top_logprobs"][i];
    ASSERT_TRUE(top.is_object()) << what;
    const double own = expected[static_cast<size_t>(all[i])];
    std::vector<double> got, best = expected;
    for (const auto& [key, value] : top.items()) got.push_back(value.get<double>());
    std::sort(got.rbegin(), got.rend());
    std::sort(best.rbegin(), best.rend());
    const bool own_in_top = own >= best[top_k - 1];
    ASSERT_EQ(top.size(), own_in_top ? top_k : top_k + 1) << what << " token " << i;
    if (!own_in_top) {
      EXPECT_NEAR(got.back(), own, 1e-5) << what << " token " << i;
      got.pop_back();
    }
    for (size_t k = 0; k < top_k; ++k) EXPECT_NEAR(got[k], best[k], 1e-5) << what << " top " << k;
  }
}

// text_offset: an ASCII prompt's tokens start at 0, 1, 2, ...; the first generated one at the
// prompt's end (or the character before, when its byte continues one); the rest never go back.
void expect_offsets(const Json& logprobs, size_t prompt_length, const std::string& what) {
  const std::vector<int64_t> offsets = logprobs["text_offset"].get<std::vector<int64_t>>();
  ASSERT_GE(offsets.size(), prompt_length) << what;
  for (size_t i = 0; i < prompt_length; ++i) EXPECT_EQ(offsets[i], i) << what;
  if (offsets.size() > prompt_length) {
    EXPECT_GE(offsets[prompt_length], static_cast<int64_t>(prompt_length) - 1) << what;
    EXPECT_LE(offsets[prompt_length], static_cast<int64_t>(prompt_length)) << what;
  }
  for (size_t i = prompt_length + 1; i < offsets.size(); ++i) {
    EXPECT_GE(offsets[i], offsets[i - 1]) << what;
  }
}

// vLLM's prompt_logprobs list for `prompt`: null, then per token an object holding the token
// (its logprob and rank under the fake model's row before it, from reference_logits) and the
// top_n best tokens of that row with ranks 1..n, each with its decoded_token.
void expect_vllm_prompt_logprobs(const Json& list, const std::vector<int32_t>& prompt,
                                 size_t top_n, const std::string& what) {
  ASSERT_TRUE(list.is_array()) << what << ": " << list.dump();
  ASSERT_EQ(list.size(), prompt.size()) << what;
  EXPECT_TRUE(list[0].is_null()) << what;
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(i));
    const std::vector<double> expected = reference_logprobs(prefix);
    std::vector<float> logits(kVocab);
    engine::testing::reference_logits(prefix, logits);
    // The row's order: higher logit first, ties by id.
    std::vector<int32_t> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });
    std::map<int32_t, int32_t> want;  // token -> rank
    for (size_t r = 0; r < top_n; ++r) want[order[r]] = static_cast<int32_t>(r) + 1;
    const int32_t token = prompt[i];
    want[token] = static_cast<int32_t>(std::find(order.begin(), order.end(), token) -
                                       order.begin()) +
                  1;
    const Json& entry = list[i];
    ASSERT_TRUE(entry.is_object()) << what << " token " << i;
    ASSERT_EQ(entry.size(), want.size()) << what << " token " << i << ": " << entry.dump();
    for (const auto& [id, rank] : want) {
      const std::string key = std::to_string(id);
      ASSERT_TRUE(entry.contains(key)) << what << " token " << i << " lacks " << key;
      EXPECT_EQ(entry[key]["rank"], rank) << what << " token " << i << " id " << id;
      EXPECT_NEAR(entry[key]["logprob"].get<double>(), expected[static_cast<size_t>(id)], 1e-5)
          << what << " token " << i << " id " << id;
      // A byte token: the character, or (a byte of a multi-byte character) "bytes:\xNN".
      if (id < 0x80) {
        EXPECT_EQ(entry[key]["decoded_token"], std::string(1, static_cast<char>(id))) << what;
      } else if (id < 0x100) {
        EXPECT_EQ(entry[key]["decoded_token"], fmt::format("bytes:\\x{:02x}", id)) << what;
      }
    }
  }
}

// vLLM's prompt_logprobs field: on each completions choice (with echo's logprobs keeping their
// own n when both are asked), at the top of a chat completion, on the first streamed chunk of
// each completions choice; out of range it is a 400 naming it.
TEST(PromptLogprobs, VllmFieldOnCompletionsChatAndStreams) {
  TestServer server;
  const std::string prompt = "rank me";
  Json request = {{"model", "test-model"}, {"prompt", prompt},       {"max_tokens", 2},
                  {"temperature", 0},      {"prompt_logprobs", 3}, {"n", 2}};
  HttpResponse response = http_request(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  Json body = Json::parse(response.body);
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const Json& choice : body["choices"]) {
    expect_vllm_prompt_logprobs(choice["prompt_logprobs"], bytes_of(prompt), 3, "completions");
    EXPECT_TRUE(choice["logprobs"].is_null());
  }
  // With echo and logprobs 1: the echoed entries keep 1 alternative, prompt_logprobs 3.
  request["echo"] = true;
  request["logprobs"] = 1;
  request["n"] = 1;
  request["max_tokens"] = 0;
  response = http_request(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  body = Json::parse(response.body);
  expect_echo_logprobs(body["choices"][0]["logprobs"], bytes_of(prompt), {}, 1, "echo");
  expect_vllm_prompt_logprobs(body["choices"][0]["prompt_logprobs"], bytes_of(prompt), 3,
                              "echo + prompt_logprobs");

  // Chat: at the top of the answer, over the rendered prompt.
  const Json chat = {{"model", "test-model"},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 2},
                     {"prompt_logprobs", 0}};
  response = http_request(server.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  body = Json::parse(response.body);
  expect_vllm_prompt_logprobs(body["prompt_logprobs"], bytes_of("user: hi\nassistant: "), 0,
                              "chat");

  // Streamed completions: the first chunk of each choice.
  Json streamed = {{"model", "test-model"}, {"prompt", {"ab", "cde"}}, {"max_tokens", 3},
                   {"prompt_logprobs", 2},  {"stream", true},          {"ignore_eos", true}};
  const StreamResult result = stream_request(server.port(), "/v1/completions", streamed.dump());
  ASSERT_EQ(result.status, 200) << result.failure;
  std::vector<int> seen(2, 0);
  for (size_t e = 0; e + 1 < result.events.size(); ++e) {
    const Json chunk = Json::parse(result.events[e]);
    const Json& choice = chunk["choices"][0];
    const size_t index = choice["index"];
    ASSERT_LT(index, 2u);
    if (seen[index]++ == 0) {
      expect_vllm_prompt_logprobs(choice["prompt_logprobs"], bytes_of(index == 0 ? "ab" : "cde"),
                                  2, fmt::format("stream choice {}", index));
    } else {
      EXPECT_FALSE(choice.contains("prompt_logprobs")) << "only the first chunk";
    }
  }
  EXPECT_EQ(seen[0] > 0 && seen[1] > 0, true);

  // Out of range: a 400 naming the field.
  for (const Json bad : {Json(-1), Json(21), Json("3")}) {
    Json wrong = request;
    wrong["prompt_logprobs"] = bad;
    response = http_request(server.port(), "POST", "/v1/completions", wrong.dump());
    EXPECT_EQ(response.status, 400) << bad.dump();
    EXPECT_EQ(Json::parse(response.body)["error"]["param"], "prompt_logprobs") << bad.dump();
  }
}

TEST(CompletionsBatch, PromptsTimesChoicesInOpenAIOrderWithUsageSummed) {
  TestServer server;
  const std::vector<std::string> prompts = {"ab", "hello", "xyz"};
  for (const bool token_ids : {false, true}) {
    SCOPED_TRACE(token_ids ? "token ids" : "strings");
    Json request = {{"model", "test-model"}, {"temperature", 0}, {"max_tokens", 10},
                    {"ignore_eos", true},    {"n", 2},           {"prompt", Json::array()}};
    for (const std::string& prompt : prompts) {
      if (token_ids) {
        request["prompt"].push_back(bytes_of(prompt));
      } else {
        request["prompt"].push_back(prompt);
      }
    }
    const HttpResponse response =
        http_request(server.port(), "POST", "/v1/completions", request.dump());
    ASSERT_EQ(response.status, 200) << response.body;
    const Json body = Json::parse(response.body);
    ASSERT_EQ(body["choices"].size(), 6u);
    std::vector<std::string> expected;
    for (const std::string& prompt : prompts) {
      expected.push_back(naive_decode(greedy_tokens(bytes_of(prompt), 10, true)));
    }
    ASSERT_NE(expected[0], expected[1]);  // so that the order is checked
    ASSERT_NE(expected[1], expected[2]);
    for (size_t i = 0; i < 6; ++i) {
      const Json& choice = body["choices"][i];
      EXPECT_EQ(choice["index"], i);
      EXPECT_EQ(choice["text"], expected[i / 2]) << "choice " << i;
      EXPECT_EQ(choice["finish_reason"], "length");
      EXPECT_TRUE(choice["logprobs"].is_null());
    }
    EXPECT_EQ(body["usage"]["prompt_tokens"], 2 + 5 + 3);
    EXPECT_EQ(body["usage"]["completion_tokens"], 60);
    EXPECT_EQ(body["usage"]["total_tokens"], 70);
  }
  ASSERT_TRUE(wait_idle(server.engine(), milliseconds(2000)));
  const engine::EngineStats stats = server.engine().stats();
  EXPECT_EQ(stats.num_finished, 6);  // one engine request per prompt
  EXPECT_EQ(stats.num_free_pages + stats.num_cached_pages, stats.num_pages);
}

TEST(CompletionsBatch, StreamInterleavesChunksByIndexAndEndsOnce) {
  TestServer server;
  const std::vector<std::vector<int32_t>> prompts = {
      bytes_of("one"), bytes_of("second prompt"), {300, 65, 66}};
  const Json request = {{"model", "test-model"},
                        {"temperature", 0},
                        {"max_tokens", 12},
                        {"ignore_eos", true},
                        {"n", 2},
                        {"prompt", prompts},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
  const StreamResult result = stream_request(server.port(), "/v1/completions", request.dump());
  ASSERT_EQ(result.status, 200) << result.failure;
  ASSERT_GE(result.events.size(), 3u);
  EXPECT_EQ(result.events.back(), "[DONE]");
  EXPECT_EQ(std::count(result.events.begin(), result.events.end(), "[DONE]"), 1);
  std::vector<std::string> texts(6);
  std::vector<int> finishes(6, 0);
  for (size_t e = 0; e + 2 < result.events.size(); ++e) {
    const Json chunk = Json::parse(result.events[e]);
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const Json& choice = chunk["choices"][0];
    const size_t index = choice["index"];
    ASSERT_LT(index, 6u);
    EXPECT_EQ(finishes[index], 0) << "a chunk after the finish of choice " << index;
    texts[index] += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) ++finishes[index];
  }
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
    EXPECT_EQ(texts[i], naive_decode(greedy_tokens(prompts[i / 2], 12, true))) << "choice " << i;
  }
  const Json usage = Json::parse(result.events[result.events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3 + 13 + 3);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6 * 12);
}

TEST(CompletionsEcho, PromptTextAndLogprobsBeforeTheGenerated) {
  TestServer server;
  // lm-evaluation-harness' loglikelihood request: echo, max_tokens 1, logprobs 1, token ids.
  const std::vector<std::vector<int32_t>> prompts = {bytes_of("The cat sat"), bytes_of("Q"),
                                                     bytes_of("on the mat.")};
  const Json request = {{"model", "test-model"}, {"prompt", prompts}, {"max_tokens", 1},
                        {"temperature", 0},      {"logprobs", 1},     {"echo", true},
                        {"seed", 1234},          {"ignore_eos", true}};
  HttpResponse response = http_request(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  Json body = Json::parse(response.body);
  ASSERT_EQ(body["choices"].size(), 3u);
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<int32_t> generated = greedy_tokens(prompts[i], 1, true);
    const Json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["text"], naive_decode(prompts[i]) + naive_decode(generated));
    expect_echo_logprobs(choice["logprobs"], prompts[i], generated, 1, fmt::format("prompt {}", i));
    expect_offsets(choice["logprobs"], prompts[i].size(), fmt::format("prompt {}", i));
    prompt_tokens += static_cast<int64_t>(prompts[i].size());
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);

  // A string prompt echoes as given; without logprobs there are none.
  const Json plain = {{"model", "test-model"}, {"prompt", "Hi there"}, {"max_tokens", 5},
                      {"temperature", 0},      {"echo", true},         {"ignore_eos", true}};
  response = http_request(server.port(), "POST", "/v1/completions", plain.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  body = Json::parse(response.body);
  EXPECT_EQ(body["choices"][0]["text"],
            "Hi there" + naive_decode(greedy_tokens(bytes_of("Hi there"), 5, true)));
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
}

TEST(CompletionsEcho, MaxTokensZeroScoresThePromptOnly) {
  TestServer server;
  const std::string prompt = "score me";
  for (const bool logprobs : {true, false}) {
    SCOPED_TRACE(logprobs ? "logprobs 3" : "no logprobs");
    Json request = {{"model", "test-model"},
                    {"prompt", {prompt, "x"}},
                    {"max_tokens", 0},
                    {"echo", true},
                    {"n", 2}};
    if (logprobs) request["logprobs"] = 3;
    const HttpResponse response =
        http_request(server.port(), "POST", "/v1/completions", request.dump());
    ASSERT_EQ(response.status, 200) << response.body;
    const Json body = Json::parse(response.body);
    ASSERT_EQ(body["choices"].size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      const std::string text = i < 2 ? prompt : "x";
      const Json& choice = body["choices"][i];
      EXPECT_EQ(choice["text"], text);
      EXPECT_EQ(choice["finish_reason"], "length");
      if (logprobs) {
        expect_echo_logprobs(choice["logprobs"], bytes_of(text), {}, 3,
                             fmt::format("choice {}", i));
      } else {
        EXPECT_TRUE(choice["logprobs"].is_null());
      }
    }
    EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size() + 1);
    EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  }
  // Without echo, max_tokens 0 is refused.
  const Json bad = {{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", 0}};
  const HttpResponse response = http_request(server.port(), "POST", "/v1/completions", bad.dump());
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(Json::parse(response.body)["error"]["param"], "max_tokens");
  EXPECT_EQ(server.engine().stats().num_generated_tokens, 0);
}

TEST(CompletionsEcho, StreamedFirstChunkStartsWithThePrompt) {
  TestServer server;
  const std::vector<std::vector<int32_t>> prompts = {bytes_of("abc"), bytes_of("defgh")};
  const Json request = {{"model", "test-model"}, {"prompt", prompts}, {"max_tokens", 6},
                        {"temperature", 0},      {"logprobs", 2},     {"echo", true},
                        {"ignore_eos", true},    {"stream", true}};
  const StreamResult result = stream_request(server.port(), "/v1/completions", request.dump());
  ASSERT_EQ(result.status, 200) << result.failure;
  EXPECT_EQ(result.events.back(), "[DONE]");
  std::vector<std::string> texts(2);
  std::vector<Json> merged(2, Json{{"tokens", Json::array()},
                                   {"token_logprobs", Json::array()},
                                   {"top_logprobs", Json::array()},
                                   {"text_offset", Json::array()}});
  std::vector<int> chunks(2, 0);
  for (size_t e = 0; e + 1 < result.events.size(); ++e) {
    const Json chunk = Json::parse(result.events[e]);
    const Json& choice = chunk["choices"][0];
    const size_t index = choice["index"];
    ASSERT_LT(index, 2u);
    const std::string text = choice["text"];
    if (chunks[index]++ == 0) {
      const std::string echoed = naive_decode(prompts[index]);
      EXPECT_EQ(text.substr(0, echoed.size()), echoed) << "the first chunk starts with the prompt";
    }
    texts[index] += text;
    if (choice["logprobs"].is_null()) continue;
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const Json& item : choice["logprobs"][key]) merged[index][key].push_back(item);
    }
  }
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<int32_t> generated = greedy_tokens(prompts[i], 6, true);
    EXPECT_EQ(texts[i], naive_decode(prompts[i]) + naive_decode(generated));
    expect_echo_logprobs(merged[i], prompts[i], generated, 2, fmt::format("prompt {}", i));
    expect_offsets(merged[i], prompts[i].size(), fmt::format("prompt {}", i));
  }
}

TEST(CompletionsBatch, OneBadPromptRefusesTheBatchBeforeAnythingRuns) {
  TestServerOptions options;
  options.max_model_length = 64;
  TestServer server(options);
  const std::string long_prompt(64, 'z');
  struct Case {
    Json prompt;
    std::string param;
  };
  const std::vector<Case> cases = {
      {Json{"ok", 5}, "prompt[1]"},
      {Json{{1, 2}, {3, kVocab}}, "prompt[1]"},
      {Json{"ok", "fine", long_prompt}, "prompt[2]"},
      {Json{{1}, Json::array()}, "prompt[1]"},
  };
  for (const Case& test : cases) {
    const Json request = {{"model", "test-model"}, {"prompt", test.prompt}, {"max_tokens", 4}};
    const HttpResponse response =
        http_request(server.port(), "POST", "/v1/completions", request.dump());
    EXPECT_EQ(response.status, 400) << response.body;
    EXPECT_EQ(Json::parse(response.body)["error"]["param"], test.param) << response.body;
  }
  const engine::EngineStats stats = server.engine().stats();
  EXPECT_EQ(stats.num_steps, 0) << "a refused batch reached the engine";
  EXPECT_EQ(stats.num_finished, 0);
}

// Waits (bounded) until the engine has sampled `tokens` tokens in all.
bool wait_generated(engine::Engine& engine, int64_t tokens, milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (engine.stats().num_generated_tokens >= tokens) return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return false;
}

TEST(CompletionsBatch, AClientLeavingCancelsEveryPrompt) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    TestServer server;
    server.model().set_step_delay(milliseconds(5));  // 300 tokens: 1.5 s per prompt
    const int32_t total_pages = server.engine().allocator().num_pages();
    const Json request = {{"model", "test-model"},
                          {"prompt", {"first prompt", "second", "third one"}},
                          {"n", 2},
                          {"max_tokens", 300},
                          {"ignore_eos", true},
                          {"stream", stream}};
    if (stream) {
      int chunks = 0;
      const StreamResult result = stream_request(server.port(), "/v1/completions", request.dump(),
                                                 [&](const std::string&) { return ++chunks < 12; });
      EXPECT_TRUE(result.hung_up);
    } else {
      const int socket = connect_loopback(server.port());
      ASSERT_GE(socket, 0);
      const std::string body = request.dump();
      ASSERT_TRUE(send_all(socket,
                           "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                           "application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body));
      ASSERT_TRUE(wait_generated(server.engine(), 12, milliseconds(10000)));
      EXPECT_EQ(server.engine().stats().num_running, 6);  // 3 prompts x 2 choices
      ::close(socket);
    }
    ASSERT_TRUE(wait_idle(server.engine(), milliseconds(3000)))
        << "the batch was not cancelled within 3 s of the client leaving";
    const engine::EngineStats stats = server.engine().stats();
    EXPECT_LT(stats.num_generated_tokens, 6 * 300 / 2);
    EXPECT_EQ(stats.num_free_pages + stats.num_cached_pages, total_pages);
    const ShutdownReport report = server.server().shutdown(milliseconds(0));
    EXPECT_EQ(report.num_free_pages, report.num_pages);
  }
}

}  // namespace
}  // namespace pagedattn::server::testing
