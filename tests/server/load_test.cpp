// Reliability under load: 500 concurrent streaming requests (one client thread each, the
// server's pool sized for them), a quarter hanging up after a random number of events. Every
// other one must end with finish_reason "length", usage.completion_tokens == its max_tokens and
// the greedy reference text; /health must answer throughout; once the engine is idle every page
// is free again (free + prefix-cached == total, and all free after clearing the cache at
// shutdown). Seeded (the seed is printed) and bounded in time.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <random>
#include <thread>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

struct ClientPlan {
  std::string prompt;
  int max_tokens = 0;
  int hang_up_after = -1;  // events; -1: read to the end
};

struct ClientOutcome {
  int status = 0;
  bool done = false;  // [DONE] seen
  std::string text;
  std::string finish_reason;
  int64_t completion_tokens = -1;
  std::string failure;
};

TEST(ServerLoad, FiveHundredStreamsWithAQuarterDisconnecting) {
  constexpr int kClients = 500;
  // Two sockets per stream in this one process (client and server ends): raise the soft limit
  // on open files to the hard one.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  const uint64_t seed = std::random_device{}();
  std::printf("ServerLoad seed: %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  TestServerOptions options;
  options.max_connections = 560;  // 500 streams + /health + slack
  options.num_pages = 2048;       // 500 x ~4 pages of 16 tokens at most; fits with preemption
  options.max_running = 256;
  TestServer server(options);
  const int32_t total_pages = server.engine().allocator().num_pages();

  std::vector<ClientPlan> plans(kClients);
  for (int i = 0; i < kClients; ++i) {
    plans[i].prompt = "client " + std::to_string(i % 97) + " says " + std::to_string(i);
    plans[i].max_tokens = 8 + static_cast<int>(random() % 40);
    if (i % 4 == 0) plans[i].hang_up_after = 1 + static_cast<int>(random() % 12);
  }
  std::vector<ClientOutcome> outcomes(kClients);
  std::atomic<bool> clients_done{false};
  std::atomic<int> health_ok{0}, health_failed{0};
  std::thread health([&] {
    while (!clients_done.load()) {
      const HttpResponse response = http_request(server.port(), "GET", "/health");
      (response.status == 200 ? health_ok : health_failed)++;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  clients.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      const ClientPlan& plan = plans[static_cast<size_t>(i)];
      ClientOutcome& outcome = outcomes[static_cast<size_t>(i)];
      const Json request = {{"model", "test-model"},
                            {"messages", {{{"role", "user"}, {"content", plan.prompt}}}},
                            {"temperature", 0},
                            {"max_tokens", plan.max_tokens},
                            {"ignore_eos", true},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}};
      int events = 0;
      const StreamResult result = stream_request(
          server.port(), "/v1/chat/completions", request.dump(), [&](const std::string& event) {
            ++events;
            if (plan.hang_up_after >= 0 && events >= plan.hang_up_after) return false;
            if (event == "[DONE]") {
              outcome.done = true;
              return true;
            }
            const Json chunk = Json::parse(event);
            if (!chunk["choices"].empty()) {
              const Json& choice = chunk["choices"][0];
              if (choice["delta"].contains("content")) {
                outcome.text += choice["delta"]["content"].get<std::string>();
              }
              if (!choice["finish_reason"].is_null())
                outcome.finish_reason = choice["finish_reason"];
            }
            if (chunk.contains("usage") && chunk["usage"].is_object()) {
              outcome.completion_tokens = chunk["usage"]["completion_tokens"];
            }
            return true;
          });
      outcome.status = result.status;
      outcome.failure = result.failure;
    });
  }
  for (std::thread& client : clients) client.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  clients_done = true;
  health.join();
  std::printf("ServerLoad: %d streams in %.2f s; /health answered %d times (%d failed)\n", kClients,
              seconds, health_ok.load(), health_failed.load());

  int completed = 0;
  for (int i = 0; i < kClients; ++i) {
    const ClientPlan& plan = plans[static_cast<size_t>(i)];
    const ClientOutcome& outcome = outcomes[static_cast<size_t>(i)];
    SCOPED_TRACE("client " + std::to_string(i));
    EXPECT_EQ(outcome.status, 200) << outcome.failure;
    if (plan.hang_up_after >= 0) continue;
    ++completed;
    EXPECT_TRUE(outcome.done);
    EXPECT_EQ(outcome.finish_reason, "length");
    EXPECT_EQ(outcome.completion_tokens, plan.max_tokens);
    const std::vector<int32_t> prompt = bytes_of("user: " + plan.prompt + "\nassistant: ");
    EXPECT_EQ(outcome.text, naive_decode(greedy_tokens(prompt, plan.max_tokens, true)));
  }
  EXPECT_EQ(completed, kClients - kClients / 4);
  EXPECT_GT(health_ok.load(), 0);
  EXPECT_EQ(health_failed.load(), 0);

  // The hung-up requests were aborted: the engine empties and every page is free or cached.
  ASSERT_TRUE(wait_idle(server.engine(), std::chrono::seconds(20)));
  const engine::EngineStats stats = server.engine().stats();
  EXPECT_EQ(stats.num_free_pages + stats.num_cached_pages, total_pages);
  const std::string metrics = server.server().metrics_text();
  // Every request is counted once: length (read to the end, or the server was done before the
  // client hung up) or cancelled.
  int64_t finished = 0, finished_length = 0;
  for (const char* reason : {"length", "cancelled"}) {
    const std::string key =
        std::string("pagedattn_request_success_total{finished_reason=\"") + reason + "\"} ";
    const size_t at = metrics.find(key);
    if (at == std::string::npos) continue;
    const int64_t count = std::stoll(metrics.substr(at + key.size()));
    finished += count;
    if (std::string(reason) == "length") finished_length = count;
  }
  EXPECT_EQ(finished, kClients) << metrics;
  EXPECT_GE(finished_length, completed) << metrics;
  // Most hung-up clients left before their request finished: the cancel path ran.
  EXPECT_GT(finished - finished_length, kClients / 8) << metrics;
  std::printf("ServerLoad: %lld finished by length, %lld cancelled\n",
              static_cast<long long>(finished_length),
              static_cast<long long>(finished - finished_length));
  EXPECT_NE(metrics.find("pagedattn_open_streams 0\n"), std::string::npos) << metrics;
  const ShutdownReport report = server.server().shutdown(std::chrono::milliseconds(0));
  EXPECT_EQ(report.num_free_pages, report.num_pages);
}

}  // namespace
}  // namespace pagedattn::server::testing
