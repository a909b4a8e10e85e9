// `bench engine-host`'s step records and summaries (see host_steps.h).
#include "tools/bench/engine_host/host_steps.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pagedattn::tools {

HostStep host_step_between(const engine::EngineStats& before, const engine::EngineStats& after,
                           double step_s) {
  HostStep step;
  step.schedule_s = after.schedule_seconds - before.schedule_seconds;
  step.plan_s = after.plan_seconds - before.plan_seconds;
  step.runner_s = after.forward_seconds - before.forward_seconds;
  step.post_s = after.sample_seconds - before.sample_seconds;
  step.step_s = step_s;
  step.tokens = after.num_computed_tokens - before.num_computed_tokens;
  return step;
}

Spread spread(std::vector<double> values) {
  Spread result;
  if (values.empty()) return result;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  result.median = n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  const auto rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n)));
  result.p90 = values[std::max<size_t>(rank, 1) - 1];
  result.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(n);
  return result;
}

HostSummary summarize(std::span<const HostStep> steps) {
  HostSummary summary;
  summary.steps = static_cast<int64_t>(steps.size());
  std::vector<double> schedule, plan, runner, post, other, step, sequences;
  for (const HostStep& s : steps) {
    schedule.push_back(s.schedule_s * 1e6);
    plan.push_back(s.plan_s * 1e6);
    runner.push_back(s.runner_s * 1e6);
    post.push_back(s.post_s * 1e6);
    other.push_back(s.other_s() * 1e6);
    step.push_back(s.step_s * 1e6);
    sequences.push_back(s.sequences);
    summary.decode_steps += s.decode_only() ? 1 : 0;
  }
  summary.schedule_us = spread(std::move(schedule));
  summary.plan_us = spread(std::move(plan));
  summary.runner_us = spread(std::move(runner));
  summary.post_us = spread(std::move(post));
  summary.other_us = spread(std::move(other));
  summary.step_us = spread(std::move(step));
  summary.median_sequences = spread(std::move(sequences)).median;
  return summary;
}

double idle_fraction(double host_s, double device_s) {
  const double total = host_s + device_s;
  return total > 0 ? host_s / total : 0.0;
}

}  // namespace pagedattn::tools
