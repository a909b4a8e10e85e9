// Bad input over HTTP, each answered with the right 4xx in OpenAI's error shape, and the server
// still serving after every one: malformed JSON, wrong types, unknown fields, empty messages,
// a prompt over the model length, max_tokens 0 / huge, invalid UTF-8, a body over the limit,
// an unknown model, an unknown path, a queue full (503), a slow client sending its headers byte
// by byte.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

struct BadCase {
  const char* name;
  const char* path;
  std::string body;
  int status;
  const char* param;  // expected error.param; nullptr: null
  const char* code;   // expected error.code
};

std::string chat_with(const std::string& fields) {
  return R"({"model":"test-model","messages":[{"role":"user","content":"hi"}])" + fields + "}";
}

std::vector<BadCase> bad_cases() {
  const std::string long_prompt(600, 'a');  // model length 512
  return {
      {"malformed json", "/v1/chat/completions", R"({"model":"test-model",)", 400, nullptr,
       "invalid_json"},
      {"not an object", "/v1/chat/completions", "[1,2]", 400, nullptr, "invalid_type"},
      {"empty body", "/v1/completions", "", 400, nullptr, "invalid_json"},
      {"temperature string", "/v1/chat/completions", chat_with(R"(,"temperature":"hot")"), 400,
       "temperature", "invalid_type"},
      {"n float", "/v1/chat/completions", chat_with(R"(,"n":1.5)"), 400, "n", "invalid_type"},
      {"stream number", "/v1/chat/completions", chat_with(R"(,"stream":1)"), 400, "stream",
       "invalid_type"},
      {"messages string", "/v1/chat/completions", R"({"model":"test-model","messages":"hi"})", 400,
       "messages", "invalid_type"},
      {"unknown field", "/v1/chat/completions", chat_with(R"(,"temprature":0.5)"), 400,
       "temprature", "unknown_parameter"},
      {"completions field on chat", "/v1/chat/completions", chat_with(R"(,"echo":false)"), 400,
       "echo", "unknown_parameter"},
      {"unknown message field", "/v1/chat/completions",
       R"({"model":"test-model","messages":[{"role":"user","content":"hi","mood":"x"}]})", 400,
       "messages[0].mood", "unknown_parameter"},
      {"bad role", "/v1/chat/completions",
       R"({"model":"test-model","messages":[{"role":"robot","content":"hi"}]})", 400,
       "messages[0].role", "invalid_value"},
      {"empty messages", "/v1/chat/completions", R"({"model":"test-model","messages":[]})", 400,
       "messages", "invalid_value"},
      {"missing messages", "/v1/chat/completions", R"({"model":"test-model"})", 400, "messages",
       "missing_required_parameter"},
      {"missing model", "/v1/completions", R"({"prompt":"x"})", 400, "model",
       "missing_required_parameter"},
      {"prompt too long", "/v1/completions",
       R"({"model":"test-model","prompt":")" + long_prompt + "\"}", 400, "prompt",
       "context_length_exceeded"},
      {"prompt plus max_tokens too long", "/v1/completions",
       R"({"model":"test-model","prompt":"abc","max_tokens":510})", 400, "prompt",
       "context_length_exceeded"},
      {"max_tokens 0", "/v1/chat/completions", chat_with(R"(,"max_tokens":0)"), 400, "max_tokens",
       "invalid_value"},
      {"max_tokens huge", "/v1/chat/completions", chat_with(R"(,"max_tokens":99999999999)"), 400,
       "max_tokens", "invalid_value"},
      {"max_completion_tokens negative", "/v1/chat/completions",
       chat_with(R"(,"max_completion_tokens":-3)"), 400, "max_completion_tokens", "invalid_value"},
      {"invalid utf-8", "/v1/chat/completions",
       "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xC3\x28\"}]}",
       400, nullptr, "invalid_json"},
      {"lone surrogate escape", "/v1/completions", R"({"model":"test-model","prompt":"\udc00"})",
       400, nullptr, "invalid_json"},
      {"top_p zero", "/v1/completions", R"({"model":"test-model","prompt":"x","top_p":0})", 400,
       "top_p", "invalid_value"},
      {"logit_bias key", "/v1/completions",
       R"({"model":"test-model","prompt":"x","logit_bias":{"dog":5}})", 400, "logit_bias",
       "invalid_value"},
      {"token out of vocabulary", "/v1/completions",
       R"({"model":"test-model","prompt":[1,2,99999]})", 400, "prompt", "invalid_value"},
      {"top_logprobs without logprobs", "/v1/chat/completions", chat_with(R"(,"top_logprobs":2)"),
       400, "top_logprobs", "invalid_value"},
      {"tool without a name", "/v1/chat/completions",
       chat_with(R"(,"tools":[{"type":"function","function":{"name":"f"}},)"
                 R"({"type":"function","function":{}}])"),
       400, "tools[1].function.name", "missing_required_parameter"},
      {"tool_choice required", "/v1/chat/completions",
       chat_with(R"(,"tools":[{"type":"function","function":{"name":"f"}}],)"
                 R"("tool_choice":"required")"),
       400, "tool_choice", "invalid_value"},
      {"deep nesting", "/v1/completions", std::string(5000, '[') + std::string(5000, ']'), 400,
       nullptr, "invalid_json"},
      {"unknown model", "/v1/chat/completions",
       R"({"model":"gpt-9","messages":[{"role":"user","content":"hi"}]})", 404, "model",
       "model_not_found"},
  };
}

void expect_error_shape(const HttpResponse& response, int status, const char* param,
                        const char* code, const std::string& name) {
  ASSERT_EQ(response.status, status) << name << ": " << response.body;
  EXPECT_EQ(response.headers.at("content-type"), "application/json") << name;
  const Json body = Json::parse(response.body);
  ASSERT_TRUE(body.contains("error")) << name;
  const Json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty()) << name;
  EXPECT_TRUE(error["type"].is_string()) << name;
  ASSERT_TRUE(error.contains("param") && error.contains("code")) << name;
  if (param == nullptr) {
    EXPECT_TRUE(error["param"].is_null()) << name << ": " << error.dump();
  } else {
    EXPECT_EQ(error["param"], param) << name;
  }
  if (code != nullptr) {
    EXPECT_EQ(error["code"], code) << name << ": " << error.dump();
  }
}

void expect_serving(int port) {
  const HttpResponse health = http_request(port, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  const Json request = {
      {"model", "test-model"}, {"prompt", "ok"}, {"max_tokens", 3}, {"ignore_eos", true}};
  const HttpResponse response = http_request(port, "POST", "/v1/completions", request.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(Json::parse(response.body)["usage"]["completion_tokens"], 3);
}

TEST(ServerBadInput, EachAnsweredAndStillServing) {
  TestServerOptions options;
  options.max_body_bytes = 64 * 1024;
  TestServer server(options);
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(bad.name);
    expect_error_shape(http_request(server.port(), "POST", bad.path, bad.body), bad.status,
                       bad.param, bad.code, bad.name);
  }
  expect_serving(server.port());

  // A body over the limit: 413 before it is read.
  const std::string huge = chat_with(",\"user\":\"" + std::string(100 * 1024, 'x') + "\"");
  expect_error_shape(http_request(server.port(), "POST", "/v1/chat/completions", huge), 413,
                     nullptr, "request_too_large", "body over the limit");
  // No such path, wrong method.
  expect_error_shape(http_request(server.port(), "GET", "/v1/nothing"), 404, nullptr, "not_found",
                     "unknown path");
  expect_error_shape(http_request(server.port(), "GET", "/v1/chat/completions"), 404, nullptr,
                     "not_found", "wrong method");
  // A request line that is not HTTP.
  const HttpResponse garbage = raw_request(server.port(), "HELLO\r\n\r\n");
  EXPECT_GE(garbage.status, 400);
  EXPECT_LT(garbage.status, 500);
  expect_serving(server.port());
}

TEST(ServerBadInput, SlowClientSendingHeadersByteByByte) {
  TestServer server;
  const std::string body =
      R"({"model":"test-model","prompt":"slow","max_tokens":4,"ignore_eos":true})";
  const std::string raw =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Connection: close\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  const int fd = connect_loopback(server.port());
  ASSERT_GE(fd, 0);
  std::atomic<int> served_meanwhile{0};
  std::thread others([&] {
    for (int i = 0; i < 5; ++i) {
      if (http_request(server.port(), "GET", "/health").status == 200) ++served_meanwhile;
    }
  });
  for (const char c : raw) {
    ASSERT_TRUE(send_all(fd, std::string(1, c)));
    ::usleep(3000);
  }
  ASSERT_TRUE(send_all(fd, body));
  std::string received;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  others.join();
  const HttpResponse response = parse_response(received);
  ASSERT_EQ(response.status, 200) << received;
  EXPECT_EQ(Json::parse(response.body)["usage"]["completion_tokens"], 4);
  EXPECT_EQ(served_meanwhile.load(), 5);

  // A client that stops in the middle of its headers is dropped after the read timeout, and
  // the server keeps serving meanwhile.
  const int stalled = connect_loopback(server.port());
  ASSERT_TRUE(send_all(stalled, "POST /v1/completions HTTP/1.1\r\nHost: 127"));
  expect_serving(server.port());
  ::close(stalled);
}

TEST(ServerBadInput, QueueFullIs503) {
  TestServerOptions options;
  options.max_pending_requests = 2;
  TestServer server(options);
  server.model().pause();
  const std::string body =
      R"({"model":"test-model","prompt":"q","max_tokens":2,"ignore_eos":true})";
  std::vector<std::thread> holders;
  std::vector<int> statuses(2, 0);
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([&, i] {
      statuses[static_cast<size_t>(i)] =
          http_request(server.port(), "POST", "/v1/completions", body).status;
    });
  }
  // Both are in the engine once the pending gauge says so.
  for (int wait = 0; wait < 2000; ++wait) {
    if (server.server().metrics_text().find("pagedattn_num_requests_pending 2\n") !=
        std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  expect_error_shape(http_request(server.port(), "POST", "/v1/completions", body), 503, nullptr,
                     "queue_full", "queue full");
  EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
  server.model().resume();
  for (std::thread& holder : holders) holder.join();
  EXPECT_EQ(statuses[0], 200);
  EXPECT_EQ(statuses[1], 200);
  expect_serving(server.port());
}

// Each prompt of a completions batch takes a place in the queue: with 3 places and one request
// in, a batch of 3 prompts is refused whole and a batch of 2 is served.
TEST(ServerBadInput, ABatchTakesAPlacePerPrompt) {
  TestServerOptions options;
  options.max_pending_requests = 3;
  TestServer server(options);
  server.model().pause();
  const auto wait_pending = [&](int count) {
    const std::string line = "pagedattn_num_requests_pending " + std::to_string(count) + "\n";
    for (int wait = 0; wait < 2000; ++wait) {
      if (server.server().metrics_text().find(line) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  int single_status = 0, pair_status = 0;
  std::thread single([&] {
    single_status = http_request(server.port(), "POST", "/v1/completions",
                                 R"({"model":"test-model","prompt":"q","max_tokens":2})")
                        .status;
  });
  ASSERT_TRUE(wait_pending(1));
  expect_error_shape(
      http_request(server.port(), "POST", "/v1/completions",
                   R"({"model":"test-model","prompt":["a","b","c"],"max_tokens":2})"),
      503, nullptr, "queue_full", "queue full");
  std::thread pair([&] {
    pair_status = http_request(server.port(), "POST", "/v1/completions",
                               R"({"model":"test-model","prompt":["a","b"],"max_tokens":2})")
                      .status;
  });
  EXPECT_TRUE(wait_pending(3));
  server.model().resume();
  single.join();
  pair.join();
  EXPECT_EQ(single_status, 200);
  EXPECT_EQ(pair_status, 200);
  EXPECT_TRUE(wait_pending(0));
  expect_serving(server.port());
}

}  // namespace
}  // namespace pagedattn::server::testing
