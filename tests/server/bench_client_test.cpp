// The serving benchmark client against a live server: every request completes with exactly
// output_len tokens, the token totals match (usage), latencies are ordered (TTFT <= E2E,
// p50 <= p90 <= p99); percentile() is nearest-rank (values worked out by hand); bad options and
// an unreachable server are errors that name the option.
#include <gtest/gtest.h>

#include "pagedattn/error.h"
#include "pagedattn/server_bench.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

TEST(BenchServe, Percentile) {
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_EQ(percentile({3.0}, 99), 3.0);
  // Sorted 1..10: rank ceil(q/100 * 10).
  const std::vector<double> values = {7, 1, 10, 3, 5, 2, 9, 4, 8, 6};
  EXPECT_EQ(percentile(values, 50), 5.0);
  EXPECT_EQ(percentile(values, 90), 9.0);
  EXPECT_EQ(percentile(values, 99), 10.0);
  EXPECT_EQ(percentile(values, 0), 1.0);
  EXPECT_EQ(percentile(values, 100), 10.0);
}

TEST(BenchServe, AgainstALiveServer) {
  TestServer server;
  for (const char* endpoint : {"completions", "chat"}) {
    BenchServeOptions options;
    options.url = "http://127.0.0.1:" + std::to_string(server.port());
    options.endpoint = endpoint;
    options.num_requests = 24;
    options.rate = std::string(endpoint) == "chat" ? 200.0 : 0.0;
    options.input_len = 12;
    options.output_len = 10;
    options.seed = 5;
    const BenchServeResult result = run_bench_serve(options);
    SCOPED_TRACE(endpoint);
    EXPECT_EQ(result.num_completed, 24) << format_bench_serve(options, result);
    EXPECT_EQ(result.num_failed, 0);
    EXPECT_EQ(result.total_output_tokens, 24 * 10);
    EXPECT_GT(result.total_prompt_tokens, 24 * 12);  // bytes: at least one per word + spaces
    EXPECT_GT(result.output_throughput, 0.0);
    for (const LatencySummary* summary :
         {&result.ttft_ms, &result.tpot_ms, &result.itl_ms, &result.e2e_ms}) {
      EXPECT_LE(summary->p50, summary->p90);
      EXPECT_LE(summary->p90, summary->p99);
    }
    EXPECT_LE(result.ttft_ms.p50, result.e2e_ms.p50);
    EXPECT_GT(result.e2e_ms.p50, 0.0);
    const Json json = Json::parse(bench_serve_json(options, result));
    EXPECT_EQ(json["completed"], 24);
    EXPECT_EQ(json["output_tokens"], 240);
  }
}

TEST(BenchServe, Errors) {
  BenchServeOptions options;
  options.num_requests = 0;
  EXPECT_THROW(run_bench_serve(options), Error);
  options.num_requests = 1;
  options.endpoint = "embeddings";
  EXPECT_THROW(run_bench_serve(options), Error);
  options.endpoint = "chat";
  options.url = "http://127.0.0.1:1";  // nothing listens on port 1
  try {
    run_bench_serve(options);
    ADD_FAILURE() << "no error for an unreachable server";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("127.0.0.1:1"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pagedattn::server::testing
