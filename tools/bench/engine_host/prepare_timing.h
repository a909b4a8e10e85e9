// The model's host planning of a decode step, timed on the CPU for `bench engine-host`:
// StepPlanner::prepare (src/model/forward_step.h), called directly, as a CUDA model calls it
// before every forward: validation of the requests and of the step's sampling rows, the block
// tables copied into one [B, max_blocks] table, token ids, positions and KV slots, the host
// planner's CSR metadata (planner.h), then the backend's plan. Here the backend is the CPU one;
// its plan (a work partition on the host) is timed alone too, since a CUDA model runs that part
// on the device (a kernel launch) and a device upload instead.
//
// The step: B requests of one new token at `context` tokens, each with its own block table of
// ceil(context / page_size) pages and a sampling row (temperature 0.6), as the engine hands a
// GPU model a decode step. The pool has the shape's KV heads and head dim but one layer and at
// most 4096 pages (the planner reads page ids, never the pages; ids wrap around the pool).
#pragma once

#include <cstdint>

#include "pagedattn/model_config.h"
#include "tools/bench/engine_host/host_steps.h"

namespace pagedattn::tools {

struct PrepareTiming {
  int32_t batch = 0;
  int64_t context = 0;
  int64_t calls = 0;
  Spread prepare_us;       // StepPlanner::prepare, whole
  Spread backend_plan_us;  // of which the CPU backend's Backend::plan
};

// Times prepare() per call until `min_seconds` have passed and at least 100 calls were made.
PrepareTiming time_prepare(const model::ModelConfig& config, int32_t batch, int64_t context,
                           int32_t page_size, double min_seconds);

}  // namespace pagedattn::tools
