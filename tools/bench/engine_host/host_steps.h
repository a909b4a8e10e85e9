// `bench engine-host`'s per-step records and their summary (plain arithmetic, unit-tested apart
// from the runs): each engine step's host time split into the engine's phases (EngineStats'
// timers, read after every step) and the whole Engine::step call as the caller times it; medians,
// 90th percentiles and means over a scenario's steps; the GPU idle fraction a host time causes
// beside a device step when the two do not overlap.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::tools {

// One engine step, in seconds.
struct HostStep {
  double schedule_s = 0;  // inbox, scheduling decisions, pages (EngineStats::schedule_seconds)
  double plan_s = 0;      // the step's token ids and block tables, the runner's sampling rows
  double runner_s = 0;    // the runner's call (forward_seconds)
  double post_s = 0;      // cache offers, sampling, stop checks, events (sample_seconds)
  double step_s = 0;      // the whole Engine::step call
  int32_t sequences = 0;  // scheduled sequences
  int32_t decodes = 0;    // of which single-token decodes
  int64_t tokens = 0;
  bool decode_only() const { return sequences > 0 && decodes == sequences; }
  // What the phases leave out: publishing the stats, the timers themselves.
  double other_s() const { return step_s - schedule_s - plan_s - runner_s - post_s; }
};

// The phases of the step that ran between two snapshots of the engine's stats.
HostStep host_step_between(const engine::EngineStats& before, const engine::EngineStats& after,
                           double step_s);

// Median (the mean of the two middle values for an even count), 90th percentile (nearest rank:
// the ceil(0.9 n)-th smallest) and mean; all 0 for no values.
struct Spread {
  double median = 0;
  double p90 = 0;
  double mean = 0;
};
Spread spread(std::vector<double> values);

// A scenario's steps, in microseconds per step.
struct HostSummary {
  int64_t steps = 0;
  int64_t decode_steps = 0;
  double median_sequences = 0;
  Spread schedule_us, plan_us, runner_us, post_us, other_us, step_us;
};
HostSummary summarize(std::span<const HostStep> steps);

// The fraction of the time a GPU sits idle when every device step of device_s is followed by
// host_s of host work it waits for: host / (host + device).
double idle_fraction(double host_s, double device_s);

}  // namespace pagedattn::tools
