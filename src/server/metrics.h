// The server's Prometheus metrics: counters the HTTP threads bump as requests end, latency
// histograms (cumulative buckets, as the text format wants), and gauges read from the engine's
// stats snapshot when /metrics is scraped. Thread-safe (one mutex; a scrape or a request end is
// rare next to a step). Internal to the server layer.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::server::detail {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket / _sum / _count lines of `name`.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); last: +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

struct RequestRecord {
  int status = 200;
  std::string finish_reason;  // stop | length | abort | error | cancelled; empty: not served
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double ttft_seconds = -1.0;  // < 0: no token
  double e2e_seconds = 0.0;
};

class Metrics {
 public:
  Metrics();
  void record(const RequestRecord& record);
  // The rejected-before-the-engine requests (4xx / 5xx without a finish reason) count here too.
  void record_status(int status);
  void set_open_streams(int64_t open);
  std::string render(const engine::EngineStats& stats, int64_t pending_requests) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, int64_t> by_status_;
  std::map<std::string, int64_t> by_finish_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  Histogram ttft_;
  Histogram time_per_output_token_;
  Histogram e2e_;
  int64_t open_streams_ = 0;
};

}  // namespace pagedattn::server::detail
