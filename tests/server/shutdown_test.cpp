// Shutdown: within the grace period running streams finish normally while new requests get 503;
// past it they are aborted (finish_reason "abort", then [DONE]); either way every page is free
// at the end. And the signal path `pagedattn serve` uses: SIGTERM to the process wakes the
// waiter returned by install_shutdown_signals(), whichever thread the kernel hands it to.
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <thread>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

const std::string kStreamBody =
    R"({"model":"test-model","prompt":"shutdown","max_tokens":20,"ignore_eos":true,"stream":true})";

struct Collected {
  StreamResult result;
  std::string finish_reason;
};

void collect(TestServer& server, Collected* out) {
  out->result = stream_request(server.port(), "/v1/completions", kStreamBody);
  for (const std::string& event : out->result.events) {
    if (event == "[DONE]") continue;
    const Json chunk = Json::parse(event);
    if (!chunk["choices"].empty() && !chunk["choices"][0]["finish_reason"].is_null()) {
      out->finish_reason = chunk["choices"][0]["finish_reason"];
    }
  }
}

void wait_pending(TestServer& server, int count) {
  const std::string line = "pagedattn_num_requests_pending " + std::to_string(count) + "\n";
  for (int wait = 0; wait < 4000; ++wait) {
    if (server.server().metrics_text().find(line) != std::string::npos) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL() << "never saw " << line;
}

TEST(ServerShutdown, RunningRequestsFinishWithinTheGrace) {
  TestServer server;
  server.model().pause();
  std::vector<Collected> collected(3);
  std::vector<std::thread> clients;
  for (Collected& out : collected) clients.emplace_back([&] { collect(server, &out); });
  wait_pending(server, 3);
  ShutdownReport report;
  std::thread stopper([&] { report = server.server().shutdown(std::chrono::seconds(20)); });
  // Draining: health and new requests are refused while the three run on.
  HttpResponse health;
  for (int wait = 0; wait < 4000 && health.status != 503; ++wait) {
    health = http_request(server.port(), "GET", "/health");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(http_request(server.port(), "POST", "/v1/completions",
                         R"({"model":"test-model","prompt":"late"})")
                .status,
            503);
  server.model().resume();
  stopper.join();
  for (std::thread& client : clients) client.join();
  for (const Collected& out : collected) {
    EXPECT_EQ(out.result.status, 200);
    EXPECT_EQ(out.finish_reason, "length");
    ASSERT_FALSE(out.result.events.empty());
    EXPECT_EQ(out.result.events.back(), "[DONE]");
  }
  EXPECT_EQ(report.num_aborted, 0);
  EXPECT_EQ(report.num_free_pages, report.num_pages);
}

TEST(ServerShutdown, PastTheGraceRequestsAreAborted) {
  TestServer server;
  server.model().pause();
  std::vector<Collected> collected(2);
  std::vector<std::thread> clients;
  for (Collected& out : collected) clients.emplace_back([&] { collect(server, &out); });
  wait_pending(server, 2);
  ShutdownReport report;
  std::thread stopper([&] { report = server.server().shutdown(std::chrono::milliseconds(100)); });
  // The engine thread is inside a paused forward(); once the server says it is aborting (the
  // grace is over), the model resumes and the abort lands at the next step boundary.
  bool aborting = false;
  for (int wait = 0; wait < 2000 && !aborting; ++wait) {
    for (const std::string& line : server.log_lines()) {
      if (line.rfind("shutdown: aborting 2 requests", 0) == 0) aborting = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(aborting);
  server.model().resume();
  stopper.join();
  for (std::thread& client : clients) client.join();
  for (const Collected& out : collected) {
    EXPECT_EQ(out.result.status, 200);
    EXPECT_EQ(out.finish_reason, "abort");
    ASSERT_FALSE(out.result.events.empty());
    EXPECT_EQ(out.result.events.back(), "[DONE]");
  }
  EXPECT_EQ(report.num_aborted, 2);
  EXPECT_EQ(report.num_free_pages, report.num_pages);
}

TEST(ServerShutdown, SignalsWakeTheWaiterWhicheverThreadTakesThem) {
  // A thread that blocks nothing, started before the handlers go in (as OpenBLAS's pool starts
  // when the library loads); the main thread blocks both signals, so the kernel must hand them
  // to another thread. Under the default action that would kill the process.
  std::atomic<bool> done{false};
  std::thread bystander([&done] {
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const std::function<int()> wait = install_shutdown_signals();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  {
    TestServer server;
    ::kill(::getpid(), SIGTERM);
    EXPECT_EQ(wait(), SIGTERM);
    ::kill(::getpid(), SIGINT);
    EXPECT_EQ(wait(), SIGINT);
    const ShutdownReport report = server.server().shutdown(std::chrono::seconds(1));
    EXPECT_EQ(report.num_free_pages, report.num_pages);
  }
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  // Unblocked, the main thread may take it itself: the handler still reports it.
  ::kill(::getpid(), SIGTERM);
  EXPECT_EQ(wait(), SIGTERM);
  done = true;
  bystander.join();
}

}  // namespace
}  // namespace pagedattn::server::testing
