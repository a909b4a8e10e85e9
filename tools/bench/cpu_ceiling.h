// The CPU memory-read ceiling that `pagedattn bench decode|prefill|mla --device cpu` prints beside
// its KV bandwidth: a multi-threaded sequential read of a buffer much larger than the last-level
// cache, by the same OpenMP threads (team size, binding, places) that the CPU backend uses.
//
// Method (each step is there because a cheaper variant gave unstable or flattering figures):
// the buffer is written by the reading threads with the same static partition before any timing
// (page faults and first-touch NUMA placement are out of the timed passes); one untimed warm-up
// pass; then >= kMinPasses timed passes (each a whole read of the buffer, one parallel region)
// until the time budget is spent. The figure is the MEDIAN of the per-pass GB/s; the max is printed
// for reference. Size: max(2 GiB, 8 x L3) when the L3 size is known, capped at a quarter of RAM.
#pragma once

#include <cstdint>
#include <string>

namespace pagedattn::tools {

struct CpuReadCeiling {
  double median_gbs = 0;  // the ceiling: median of per-pass bandwidth
  double max_gbs = 0;     // fastest pass (reference only)
  double min_gbs = 0;     // slowest pass
  int32_t passes = 0;     // timed passes (after one warm-up)
  int64_t bytes = 0;      // buffer size
  int64_t l3_bytes = 0;   // last-level cache size as reported by the OS, 0 if unknown
  int32_t threads = 0;    // OpenMP team size of each pass
  std::string binding;    // OpenMP proc_bind and places, e.g. "proc_bind false, 16 places"
};

// Measures the ceiling (allocates, pre-faults, measures, frees). `min_time` seconds of timed
// passes (at least kMinPasses of them). `bytes` > 0 reads a buffer of that size instead of the
// default (a quick run's option: a buffer near the L3 overstates the DRAM ceiling).
inline constexpr int32_t kMinPasses = 5;
CpuReadCeiling measure_cpu_read_ceiling(double min_time, int64_t bytes = 0);

// "memory read ceiling (when): median X GB/s (max Y, min Z) over N passes of a G GiB sequential
// read, T threads, <binding>, L3 M MiB"
std::string describe_ceiling(const char* when, const CpuReadCeiling& ceiling);

// The table's ratio cell: "0.83", or "1.61!" above 1.0 (explained by ceiling_footer()).
std::string ratio_text(double ratio);

// Printed after the table: the ceiling measured again, its drift from `before` and, when a ratio
// exceeded 1.0 (`max_ratio`), a warning saying that figure cannot be a DRAM bandwidth.
std::string ceiling_footer(const CpuReadCeiling& before, const CpuReadCeiling& after,
                           double max_ratio);

}  // namespace pagedattn::tools
