// gpu_idle (step_record.h).
#include "tools/bench/throughput/step_record.h"

#include <algorithm>
#include <vector>

namespace pagedattn::tools {

GpuIdle gpu_idle(std::span<const StepRecord> steps, double wall_s) {
  GpuIdle idle;
  double gaps = 0, steady_gaps = 0, steady_total = 0;
  std::vector<double> steady_gap_ms;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& step = steps[i];
    idle.graph_steps += step.graph ? 1 : 0;
    idle.decode_steps += step.shape.decode_only() ? 1 : 0;
    if (step.device_gap_s < 0) continue;
    gaps += step.device_gap_s;
    if (i > 0 && step.shape.decode_only() && steps[i - 1].shape.decode_only() &&
        step.device_span_s >= 0) {
      steady_gaps += step.device_gap_s;
      steady_total += step.device_gap_s + step.device_span_s;
      steady_gap_ms.push_back(step.device_gap_s * 1e3);
    }
  }
  if (wall_s > 0) idle.between_steps = gaps / wall_s;
  if (steady_total > 0) idle.steady_decode = steady_gaps / steady_total;
  idle.steady_decode_steps = static_cast<int64_t>(steady_gap_ms.size());
  if (!steady_gap_ms.empty()) {
    std::sort(steady_gap_ms.begin(), steady_gap_ms.end());
    const size_t n = steady_gap_ms.size();
    idle.steady_decode_gap_ms =
        n % 2 ? steady_gap_ms[n / 2] : 0.5 * (steady_gap_ms[n / 2 - 1] + steady_gap_ms[n / 2]);
  }
  return idle;
}

}  // namespace pagedattn::tools
