// Aligned tables, terminal progress, machine description and median timing for the tools.
#include "tools/cli/report.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

namespace pagedattn::tools {
namespace {

bool looks_numeric(const std::string& cell) {
  if (cell.empty()) return false;
  const char c = cell.front();
  return (c >= '0' && c <= '9') || c == '-' || c == '.';
}

}  // namespace

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::str() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  // A column is right-aligned when all its cells are numbers.
  std::vector<bool> right(headers_.size(), true);
  for (size_t c = 0; c < headers_.size(); ++c) {
    for (const auto& row : rows_) right[c] = right[c] && (row[c].empty() || looks_numeric(row[c]));
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) out += "  ";
      out += right[c] ? fmt::format("{:>{}}", cells[c], width[c])
                      : fmt::format("{:<{}}", cells[c], width[c]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  line(headers_);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  line(rule);
  for (const auto& row : rows_) line(row);
  return out;
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled) {}

Progress::~Progress() {
  if (enabled_ && done_ > 0) std::fputs("\r\033[K", stderr);
}

void Progress::step(std::string_view label) {
  ++done_;
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K[%lld/%lld] %.*s", static_cast<long long>(done_),
               static_cast<long long>(total_), static_cast<int>(label.size()), label.data());
  std::fflush(stderr);
}

std::string machine_description() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  return fmt::format("{} ({} hardware threads)", model, std::thread::hardware_concurrency());
}

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double machine_busy_seconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      cpu != "cpu") {
    return -1;
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (user + nice + system + irq + softirq + steal) / ticks;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

double median_ns_per_call(const std::function<void()>& fn, const TimingOptions& options) {
  return interleaved_medians_ns({fn}, options)[0];
}

std::vector<double> interleaved_medians_ns(const std::vector<std::function<void()>>& fns,
                                           const TimingOptions& options) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  // Calls per sample of each function: double until a sample lasts min_sample_seconds (after
  // one call that warms caches and pages in the buffers).
  std::vector<int64_t> calls(fns.size(), 1);
  for (size_t f = 0; f < fns.size(); ++f) {
    fns[f]();
    while (true) {
      const auto start = Clock::now();
      for (int64_t i = 0; i < calls[f]; ++i) fns[f]();
      if (seconds(Clock::now() - start) >= options.min_sample_seconds || calls[f] >= (1 << 20)) {
        break;
      }
      calls[f] *= 2;
    }
  }
  std::vector<std::vector<double>> samples(fns.size());
  const auto begin = Clock::now();
  int32_t rounds = 0;
  while (rounds < options.min_samples ||
         (seconds(Clock::now() - begin) < options.min_total_seconds * fns.size() &&
          rounds < options.max_samples)) {
    for (size_t f = 0; f < fns.size(); ++f) {
      const auto start = Clock::now();
      for (int64_t i = 0; i < calls[f]; ++i) fns[f]();
      samples[f].push_back(seconds(Clock::now() - start) * 1e9 / static_cast<double>(calls[f]));
    }
    ++rounds;
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

}  // namespace pagedattn::tools
