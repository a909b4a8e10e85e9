// The throughput benchmark's run (see run.h).
#include "tools/bench/throughput/run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "core/check.h"
#include "pagedattn/linear.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void TimedRunner::forward(const engine::StepPlan& plan, std::span<float> logits) {
  const auto start = Clock::now();
  inner_.forward(plan, logits);
  record(shape_of(plan), seconds_since(start));
}

void TimedRunner::forward_sampled(const engine::StepPlan& plan,
                                  std::span<const ops::RowSampling> sampling,
                                  std::span<float> logits, std::span<ops::SampledToken> sampled) {
  const auto start = Clock::now();
  inner_.forward_sampled(plan, sampling, logits, sampled);
  record(shape_of(plan), seconds_since(start));
}

void TimedRunner::launch(const engine::StepPlan& plan, std::span<const ops::RowSampling> sampling) {
  const auto start = Clock::now();
  inner_.launch(plan, sampling);
  launched_.emplace_back(shape_of(plan), seconds_since(start));
}

void TimedRunner::collect(std::span<ops::SampledToken> sampled) {
  const auto start = Clock::now();
  inner_.collect(sampled);
  PA_CHECK(!launched_.empty(), "bench: collect without a launch");
  const auto [shape, launch_s] = launched_.front();
  launched_.pop_front();
  record(shape, launch_s + seconds_since(start));
}

void TimedRunner::record(const StepShape& shape, double seconds) {
  StepRecord record{shape, seconds, 0};
  if (model_ != nullptr) {
    if (const auto timing = model_->last_device_timing()) {
      record.device_span_s = timing->span_seconds;
      record.device_gap_s = timing->gap_seconds;
      record.graph = timing->graph;
    }
  }
  records.push_back(record);
}

RunResult run_requests(engine::Engine& engine, TimedRunner& runner, WorkloadRequests requests,
                       double temperature) {
  const int64_t n = static_cast<int64_t>(requests.prompts.size());
  engine::SamplingParams params;
  params.temperature = temperature;
  params.ignore_eos = true;
  std::vector<engine::Engine::Handle> handles;
  handles.reserve(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const size_t i = static_cast<size_t>(r);
    params.max_tokens = requests.output_lens[i];
    try {
      engine::validate(params, static_cast<int64_t>(requests.prompts[i].size()), engine.limits());
    } catch (const Error& error) {
      PA_FAIL("bench throughput: request {}: {}", r, error.what());
    }
    handles.push_back(engine.add_request(std::move(requests.prompts[i]), params));
  }

  // On a terminal, a progress line rewritten in place; elsewhere (a log) a line every tenth.
  const bool terminal = stderr_is_terminal();
  Progress progress(n, terminal);
  const int64_t log_every = std::max<int64_t>(1, n / 10);
  int64_t finished = 0;
  const double cpu_start = process_cpu_seconds();
  const double busy_start = machine_busy_seconds();
  const auto start = Clock::now();
  while (engine.has_work()) {
    const auto step_start = Clock::now();
    const size_t before = runner.records.size();
    engine.step();
    if (runner.records.size() > before) runner.records.back().step_s = seconds_since(step_start);
    const engine::EngineStats stats = engine.stats();
    for (; finished < stats.num_finished; ++finished) {
      const double elapsed = seconds_since(start);
      const std::string label =
          fmt::format("requests done, step {}, {:.0f} output tok/s, {:.0f} s", stats.num_steps,
                      static_cast<double>(stats.num_generated_tokens) / elapsed, elapsed);
      progress.step(label);
      if (!terminal && ((finished + 1) % log_every == 0 || finished + 1 == n)) {
        fmt::print(stderr, "[{}/{}] {}\n", finished + 1, n, label);
      }
    }
  }
  RunResult result;
  result.wall_s = seconds_since(start);
  result.cpu_s = process_cpu_seconds() - cpu_start;
  const double busy_end = machine_busy_seconds();
  if (busy_start >= 0 && busy_end >= 0) {
    result.other_cores = std::max(0.0, busy_end - busy_start - result.cpu_s) / result.wall_s;
  }
  result.stats = engine.stats();
  result.steps = std::move(runner.records);

  // Every request back with exactly its output length.
  for (int64_t r = 0; r < n; ++r) {
    int64_t tokens = 0, prompt = 0;
    engine::FinishReason reason = engine::FinishReason::kNone;
    std::string error;
    while (auto event = handles[static_cast<size_t>(r)].stream->try_pop()) {
      if (!event->token_ids.empty() && tokens == 0) prompt = event->num_prompt_tokens;
      tokens += static_cast<int64_t>(event->token_ids.size());
      if (event->finished()) {
        reason = event->finish_reason;
        error = event->error;
      }
    }
    const int32_t expected = requests.output_lens[static_cast<size_t>(r)];
    PA_CHECK(reason == engine::FinishReason::kLength && tokens == expected,
             "bench throughput: request {} finished ({}) with {} of its {} output tokens{}", r,
             engine::to_string(reason), tokens, expected, error.empty() ? "" : ": " + error);
    result.prompt_tokens += prompt;
    result.output_tokens += tokens;
  }
  PA_CHECK(result.prompt_tokens == requests.prompt_tokens &&
               result.output_tokens == requests.output_tokens,
           "bench throughput: {} prompt / {} output tokens came back, the workload has {} / {}",
           result.prompt_tokens, result.output_tokens, requests.prompt_tokens,
           requests.output_tokens);
  return result;
}

GemmCeiling measure_gemm_ceiling(double min_time) {
  GemmCeiling ceiling;
  std::vector<float> w(static_cast<size_t>(ceiling.n * ceiling.k), 0.01f);
  std::vector<float> x(static_cast<size_t>(ceiling.m * ceiling.k), 0.5f);
  std::vector<float> y(static_cast<size_t>(ceiling.m * ceiling.n));
  const std::vector<ops::LinearPart> parts = {
      {TensorView::contiguous(w.data(), DType::kF32, {ceiling.n, ceiling.k}), {}}};
  const ops::Linear linear("gemm ceiling", parts);
  const TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {ceiling.m, ceiling.k});
  const TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {ceiling.m, ceiling.n});
  TimingOptions timing;
  timing.min_sample_seconds = 0;
  timing.min_total_seconds = min_time;
  timing.min_samples = 7;
  const double ns = median_ns_per_call(
      [&] {
        linear.forward(xv, yv);
        keep(y.data());
      },
      timing);
  ceiling.gflops = 2.0 * static_cast<double>(ceiling.m * ceiling.n * ceiling.k) / ns;
  return ceiling;
}

}  // namespace pagedattn::tools
