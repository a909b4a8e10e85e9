// The serving benchmark client (server_bench.h). Arrivals: request i starts at the sum of i
// exponential gaps of mean 1 / rate (std::exponential_distribution, seeded), or at 0. Each
// request is a streaming POST with stream_options.include_usage; the content receiver splits
// SSE events on blank lines and stamps the first chunk carrying text (TTFT) and every later one
// (inter-token latency). Token counts come from the usage chunk.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/check.h"
#include "pagedattn/server_bench.h"

namespace pagedattn::server {

using Json = nlohmann::json;
using BenchClock = std::chrono::steady_clock;

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(q / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, double(values.size()))) - 1;
  return values[index];
}

namespace {

struct Sample {
  bool ok = false;
  std::string error;
  double ttft = -1.0, e2e = 0.0;
  std::vector<double> gaps;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

LatencySummary summarize(const std::vector<double>& seconds) {
  LatencySummary summary;
  if (seconds.empty()) return summary;
  double sum = 0.0;
  for (const double value : seconds) sum += value;
  summary.mean = sum / static_cast<double>(seconds.size()) * 1e3;
  summary.p50 = percentile(seconds, 50) * 1e3;
  summary.p90 = percentile(seconds, 90) * 1e3;
  summary.p99 = percentile(seconds, 99) * 1e3;
  return summary;
}

const char* const kWords[] = {"the",  "of",    "and",    "to",     "a",    "in",   "was",
                              "her",  "it",    "that",   "not",    "be",   "she",  "he",
                              "his",  "as",    "had",    "with",   "for",  "you",  "Elizabeth",
                              "Emma", "house", "sister", "letter", "walk", "ball", "family"};

std::string random_prompt(std::mt19937_64& random, int32_t words) {
  std::string text;
  for (int32_t i = 0; i < words; ++i) {
    if (i) text += ' ';
    text += kWords[random() % std::size(kWords)];
  }
  return text;
}

Sample run_one(const BenchServeOptions& options, const std::string& model,
               const std::string& prompt) {
  Sample sample;
  httplib::Client client(options.url);
  const auto timeout = std::chrono::duration<double>(options.timeout_seconds);
  client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_connection_timeout(std::chrono::seconds(10));
  const bool chat = options.endpoint == "chat";
  Json body = {{"model", model},
               {"max_tokens", options.output_len},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (chat) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  httplib::Request request;
  request.method = "POST";
  request.path = chat ? "/v1/chat/completions" : "/v1/completions";
  request.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  request.body = body.dump();
  const BenchClock::time_point start = BenchClock::now();
  BenchClock::time_point last = start;
  std::string pending;
  std::string failure;
  const auto on_event = [&](const std::string& payload) {
    if (payload == "[DONE]") return;
    const Json chunk = Json::parse(payload, nullptr, false);
    if (chunk.is_discarded()) return;
    if (chunk.contains("error")) {
      failure = chunk["error"].value("message", "error in stream");
      return;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      sample.prompt_tokens = chunk["usage"].value("prompt_tokens", int64_t{0});
      sample.output_tokens = chunk["usage"].value("completion_tokens", int64_t{0});
    }
    if (!chunk.contains("choices") || chunk["choices"].empty()) return;
    const Json& choice = chunk["choices"][0];
    const bool has_text = chat ? (choice.contains("delta") && choice["delta"].contains("content") &&
                                  choice["delta"]["content"].is_string() &&
                                  !choice["delta"]["content"].get<std::string>().empty())
                               : (choice.contains("text") && choice["text"].is_string() &&
                                  !choice["text"].get<std::string>().empty());
    if (!has_text) return;
    const BenchClock::time_point now = BenchClock::now();
    if (sample.ttft < 0.0) {
      sample.ttft = std::chrono::duration<double>(now - start).count();
    } else {
      sample.gaps.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
  };
  int status = 0;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    pending.append(data, length);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (status == 200 && event.rfind("data: ", 0) == 0) on_event(event.substr(6));
      if (status != 200) failure += event;
    }
    if (status != 200) failure += pending;
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(request, response, error);
  sample.e2e = std::chrono::duration<double>(BenchClock::now() - start).count();
  if (!sent) {
    sample.error = fmt::format("request failed: {}", httplib::to_string(error));
  } else if (status != 200) {
    sample.error = fmt::format("HTTP {}: {}", status, failure.substr(0, 200));
  } else if (!failure.empty()) {
    sample.error = failure;
  } else if (sample.output_tokens == 0) {
    sample.error = "no usage chunk (does the server support stream_options.include_usage?)";
  } else {
    sample.ok = true;
  }
  return sample;
}

std::string first_model(const std::string& url) {
  httplib::Client client(url);
  client.set_connection_timeout(std::chrono::seconds(10));
  const httplib::Result result = client.Get("/v1/models");
  PA_CHECK(result, "bench serve: --url {}: cannot reach GET /v1/models ({})", url,
           httplib::to_string(result.error()));
  PA_CHECK(result->status == 200, "bench serve: GET {}/v1/models answered {}", url, result->status);
  const Json body = Json::parse(result->body, nullptr, false);
  PA_CHECK(!body.is_discarded() && body.contains("data") && body["data"].is_array() &&
               !body["data"].empty() && body["data"][0].contains("id"),
           "bench serve: GET {}/v1/models: no model listed", url);
  return body["data"][0]["id"].get<std::string>();
}

}  // namespace

BenchServeResult run_bench_serve(const BenchServeOptions& options) {
  PA_CHECK(options.num_requests >= 1, "--requests: {} (expected >= 1)", options.num_requests);
  PA_CHECK(options.output_len >= 1, "--output-len: {} (expected >= 1)", options.output_len);
  PA_CHECK(options.input_len >= 1, "--input-len: {} (expected >= 1)", options.input_len);
  PA_CHECK(options.endpoint == "chat" || options.endpoint == "completions",
           "--endpoint: '{}' (expected chat or completions)", options.endpoint);
  const std::string model = options.model.empty() ? first_model(options.url) : options.model;
  std::mt19937_64 random(options.seed);
  std::exponential_distribution<double> gap(options.rate > 0.0 ? options.rate : 1.0);
  std::vector<double> arrivals(static_cast<size_t>(options.num_requests), 0.0);
  std::vector<std::string> prompts;
  double time = 0.0;
  for (int32_t i = 0; i < options.num_requests; ++i) {
    if (options.rate > 0.0 && i > 0) time += gap(random);
    arrivals[static_cast<size_t>(i)] = time;
    prompts.push_back(random_prompt(random, options.input_len));
  }
  std::vector<Sample> samples(arrivals.size());
  std::mutex mutex;
  std::condition_variable slot_free;
  int32_t in_flight = 0;
  std::vector<std::thread> threads;
  const BenchClock::time_point start = BenchClock::now();
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<BenchClock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    if (options.max_concurrency > 0) {
      std::unique_lock lock(mutex);
      slot_free.wait(lock, [&] { return in_flight < options.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      samples[i] = run_one(options, model, prompts[i]);
      if (options.max_concurrency > 0) {
        {
          std::lock_guard lock(mutex);
          --in_flight;
        }
        slot_free.notify_one();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  BenchServeResult result;
  result.duration_seconds = std::chrono::duration<double>(BenchClock::now() - start).count();
  std::vector<double> ttft, tpot, itl, e2e;
  for (const Sample& sample : samples) {
    if (!sample.ok) {
      ++result.num_failed;
      if (result.errors.size() < 5) result.errors.push_back(sample.error);
      continue;
    }
    ++result.num_completed;
    result.total_prompt_tokens += sample.prompt_tokens;
    result.total_output_tokens += sample.output_tokens;
    if (sample.ttft >= 0.0) ttft.push_back(sample.ttft);
    if (sample.output_tokens > 1 && sample.ttft >= 0.0) {
      tpot.push_back((sample.e2e - sample.ttft) / static_cast<double>(sample.output_tokens - 1));
    }
    itl.insert(itl.end(), sample.gaps.begin(), sample.gaps.end());
    e2e.push_back(sample.e2e);
  }
  result.request_throughput = result.num_completed / result.duration_seconds;
  result.output_throughput =
      static_cast<double>(result.total_output_tokens) / result.duration_seconds;
  result.ttft_ms = summarize(ttft);
  result.tpot_ms = summarize(tpot);
  result.itl_ms = summarize(itl);
  result.e2e_ms = summarize(e2e);
  return result;
}

std::string format_bench_serve(const BenchServeOptions& options, const BenchServeResult& result) {
  std::string out =
      fmt::format("bench serve: {} {} requests to {} ({}), input {} words, output {} tokens\n",
                  options.num_requests,
                  options.rate > 0.0 ? fmt::format("Poisson at {:.2f}/s", options.rate)
                                     : std::string("all at once"),
                  options.url, options.endpoint, options.input_len, options.output_len);
  out += fmt::format("  completed {}  failed {}  duration {:.2f} s\n", result.num_completed,
                     result.num_failed, result.duration_seconds);
  out += fmt::format(
      "  request throughput {:.2f} req/s  output throughput {:.1f} tok/s  "
      "(prompt tokens {}, output tokens {})\n",
      result.request_throughput, result.output_throughput, result.total_prompt_tokens,
      result.total_output_tokens);
  out += fmt::format("  {:<10} {:>10} {:>10} {:>10} {:>10}\n", "ms", "mean", "p50", "p90", "p99");
  const auto row = [&](const char* name, const LatencySummary& summary) {
    out += fmt::format("  {:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, summary.mean,
                       summary.p50, summary.p90, summary.p99);
  };
  row("TTFT", result.ttft_ms);
  row("TPOT", result.tpot_ms);
  row("ITL", result.itl_ms);
  row("E2E", result.e2e_ms);
  for (const std::string& error : result.errors) out += "  error: " + error + "\n";
  return out;
}

std::string bench_serve_json(const BenchServeOptions& options, const BenchServeResult& result) {
  const auto summary = [](const LatencySummary& s) {
    return Json{{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
  };
  const Json json = {{"url", options.url},
                     {"endpoint", options.endpoint},
                     {"requests", options.num_requests},
                     {"rate", options.rate},
                     {"input_len", options.input_len},
                     {"output_len", options.output_len},
                     {"completed", result.num_completed},
                     {"failed", result.num_failed},
                     {"duration_s", result.duration_seconds},
                     {"prompt_tokens", result.total_prompt_tokens},
                     {"output_tokens", result.total_output_tokens},
                     {"request_throughput", result.request_throughput},
                     {"output_throughput", result.output_throughput},
                     {"ttft_ms", summary(result.ttft_ms)},
                     {"tpot_ms", summary(result.tpot_ms)},
                     {"itl_ms", summary(result.itl_ms)},
                     {"e2e_ms", summary(result.e2e_ms)},
                     {"errors", result.errors}};
  return json.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace pagedattn::server
