// A client that leaves while it waits for a NON-streaming answer (nothing is written to it until
// the answer is whole, so no failed write can tell): over a real loopback socket, a long request
// (hundreds of slowed-down steps) is sent, the socket closed (FIN) or reset (RST) once tokens
// flow, and the request must be cancelled at once: the engine empties well before the request
// could have finished, the metrics count it cancelled, the log says so, and every page is free
// or cached. A client that stays (even with a pipelined request waiting on the socket) still
// gets its answers, equal to the greedy reference.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <ostream>
#include <thread>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

using std::chrono::milliseconds;

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A sample's value in the Prometheus text (0 when absent).
int64_t metric(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + " ");
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + key.size() + 2));
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

enum class Leave { kClose, kReset };

struct LeaveCase {
  Leave leave;
  Endpoint endpoint;
  const char* name;
};
void PrintTo(const LeaveCase& item, std::ostream* out) { *out << item.name; }

class NonStreamingDisconnect : public ::testing::TestWithParam<LeaveCase> {};

TEST_P(NonStreamingDisconnect, CancelsTheRequestAtOnce) {
  const auto [leave, endpoint, name] = GetParam();
  TestServer server;
  constexpr int kMaxTokens = 400;
  constexpr milliseconds kStep{10};  // the request alone would last 400 x 10 ms = 4 s
  server.model().set_step_delay(kStep);
  const int32_t total_pages = server.engine().allocator().num_pages();
  const Json common = {{"model", "test-model"},
                       {"temperature", 0},
                       {"max_tokens", kMaxTokens},
                       {"ignore_eos", true}};
  Json body = common;
  std::string path;
  if (endpoint == Endpoint::kChat) {
    body["messages"] = {{{"role", "user"}, {"content", "wait for me"}}};
    path = "/v1/chat/completions";
  } else {
    body["prompt"] = "wait for me";
    path = "/v1/completions";
  }
  const int socket = connect_loopback(server.port());
  ASSERT_GE(socket, 0);
  ASSERT_TRUE(send_all(socket, post(path, body.dump())));
  // Tokens flow: the request holds pages and is being served.
  ASSERT_TRUE(wait_generated(server.engine(), 5, milliseconds(10000)));
  EXPECT_EQ(server.engine().stats().num_running, 1);
  EXPECT_LT(server.engine().stats().num_free_pages, total_pages);

  if (leave == Leave::kReset) {
    const linger reset{1, 0};  // close() sends RST instead of FIN
    ::setsockopt(socket, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  }
  const auto left = std::chrono::steady_clock::now();
  ::close(socket);
  ASSERT_TRUE(wait_idle(server.engine(), milliseconds(3000)))
      << "the request was not cancelled within 3 s of the client leaving";
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count();
  const engine::EngineStats stats = server.engine().stats();
  std::printf("client left; engine idle %.0f ms later, after %lld of %d tokens\n", seconds * 1e3,
              static_cast<long long>(stats.num_generated_tokens), kMaxTokens);
  // A check interval (20 ms) and a step or two (10 ms each): far below the 4 s the request had
  // left. Bounded loosely, so a loaded machine passes; the token count is the sharp test.
  EXPECT_LT(seconds, 1.5);
  EXPECT_LT(stats.num_generated_tokens, kMaxTokens / 2);
  EXPECT_EQ(stats.num_free_pages + stats.num_cached_pages, total_pages);

  // Counted once, as cancelled; the log line says so.
  std::string text;
  for (int wait = 0; wait < 200; ++wait) {
    text = server.server().metrics_text();
    if (metric(text, "pagedattn_num_requests_pending") == 0) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(metric(text, "pagedattn_request_success_total{finished_reason=\"cancelled\"}"), 1)
      << text;
  EXPECT_EQ(metric(text, "pagedattn_num_requests_pending"), 0) << text;
  int cancelled_lines = 0;
  for (const std::string& line : server.log_lines()) {
    if (line.rfind("request ", 0) == 0 && line.find("finish=cancelled") != std::string::npos) {
      ++cancelled_lines;
    }
  }
  EXPECT_EQ(cancelled_lines, 1);

  // Still serving; and at shutdown every page is free.
  server.model().set_step_delay(milliseconds(0));
  EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
  const ShutdownReport report = server.server().shutdown(milliseconds(0));
  EXPECT_EQ(report.num_free_pages, report.num_pages);
}

INSTANTIATE_TEST_SUITE_P(
    Leaving, NonStreamingDisconnect,
    ::testing::Values(LeaveCase{Leave::kClose, Endpoint::kChat, "CloseChat"},
                      LeaveCase{Leave::kClose, Endpoint::kCompletions, "CloseCompletions"},
                      LeaveCase{Leave::kReset, Endpoint::kChat, "ResetChat"},
                      LeaveCase{Leave::kReset, Endpoint::kCompletions, "ResetCompletions"}),
    [](const auto& info) { return std::string(info.param.name); });

// A client that stays is served to the end though its handler polls it many times, and a second
// request it sent on the same connection while the first ran (bytes waiting on the socket) is
// not taken for leaving: both answers come, in order, equal to the reference.
TEST(NonStreamingDisconnect, AClientThatStaysIsServed) {
  TestServer server;
  server.model().set_step_delay(milliseconds(3));  // 60 tokens: ~180 ms, many check intervals
  const auto request = [](const std::string& prompt) {
    return Json{{"model", "test-model"},
                {"prompt", prompt},
                {"temperature", 0},
                {"max_tokens", 60},
                {"ignore_eos", true}};
  };
  const int socket = connect_loopback(server.port());
  ASSERT_GE(socket, 0);
  ASSERT_TRUE(send_all(socket, post("/v1/completions", request("first").dump())));
  ASSERT_TRUE(wait_generated(server.engine(), 3, milliseconds(10000)));
  // Pipelined: sent while the first is being answered, so it waits in the socket's buffer.
  std::string second = post("/v1/completions", request("second").dump());
  second.insert(second.find("\r\n\r\n"), "\r\nConnection: close");
  ASSERT_TRUE(send_all(socket, second));
  std::string raw;
  char buffer[4096];
  for (ssize_t got; (got = ::recv(socket, buffer, sizeof(buffer), 0)) > 0;) raw.append(buffer, got);
  ::close(socket);
  // Two responses, each with a Content-Length body.
  std::vector<std::string> bodies;
  for (size_t at = 0; at < raw.size();) {
    const size_t head_end = raw.find("\r\n\r\n", at);
    ASSERT_NE(head_end, std::string::npos) << raw;
    const HttpResponse head = parse_response(raw.substr(at, head_end + 4 - at));
    EXPECT_EQ(head.status, 200) << raw;
    ASSERT_TRUE(head.headers.contains("content-length")) << raw;
    const size_t length = std::stoul(head.headers.at("content-length"));
    bodies.push_back(raw.substr(head_end + 4, length));
    at = head_end + 4 + length;
  }
  ASSERT_EQ(bodies.size(), 2u) << raw;
  for (size_t i = 0; i < 2; ++i) {
    const Json body = Json::parse(bodies[i]);
    const std::string prompt = i == 0 ? "first" : "second";
    EXPECT_EQ(body["choices"][0]["text"], naive_decode(greedy_tokens(bytes_of(prompt), 60, true)));
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  }
  const std::string text = server.server().metrics_text();
  EXPECT_EQ(metric(text, "pagedattn_request_success_total{finished_reason=\"length\"}"), 2);
  EXPECT_EQ(metric(text, "pagedattn_request_success_total{finished_reason=\"cancelled\"}"), 0);
}

}  // namespace
}  // namespace pagedattn::server::testing
