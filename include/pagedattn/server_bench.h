// A serving benchmark client, as vLLM's and SGLang's serving benchmarks are: replays N
// streaming requests against any OpenAI-compatible server, arriving as a Poisson process of
// rate R (exponential gaps, seeded) or all at once, and reports request and output-token
// throughput with TTFT, time per output token (TPOT: (e2e - TTFT) / (tokens - 1)), inter-token
// latency and end-to-end latency at p50 / p90 / p99. Each request asks for exactly output_len
// tokens (ignore_eos) so that runs compare; prompts are random words of input_len words. One
// thread per request in flight (cpp-httplib's blocking client). `pagedattn bench serve` prints
// this; the server tests run it against a live server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedattn::server {

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host:port (no path)
  std::string model;                          // empty: the first of GET /v1/models
  std::string endpoint = "completions";       // completions | chat
  int32_t num_requests = 100;
  double rate = 0.0;            // requests per second; <= 0: all at once
  int32_t input_len = 64;       // words per prompt
  int32_t output_len = 64;      // max_tokens, ignore_eos
  int32_t max_concurrency = 0;  // <= 0: unbounded
  uint64_t seed = 0;
  double timeout_seconds = 600.0;  // per request
};

struct LatencySummary {
  double mean = 0.0;
  double p50 = 0.0;
  double p90 = 0.0;
  double p99 = 0.0;
};

struct BenchServeResult {
  int32_t num_completed = 0;
  int32_t num_failed = 0;
  std::vector<std::string> errors;  // the first few failures, for the report
  double duration_seconds = 0.0;
  int64_t total_prompt_tokens = 0;  // from usage
  int64_t total_output_tokens = 0;
  double request_throughput = 0.0;  // completed / s
  double output_throughput = 0.0;   // output tokens / s
  LatencySummary ttft_ms;
  LatencySummary tpot_ms;
  LatencySummary itl_ms;  // gaps between content chunks
  LatencySummary e2e_ms;
};

// Throws pagedattn::Error for bad options or when the server cannot be reached at all; failed
// requests are counted, not thrown.
BenchServeResult run_bench_serve(const BenchServeOptions& options);

// Nearest-rank percentile (q in [0, 100]) of `values` (any order); 0 for none.
double percentile(std::vector<double> values, double q);

// The result as a human-readable table and as JSON (for bench/RESULTS.md and --json).
std::string format_bench_serve(const BenchServeOptions& options, const BenchServeResult& result);
std::string bench_serve_json(const BenchServeOptions& options, const BenchServeResult& result);

}  // namespace pagedattn::server
