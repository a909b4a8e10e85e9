// The hook through which `pagedattn bench decode|prefill|mla --device cuda` reaches the CUDA
// backend. bench_attention.cpp defines a weak default that reports "not available"; the CUDA
// build overrides it with a strong definition (e.g. in tools/bench/cuda/bench_cuda.cpp, compiled
// only when PAGEDATTN_WITH_CUDA) without touching the benchmark driver.
//
// Contract for an implementation: build the case on the host (testing::AttentionCase(spec,
// seed)), copy it to the device, plan once, then time run_* only (the median of repeated samples,
// at least timing.min_total_seconds of work), and measure the device's memory bandwidth in the
// same run (e.g. a large device-to-device read), so that the driver can print the ratio.
#pragma once

#include <cstdint>
#include <string>

#include "common/cases.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {

struct CudaBenchResult {
  bool available = false;
  std::string note;                 // why not, when unavailable; else e.g. the device's name
  double median_ns = 0;             // one run_* call, plan excluded
  double device_bandwidth_gbs = 0;  // the device's memory bandwidth measured in the same run
};

CudaBenchResult bench_attention_cuda(const testing::CaseSpec& spec, uint64_t seed,
                                     const TimingOptions& timing);

}  // namespace pagedattn::tools
