// Prometheus text exposition (version 0.0.4) of the server's metrics (metrics.h). Names follow
// vLLM's where one exists, under the pagedattn_ prefix; latencies in seconds.
#include "metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace pagedattn::server::detail {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

namespace {
const std::vector<double> kLatencyBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                            0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                            7.5,   10.0,  20.0, 40.0, 80.0};
const std::vector<double> kTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                          0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
}  // namespace

Metrics::Metrics()
    : ttft_(kLatencyBounds), time_per_output_token_(kTokenBounds), e2e_(kLatencyBounds) {}

void Metrics::record(const RequestRecord& record) {
  std::lock_guard lock(mutex_);
  ++by_status_[record.status];
  if (!record.finish_reason.empty()) ++by_finish_[record.finish_reason];
  prompt_tokens_ += record.prompt_tokens;
  generation_tokens_ += record.completion_tokens;
  if (record.ttft_seconds >= 0.0) ttft_.observe(record.ttft_seconds);
  if (record.completion_tokens > 1 && record.ttft_seconds >= 0.0) {
    time_per_output_token_.observe((record.e2e_seconds - record.ttft_seconds) /
                                   static_cast<double>(record.completion_tokens - 1));
  }
  if (!record.finish_reason.empty()) e2e_.observe(record.e2e_seconds);
}

void Metrics::record_status(int status) {
  std::lock_guard lock(mutex_);
  ++by_status_[status];
}

void Metrics::set_open_streams(int64_t open) {
  std::lock_guard lock(mutex_);
  open_streams_ = open;
}

std::string Metrics::render(const engine::EngineStats& stats, int64_t pending_requests) const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "pagedattn_http_requests_total", "counter", "HTTP requests answered, by status.");
  for (const auto& [status, count] : by_status_) {
    out += fmt::format("pagedattn_http_requests_total{{status=\"{}\"}} {}\n", status, count);
  }
  header(out, "pagedattn_request_success_total", "counter",
         "Generation requests finished, by finish reason (cancelled: the client went away).");
  for (const auto& [reason, count] : by_finish_) {
    out += fmt::format("pagedattn_request_success_total{{finished_reason=\"{}\"}} {}\n", reason,
                       count);
  }
  header(out, "pagedattn_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  out += fmt::format("pagedattn_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "pagedattn_generation_tokens_total", "counter",
         "Tokens generated for finished requests (all choices).");
  out += fmt::format("pagedattn_generation_tokens_total {}\n", generation_tokens_);
  header(out, "pagedattn_time_to_first_token_seconds", "histogram",
         "From the request's arrival to its first generated token.");
  ttft_.render("pagedattn_time_to_first_token_seconds", out);
  header(out, "pagedattn_time_per_output_token_seconds", "histogram",
         "Mean time between output tokens after the first, per request.");
  time_per_output_token_.render("pagedattn_time_per_output_token_seconds", out);
  header(out, "pagedattn_e2e_request_latency_seconds", "histogram",
         "From the request's arrival to its last token.");
  e2e_.render("pagedattn_e2e_request_latency_seconds", out);
  header(out, "pagedattn_num_requests_running", "gauge", "Sequences in the running batch.");
  out += fmt::format("pagedattn_num_requests_running {}\n", stats.num_running);
  header(out, "pagedattn_num_requests_waiting", "gauge", "Sequences waiting or preempted.");
  out += fmt::format("pagedattn_num_requests_waiting {}\n", stats.num_waiting);
  header(out, "pagedattn_num_requests_pending", "gauge",
         "Requests accepted by the server and not finished (the 503 limit counts these).");
  out += fmt::format("pagedattn_num_requests_pending {}\n", pending_requests);
  header(out, "pagedattn_open_streams", "gauge", "Streaming responses in progress.");
  out += fmt::format("pagedattn_open_streams {}\n", open_streams_);
  header(out, "pagedattn_kv_pages_total", "gauge", "KV pages in the pool.");
  out += fmt::format("pagedattn_kv_pages_total {}\n", stats.num_pages);
  header(out, "pagedattn_kv_pages_free", "gauge", "KV pages free.");
  out += fmt::format("pagedattn_kv_pages_free {}\n", stats.num_free_pages);
  header(out, "pagedattn_kv_pages_used", "gauge", "KV pages held (by requests or the cache).");
  out += fmt::format("pagedattn_kv_pages_used {}\n", stats.num_pages - stats.num_free_pages);
  header(out, "pagedattn_kv_pages_cached", "gauge", "KV pages held by the prefix cache.");
  out += fmt::format("pagedattn_kv_pages_cached {}\n", stats.num_cached_pages);
  header(out, "pagedattn_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.");
  out += fmt::format("pagedattn_prefix_cache_queries_total {}\n", stats.prefix_query_tokens);
  header(out, "pagedattn_prefix_cache_hits_total", "counter",
         "Prompt tokens served from the prefix cache.");
  out += fmt::format("pagedattn_prefix_cache_hits_total {}\n", stats.prefix_hit_tokens);
  header(out, "pagedattn_prefix_cache_hit_rate", "gauge",
         "hits / queries since start (0 if none).");
  out +=
      fmt::format("pagedattn_prefix_cache_hit_rate {}\n",
                  stats.prefix_query_tokens > 0 ? static_cast<double>(stats.prefix_hit_tokens) /
                                                      static_cast<double>(stats.prefix_query_tokens)
                                                : 0.0);
  header(out, "pagedattn_num_preemptions_total", "counter", "Sequences preempted (recomputed).");
  out += fmt::format("pagedattn_num_preemptions_total {}\n", stats.num_preemptions);
  header(out, "pagedattn_engine_steps_total", "counter", "Engine steps run.");
  out += fmt::format("pagedattn_engine_steps_total {}\n", stats.num_steps);
  header(out, "pagedattn_engine_overlapped_steps_total", "counter",
         "Engine steps launched while the step before was still running (overlap scheduling).");
  out += fmt::format("pagedattn_engine_overlapped_steps_total {}\n", stats.num_overlapped_steps);
  header(out, "pagedattn_engine_seconds_total", "counter",
         "Engine-thread time by phase (schedule: inbox, scheduling; plan: the step's tables; "
         "forward: the model; sample: sampling, stop checks, events).");
  out += fmt::format("pagedattn_engine_seconds_total{{phase=\"schedule\"}} {}\n",
                     stats.schedule_seconds);
  out += fmt::format("pagedattn_engine_seconds_total{{phase=\"plan\"}} {}\n", stats.plan_seconds);
  out += fmt::format("pagedattn_engine_seconds_total{{phase=\"forward\"}} {}\n",
                     stats.forward_seconds);
  out +=
      fmt::format("pagedattn_engine_seconds_total{{phase=\"sample\"}} {}\n", stats.sample_seconds);
  return out;
}

}  // namespace pagedattn::server::detail
