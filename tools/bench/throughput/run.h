// The throughput benchmark's run: every request of the workload queued at once, then Engine::step
// until all have finished, each step timed (the whole step, and the model's forward inside it
// through a ModelRunner wrapper), a progress line as requests finish; then every request checked
// to have come back with exactly its output length. Also the compute ceiling the roofline uses.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "tools/bench/throughput/roofline.h"
#include "tools/bench/throughput/step_record.h"
#include "tools/bench/throughput/workload.h"

namespace pagedattn::tools {

// The runtime under the engine, timed: records each step's shape and forward time.
class TimedRunner final : public engine::ModelRunner {
 public:
  // `model`: the Model under `inner`, asked for its device timing after each forward (or null).
  TimedRunner(engine::ModelRunner& inner, const model::Model* model)
      : inner_(inner), model_(model) {}
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  void forward(const engine::StepPlan& plan, std::span<float> logits) override;
  bool prefers_model_sampling() const override { return inner_.prefers_model_sampling(); }
  void forward_sampled(const engine::StepPlan& plan, std::span<const ops::RowSampling> sampling,
                       std::span<float> logits, std::span<ops::SampledToken> sampled) override;
  // Overlap scheduling: a step is recorded when collected (its device timing is then known), its
  // forward time being its launch's plus its collect's.
  bool supports_overlap() const override { return inner_.supports_overlap(); }
  void launch(const engine::StepPlan& plan, std::span<const ops::RowSampling> sampling) override;
  void collect(std::span<ops::SampledToken> sampled) override;
  std::vector<StepRecord> records;

 private:
  void record(const StepShape& shape, double seconds);
  engine::ModelRunner& inner_;
  const model::Model* model_ = nullptr;
  std::deque<std::pair<StepShape, double>> launched_;  // shape and launch time, oldest first
};

struct RunResult {
  double wall_s = 0;
  double cpu_s = 0;  // the process's user + system CPU time over the run (getrusage)
  // CPU time of every other process over the run (/proc/stat's busy time less cpu_s), in cores:
  // > 0.1 says the machine was shared and the figures understate the code; < 0 if unknown.
  double other_cores = -1;
  int64_t prompt_tokens = 0;  // as the engine reported them back
  int64_t output_tokens = 0;
  std::vector<StepRecord> steps;
  engine::EngineStats stats;
};

// Runs `requests` (temperature, ignore_eos, max_tokens = each output length) through `engine`,
// whose runner is `runner`. Throws Error naming the request for one the engine rejects, or one
// that does not come back with exactly its output length (an error, a stop, a short pool).
RunResult run_requests(engine::Engine& engine, TimedRunner& runner, WorkloadRequests requests,
                       double temperature);

// The library's f32 GEMM path (ops::Linear over f32 weights: OpenMP tiles of single-threaded
// OpenBLAS calls) on a product large enough to run at the BLAS's best: the compute ceiling.
struct GemmCeiling {
  double gflops = 0;
  int64_t m = 512, n = 2048, k = 2048;
};
GemmCeiling measure_gemm_ceiling(double min_time);

}  // namespace pagedattn::tools
