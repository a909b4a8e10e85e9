// summarize_decode_trace (decode_trace_summary.h).
#include "tools/bench/decode_trace_summary.h"

#include <algorithm>
#include <cstddef>

namespace pagedattn::tools {
namespace {

constexpr int kMetadata = 1;  // DecodeTrace::kPhaseNames: a CTA that reached it had a work item
constexpr int kEnd = cuda::DecodeTrace::kPhases - 1;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

DecodeTraceSummary summarize_decode_trace(const cuda::DecodeTrace& trace) {
  constexpr int kPhases = cuda::DecodeTrace::kPhases;
  DecodeTraceSummary summary;
  const auto at = [&](int32_t layer, int64_t cta, int phase) {
    return trace.stamps[static_cast<size_t>((layer * trace.ctas + cta) * kPhases + phase)];
  };
  // The last end of each layer (0 where no CTA of it ran).
  std::vector<uint64_t> last_end(static_cast<size_t>(trace.layers), 0);
  std::vector<double> working, idle;
  for (int32_t layer = 0; layer < trace.layers; ++layer) {
    int64_t work = 0, none = 0;
    for (int64_t cta = 0; cta < trace.ctas; ++cta) {
      last_end[layer] = std::max(last_end[layer], at(layer, cta, kEnd));
      if (at(layer, cta, kMetadata) != 0) {
        ++work;
      } else if (at(layer, cta, kEnd) != 0) {
        ++none;
      }
    }
    working.push_back(static_cast<double>(work));
    idle.push_back(static_cast<double>(none));
  }
  summary.working_ctas = static_cast<int64_t>(median(working));
  summary.idle_ctas = static_cast<int64_t>(median(idle));
  std::vector<std::vector<double>> first(kPhases), mid(kPhases), last(kPhases), count(kPhases);
  std::vector<double> spans;
  for (int32_t layer = 1; layer < trace.layers; ++layer) {
    const uint64_t ref = last_end[layer - 1];
    if (ref == 0 || last_end[layer] == 0) continue;
    spans.push_back(static_cast<double>(last_end[layer] - ref) / 1e3);
    ++summary.layers;
    for (int phase = 0; phase < kPhases; ++phase) {
      std::vector<double> values;
      for (int64_t cta = 0; cta < trace.ctas; ++cta) {
        const uint64_t stamp = at(layer, cta, phase);
        if (at(layer, cta, kMetadata) == 0 || stamp == 0) continue;
        values.push_back((static_cast<double>(stamp) - static_cast<double>(ref)) / 1e3);
      }
      count[phase].push_back(static_cast<double>(values.size()));
      if (values.empty()) continue;
      first[phase].push_back(*std::min_element(values.begin(), values.end()));
      last[phase].push_back(*std::max_element(values.begin(), values.end()));
      mid[phase].push_back(median(values));
    }
  }
  summary.layer_us = median(spans);
  for (int phase = 0; phase < kPhases; ++phase) {
    summary.phases.push_back({cuda::DecodeTrace::kPhaseNames[phase], median(first[phase]),
                              median(mid[phase]), median(last[phase]),
                              static_cast<int64_t>(median(count[phase]))});
  }
  return summary;
}

}  // namespace pagedattn::tools
