#include "tools/bench/model/timeline_summary.h"

#include <algorithm>
#include <map>

namespace pagedattn::tools {
namespace {

double middle(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t half = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(half), v.end());
  const double upper = v[half];
  if (v.size() % 2 == 1) return upper;
  return 0.5 *
         (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(half)) + upper);
}

}  // namespace

TimelineSummary summarize_timeline(
    const std::vector<std::vector<model::Model::TimelineSpan>>& steps) {
  TimelineSummary summary;
  std::map<std::string, size_t> index;         // label -> its stretch
  std::vector<std::vector<double>> per_label;  // [stretch][step] seconds
  std::vector<double> totals;
  for (size_t s = 0; s < steps.size(); ++s) {
    double total = 0;
    for (const model::Model::TimelineSpan& span : steps[s]) {
      const auto [it, added] = index.emplace(span.label, summary.stretches.size());
      if (added) {
        summary.stretches.push_back({span.label, 0, 0});
        per_label.emplace_back(steps.size(), 0.0);
      }
      per_label[it->second][s] += span.seconds;
      total += span.seconds;
    }
    totals.push_back(total);
    std::map<size_t, int64_t> count;
    for (const model::Model::TimelineSpan& span : steps[s]) ++count[index.at(span.label)];
    for (const auto& [stretch, n] : count) summary.stretches[stretch].per_step = n;
  }
  for (size_t i = 0; i < summary.stretches.size(); ++i) {
    summary.stretches[i].seconds = middle(per_label[i]);
  }
  summary.step_seconds = middle(totals);
  return summary;
}

}  // namespace pagedattn::tools
