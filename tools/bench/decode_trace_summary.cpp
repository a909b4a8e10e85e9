// summarize_decode_trace (decode_trace_summary.h).
#include "tools/bench/decode_trace_summary.h"

#include <algorithm>
#include <cstddef>

namespace pagedattn::tools {
namespace {

constexpr int kStart = 0;
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
  // The SM clock: cycles over ns of each working CTA that lived long enough for the global
  // timer's steps (0.26 us on an H100) to matter little.
  std::vector<double> rates;
  const bool clocks = trace.sm_clocks.size() == static_cast<size_t>(trace.layers * trace.ctas) * 2;
  for (int32_t layer = 1; clocks && layer < trace.layers; ++layer) {
    for (int64_t cta = 0; cta < trace.ctas; ++cta) {
      const uint64_t start = at(layer, cta, kStart), end = at(layer, cta, kEnd);
      const size_t clock = static_cast<size_t>(layer * trace.ctas + cta) * 2;
      const uint64_t cycles_start = trace.sm_clocks[clock], cycles_end = trace.sm_clocks[clock + 1];
      if (at(layer, cta, kMetadata) == 0 || start == 0 || end < start + 2000 ||
          cycles_end <= cycles_start) {
        continue;
      }
      rates.push_back(static_cast<double>(cycles_end - cycles_start) /
                      static_cast<double>(end - start));
    }
  }
  summary.sm_clock_ghz = median(rates);
  for (int phase = 0; phase < kPhases; ++phase) {
    summary.phases.push_back({cuda::DecodeTrace::kPhaseNames[phase], median(first[phase]),
                              median(mid[phase]), median(last[phase]),
                              static_cast<int64_t>(median(count[phase]))});
  }
  return summary;
}

}  // namespace pagedattn::tools
