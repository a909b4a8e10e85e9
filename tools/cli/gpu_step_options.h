// The GPU step flags that generate, serve, bench throughput and bench model share, declared and
// applied in one place: CUDA graphs off (vLLM's --enforce-eager) and overlap scheduling off
// (SGLang's --disable-overlap-schedule).
#pragma once

#include <CLI/CLI.hpp>

#include "pagedattn/engine.h"
#include "pagedattn/engine_runtime.h"

namespace pagedattn::tools {

struct GpuStepOptions {
  bool enforce_eager = false;  // no CUDA graphs (ModelOptions::cuda_graph_max_batch 0)
  bool no_overlap = false;     // EngineConfig::overlap false

  void apply(engine::RuntimeOptions& runtime) const {
    if (enforce_eager) runtime.model.cuda_graph_max_batch = 0;
  }
  void apply(engine::EngineConfig& engine) const {
    if (no_overlap) engine.overlap = false;
  }
};

// --enforce-eager, and --disable-overlap-schedule for a command that runs the engine (`engine`).
inline void add_gpu_step_options(CLI::App& cmd, GpuStepOptions& options, bool engine = true) {
  cmd.add_flag("--enforce-eager", options.enforce_eager,
               "On a GPU: launch every decode step kernel by kernel (no CUDA graphs)");
  if (engine) {
    cmd.add_flag("--disable-overlap-schedule", options.no_overlap,
                 "On a GPU: run each step to its end before scheduling the next (no overlap "
                 "scheduling)");
  }
}

}  // namespace pagedattn::tools
