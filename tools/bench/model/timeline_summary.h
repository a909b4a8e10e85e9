// `bench model --timeline`'s table (cmd_bench_model.cpp), apart from the model so that
// test_tools checks it: the timelines of several calls of one step (Model::last_timeline, a
// stretch per probe, a label once per layer) summarised per label.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/model.h"

namespace pagedattn::tools {

struct TimelineStretch {
  std::string label;
  int64_t per_step = 0;  // occurrences in a step (the last step that has the label)
  double seconds = 0;    // the median over the steps of the label's time summed over the step
};

struct TimelineSummary {
  std::vector<TimelineStretch> stretches;  // in the order labels first appear
  double step_seconds = 0;                 // the median over the steps of all stretches' sum
};

// Steps without a label count 0 seconds for it. Medians of an even count: the mean of the
// middle two. No steps: an empty summary.
TimelineSummary summarize_timeline(
    const std::vector<std::vector<model::Model::TimelineSpan>>& steps);

}  // namespace pagedattn::tools
