// Output helpers shared by the command line's subcommands: aligned text tables, a progress line
// on a terminal, a few words about the machine, and timing by median of repeated samples.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::tools {

// A text table: columns padded to their widest cell; numbers (cells starting with a digit, '-'
// or '.') right-aligned, text left-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void add_row(std::vector<std::string> cells);
  std::string str() const;
  size_t rows() const { return rows_.size(); }

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// "[k/n] label" rewritten in place on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress(int64_t total, bool enabled);
  ~Progress();
  void step(std::string_view label);

 private:
  int64_t total_ = 0;
  int64_t done_ = 0;
  bool enabled_ = false;
};
bool stderr_is_terminal();

// CPU model and core count, e.g. "Intel(R) Xeon(R) ... (2 cores)".
std::string machine_description();
// This process's user + system CPU seconds (getrusage).
double process_cpu_seconds();
// Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait); < 0 if
// unreadable. Over a run, its growth less the process's CPU time is what other processes took.
double machine_busy_seconds();
// "2026-12-02T09:30:00Z".
std::string utc_timestamp();

// Times `fn` (one call = one operation): calls are grouped into samples of at least
// `min_sample_seconds`, and samples are repeated until `min_total_seconds` have passed and at
// least `min_samples` were taken. Returns the median nanoseconds per call.
struct TimingOptions {
  double min_sample_seconds = 20e-6;
  double min_total_seconds = 0.1;
  int32_t min_samples = 7;
  int32_t max_samples = 2000;
};
double median_ns_per_call(const std::function<void()>& fn, const TimingOptions& options);
// The same for several functions measured side by side: samples are taken round-robin (one of
// each per round), so that a slower or busier stretch of the machine affects them alike. Returns
// the median nanoseconds per call of each, in order.
std::vector<double> interleaved_medians_ns(const std::vector<std::function<void()>>& fns,
                                           const TimingOptions& options);

// Keeps the compiler from dropping writes to `pointer` (benchmarks' results are never read).
inline void keep(const void* pointer) { asm volatile("" : : "r"(pointer) : "memory"); }

}  // namespace pagedattn::tools
