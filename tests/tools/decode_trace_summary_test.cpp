// bench decode's table of the decode kernel's phases (tools/bench/decode_trace_summary.h) on a
// made-up trace whose figures are worked out by hand below.
#include "tools/bench/decode_trace_summary.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace pagedattn::tools {
namespace {

using Stamps = std::array<uint64_t, cuda::DecodeTrace::kPhases>;

// Three layers of three CTAs. Layer 0: CTA 0 works and ends at 5000 ns, CTA 1 finds no item, CTA
// 2 never runs. Layer 1 (after layer 0's last end, 5000): CTA 0 has steps, CTA 1 none for its warp
// 0 (no "first K/V"), CTA 2 no item; the last end is 9000. Layer 2: layer 1 shifted by 4000 ns,
// so its times after layer 1's last end (9000) are layer 1's after 5000.
cuda::DecodeTrace made_up_trace() {
  cuda::DecodeTrace trace;
  trace.layers = 3;
  trace.ctas = 3;
  const Stamps l0_work = {1000, 1100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5000};
  const Stamps l0_idle = {1000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1500};
  const Stamps l1_a = {4000, 4500, 5200, 6000, 6500, 7000, 7200, 7400, 7500, 0, 0, 8000};
  const Stamps l1_b = {4200, 4600, 5300, 6100, 6600, 0, 6700, 7400, 7600, 0, 0, 9000};
  const Stamps l1_idle = {4300, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6000};
  const Stamps none{};
  const auto shifted = [](Stamps s) {
    for (uint64_t& x : s) x = x != 0 ? x + 4000 : 0;
    return s;
  };
  for (const Stamps& cta : {l0_work, l0_idle, none, l1_a, l1_b, l1_idle, shifted(l1_a),
                            shifted(l1_b), shifted(l1_idle)}) {
    trace.stamps.insert(trace.stamps.end(), cta.begin(), cta.end());
  }
  // SM cycles at each CTA's start and end. Working CTAs of layers 1 and 2: l1_a lives 4000 ns at
  // 1.5 cycles a ns, l1_b 4800 ns at 2.0, so the median rate is 1.75 GHz. Layer 0 (not
  // summarised) and the idle CTAs (no item) run at other rates that must not count.
  trace.sm_clocks = {100, 100 + 4000 * 9,   100, 100 + 500 * 9, 0,   0,
                     0,   4000 * 3 / 2,     0,   4800 * 2,      500, 500 + 1700 * 9,
                     7,   7 + 4000 * 3 / 2, 7,   7 + 4800 * 2,  0,   1700 * 9};
  return trace;
}

TEST(DecodeTraceSummary, PhasesAfterThePreviousLayersEnd) {
  const DecodeTraceSummary s = summarize_decode_trace(made_up_trace());
  EXPECT_EQ(s.layers, 2);
  EXPECT_DOUBLE_EQ(s.layer_us, 4.0);  // 9000 - 5000, 13000 - 9000
  EXPECT_EQ(s.working_ctas, 2);       // 1, 2, 2
  EXPECT_EQ(s.idle_ctas, 1);
  EXPECT_DOUBLE_EQ(s.sm_clock_ghz, 1.75);
  ASSERT_EQ(s.phases.size(), static_cast<size_t>(cuda::DecodeTrace::kPhases));
  struct Expected {
    const char* phase;
    double first, median, last;
    int64_t ctas;
  };
  const Expected expected[] = {
      {"start", -1.0, -0.9, -0.8, 2},   {"metadata", -0.5, -0.45, -0.4, 2},
      {"page ids", 0.2, 0.25, 0.3, 2},  {"wait done", 1.0, 1.05, 1.1, 2},
      {"q loaded", 1.5, 1.55, 1.6, 2},  {"first K/V", 2.0, 2.0, 2.0, 1},
      {"loop done", 1.7, 1.95, 2.2, 2}, {"combined", 2.4, 2.4, 2.4, 2},
      {"written", 2.5, 2.55, 2.6, 2},   {"counted", 0, 0, 0, 0},
      {"merge read", 0, 0, 0, 0},       {"end", 3.0, 3.5, 4.0, 2},
  };
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const DecodePhaseRow& row = s.phases[i];
    EXPECT_EQ(row.phase, expected[i].phase);
    EXPECT_NEAR(row.first_us, expected[i].first, 1e-9) << row.phase;
    EXPECT_NEAR(row.median_us, expected[i].median, 1e-9) << row.phase;
    EXPECT_NEAR(row.last_us, expected[i].last, 1e-9) << row.phase;
    EXPECT_EQ(row.ctas, expected[i].ctas) << row.phase;
  }
}

TEST(DecodeTraceSummary, EmptyTrace) {
  const DecodeTraceSummary s = summarize_decode_trace(cuda::DecodeTrace{});
  EXPECT_EQ(s.layers, 0);
  EXPECT_EQ(s.working_ctas, 0);
  EXPECT_DOUBLE_EQ(s.layer_us, 0);
  EXPECT_EQ(s.phases.size(), static_cast<size_t>(cuda::DecodeTrace::kPhases));
}

}  // namespace
}  // namespace pagedattn::tools
