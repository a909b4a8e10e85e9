// Helpers of the CPU backend tests: run one generated case (tests/common/cases.h) through the
// backend with poisoned outputs and compare every output and lse element with the float64
// reference (tests/reference).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/cases.h"

namespace pagedattn::testing {

struct RunOptions {
  int32_t threads = 0;  // 0: the backend's own workspace; > 0: a workspace for this many threads
                        // without the work-based thread cap (forces the split-KV path on small
                        // cases)
  // The path the test means, asserted through cpu::planned_kv_chunks(): > 0, the plan must split
  // some request's KV into at least this many chunks; -1, it must split none.
  int32_t min_kv_chunks = 0;
};

// Outputs of one run, as doubles (row-major), for cross-run comparisons.
struct RunOutputs {
  std::vector<double> out;
  std::vector<double> lse;
};

// Runs `spec` with `seed` on the cpu backend; returns "" when every element matches the
// reference, else a report (naming the seed). Fills `outputs` when given.
std::string run_and_check(const CaseSpec& spec, uint64_t seed, const RunOptions& options = {},
                          RunOutputs* outputs = nullptr);

// Runs the case's op on the cpu backend (plan + run) with the case's own buffers; returns the
// plan's KV chunks (cpu::planned_kv_chunks: 1 = no split).
int32_t run_cpu(const AttentionCase& c, int32_t threads = 0);

// Runs `spec` with attention page sizes 1, 16 and 64 on one seed (the same logical KV); returns ""
// when every run matches the reference and its outputs and lse (when the case has lse) match the
// P = 1 run's, else the reports.
std::string check_page_size_invariance(CaseSpec spec, uint64_t seed);

// Readable test names for parametrized cases: "<index>_<case name>".
std::string case_name(const ::testing::TestParamInfo<CaseSpec>& info);

// GoogleTest prints a parameter with its readable name.
inline void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.name(); }

// True when every byte of the view still holds the poison pattern (0xFF).
bool still_poisoned(const TensorView& view);

}  // namespace pagedattn::testing
