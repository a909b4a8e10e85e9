// `bench model --timeline`'s summary (tools/bench/model/timeline_summary.h) on made-up timelines:
// each label's time summed within a step and its median over the steps (0 where a step lacks
// it), its count per step, the labels in the order they first appear, and the median of the
// steps' totals; computed here by hand.
#ifdef PAGEDATTN_TEST_THROUGHPUT

#include "tools/bench/model/timeline_summary.h"

#include <gtest/gtest.h>

namespace pagedattn::tools {
namespace {

using Span = model::Model::TimelineSpan;

TEST(TimelineSummary, MediansPerLabelOverSteps) {
  const double us = 1e-6;
  // Three steps of two layers ("a", "b" a layer) and a head ("c"); "d" only in the second.
  const std::vector<std::vector<Span>> steps = {
      {{"a", 1 * us}, {"b", 2 * us}, {"a", 1 * us}, {"b", 2 * us}, {"c", 3 * us}},
      {{"a", 2 * us}, {"b", 2 * us}, {"a", 2 * us}, {"b", 2 * us}, {"c", 1 * us}, {"d", 5 * us}},
      {{"a", 1.5 * us}, {"b", 4 * us}, {"a", 1.5 * us}, {"b", 6 * us}, {"c", 2 * us}},
  };
  const TimelineSummary summary = summarize_timeline(steps);
  ASSERT_EQ(summary.stretches.size(), 4U);
  const struct {
    const char* label;
    int64_t per_step;
    double us;
  } want[] = {
      {"a", 2, 3.0},  // per-step sums 2, 4, 3
      {"b", 2, 4.0},  // 4, 4, 10
      {"c", 1, 2.0},  // 3, 1, 2
      {"d", 1, 0.0},  // 0, 5, 0
  };
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(want[i].label);
    EXPECT_EQ(summary.stretches[i].label, want[i].label);
    EXPECT_EQ(summary.stretches[i].per_step, want[i].per_step);
    EXPECT_NEAR(summary.stretches[i].seconds, want[i].us * us, 1e-12);
  }
  // Totals 9, 14, 15.
  EXPECT_NEAR(summary.step_seconds, 14 * us, 1e-12);
}

TEST(TimelineSummary, EvenCountsTakeTheMeanOfTheMiddleTwo) {
  const std::vector<std::vector<Span>> steps = {
      {{"x", 4.0}}, {{"x", 1.0}}, {{"x", 3.0}}, {{"x", 2.0}}};
  const TimelineSummary summary = summarize_timeline(steps);
  ASSERT_EQ(summary.stretches.size(), 1U);
  EXPECT_DOUBLE_EQ(summary.stretches[0].seconds, 2.5);
  EXPECT_DOUBLE_EQ(summary.step_seconds, 2.5);
}

TEST(TimelineSummary, NoStepsNoStretches) {
  EXPECT_TRUE(summarize_timeline({}).stretches.empty());
  EXPECT_EQ(summarize_timeline({}).step_seconds, 0.0);
  const TimelineSummary empty_steps = summarize_timeline({{}, {}});
  EXPECT_TRUE(empty_steps.stretches.empty());
  EXPECT_EQ(empty_steps.step_seconds, 0.0);
}

}  // namespace
}  // namespace pagedattn::tools

#endif  // PAGEDATTN_TEST_THROUGHPUT
