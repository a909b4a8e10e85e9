// One engine step as the throughput benchmark measures it, and the GPU's idle time over a run
// computed from those records (plain arithmetic, unit-tested apart from the run).
#pragma once

#include <span>

#include "tools/bench/throughput/roofline.h"

namespace pagedattn::tools {

// One engine step as measured.
struct StepRecord {
  StepShape shape;
  double forward_s = 0;  // the runner's forward
  double step_s = 0;     // Engine::step: schedule + forward + sampling, stop checks, events
  // On a CUDA model (Model::last_device_timing): the forward's device span and the device's idle
  // gap before it; < 0 where unknown (the CPU, the first step).
  double device_span_s = -1;
  double device_gap_s = -1;
  bool graph = false;  // the forward replayed a CUDA graph (decode steps; ModelOptions)
};

// The GPU's idle time over a run, from the steps' device timing (StepRecord::device_*):
//   between_steps   the gaps' sum over the wall time (the first step's gap is unknown: left out);
//   steady_decode   over decode-only steps that follow a decode-only step: sum of gaps / sum of
//                   (gap + span), the fraction issue 16 bounds; with its step count and the
//                   median gap. All 0 when no step has device timing (the CPU);
//   graph_steps     the steps that replayed a CUDA graph, of decode_steps decode-only steps.
struct GpuIdle {
  double between_steps = 0;
  double steady_decode = 0;
  int64_t steady_decode_steps = 0;
  double steady_decode_gap_ms = 0;
  int64_t graph_steps = 0, decode_steps = 0;
};
GpuIdle gpu_idle(std::span<const StepRecord> steps, double wall_s);

}  // namespace pagedattn::tools
