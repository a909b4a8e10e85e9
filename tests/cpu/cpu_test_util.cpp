// Helpers of the CPU backend tests (see cpu_test_util.h).
#include "cpu/cpu_test_util.h"

#include <fmt/format.h>

#include <cstring>

#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_plan.h"
#include "reference/reference.h"

namespace pagedattn::testing {

int32_t run_cpu(const AttentionCase& c, int32_t threads) {
  static const std::unique_ptr<Backend> backend = cpu::make_backend();
  WorkspaceLimits limits;
  limits.max_qo_rows = std::max<int64_t>(1024, c.num_rows());
  limits.max_batch = std::max<int32_t>(64, c.batch_size());
  std::unique_ptr<Workspace> workspace =
      threads > 0 ? std::make_unique<cpu::CpuWorkspace>(limits, threads, 1)
                  : backend->create_workspace(limits);
  backend->plan(*workspace, c.op_desc(), c.meta());
  switch (c.spec().op) {
    case OpKind::kDecode:
      backend->run_decode(*workspace, c.decode_args());
      break;
    case OpKind::kPrefill:
      backend->run_prefill(*workspace, c.prefill_args());
      break;
    case OpKind::kMlaDecode:
    case OpKind::kMlaExtend:
      backend->run_mla(*workspace, c.mla_args());
      break;
  }
  return cpu::planned_kv_chunks(dynamic_cast<const cpu::CpuWorkspace&>(*workspace));
}

std::string run_and_check(const CaseSpec& spec, uint64_t seed, const RunOptions& options,
                          RunOutputs* outputs) {
  const AttentionCase c(spec, seed);
  poison(c.out());
  if (c.lse().defined()) poison(c.lse());
  const int32_t chunks = run_cpu(c, options.threads);
  std::vector<double> expected_lse;
  const std::vector<double> expected = c.reference(&expected_lse);
  const std::vector<double> got = to_doubles(c.out());
  std::string report =
      compare_rows(got, expected, spec.head_dim_vo, row_tolerance_for(spec.q_dtype), "out");
  std::vector<double> got_lse;
  if (c.lse().defined()) {
    got_lse = to_doubles(c.lse());
    const std::string lse_report = compare(got_lse, expected_lse, kLseTolerance, "lse");
    if (!lse_report.empty()) report += (report.empty() ? "" : "\n") + lse_report;
  }
  if (options.min_kv_chunks > 0 && chunks < options.min_kv_chunks) {
    report += fmt::format("{}path: the plan split the KV into {} chunks, the test means >= {}",
                          report.empty() ? "" : "\n", chunks, options.min_kv_chunks);
  }
  if (options.min_kv_chunks < 0 && chunks > 1) {
    report += fmt::format("{}path: the plan split the KV into {} chunks, the test means no split",
                          report.empty() ? "" : "\n", chunks);
  }
  if (outputs) *outputs = {got, got_lse};
  if (report.empty()) return report;
  return fmt::format("{} (seed {}; PAGEDATTN_TEST_SEED={} reproduces)\n{}", spec.name(), seed, seed,
                     report);
}

bool still_poisoned(const TensorView& view) {
  const std::vector<double> values = to_doubles(view);
  for (double v : values) {
    if (v == v) return false;  // not NaN: something wrote here
  }
  // NaN is also what a kernel could write; check the exact 0xFF bytes of contiguous views.
  if (view.is_contiguous()) {
    const auto* bytes = static_cast<const unsigned char*>(view.data);
    const int64_t n = view.numel() * dtype_size(view.dtype);
    for (int64_t i = 0; i < n; ++i) {
      if (bytes[i] != 0xff) return false;
    }
  }
  return true;
}

std::string check_page_size_invariance(CaseSpec spec, uint64_t seed) {
  RunOutputs first;
  for (int32_t page : {1, 16, 64}) {
    spec.page_size = page;
    RunOutputs outputs;
    if (std::string report = run_and_check(spec, seed, {}, &outputs); !report.empty()) {
      return fmt::format("P {}: {}", page, report);
    }
    if (page == 1) {
      first = outputs;
      continue;
    }
    std::string report = compare_rows(outputs.out, first.out, spec.head_dim_vo,
                                      row_tolerance_for(spec.q_dtype), "out vs P=1");
    if (spec.with_lse) report += compare(outputs.lse, first.lse, kLseTolerance, "lse vs P=1");
    if (!report.empty()) return fmt::format("P {} (seed {}): {}", page, seed, report);
  }
  return "";
}

std::string case_name(const ::testing::TestParamInfo<CaseSpec>& info) {
  return fmt::format("{}_{}", info.index, info.param.name());
}

}  // namespace pagedattn::testing
