// The CPU memory-read ceiling of the attention benchmarks (see cpu_ceiling.h for the method).
//
// Each thread owns one contiguous, 4 KiB-aligned slice of the buffer, the same slice for the
// first-touch write and for every read pass (schedule(static) over the thread count), so pages
// sit on the reader's NUMA node and no pass pays a page fault. The read loop keeps two 64-byte
// vector accumulators so that it is limited by memory, not by one dependent add chain.
#include "tools/bench/cpu_ceiling.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pagedattn::tools {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kSliceAlign = 4096 / int64_t(sizeof(uint64_t));  // words per 4 KiB
constexpr int32_t kMaxPasses = 200;

using Line = uint64_t __attribute__((vector_size(64)));

int32_t team_size() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int32_t thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

std::string binding_text() {
#ifdef _OPENMP
  static const char* const kNames[] = {"false", "true", "primary", "close", "spread"};
  const int bind = static_cast<int>(omp_get_proc_bind());
  const char* name = bind >= 0 && bind < 5 ? kNames[bind] : "?";
  const char* places = std::getenv("OMP_PLACES");
  return fmt::format("proc_bind {}, {}", name,
                     places ? fmt::format("{} places (OMP_PLACES={})", omp_get_num_places(), places)
                            : std::string("OMP_PLACES unset"));
#else
  return "no OpenMP";
#endif
}

// Last-level cache size: glibc's sysconf first, then sysfs (index3 of cpu0); 0 if neither says.
int64_t l3_size_bytes() {
  const long from_sysconf = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (from_sysconf > 0) return from_sysconf;
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(file >> text) || text.empty()) return 0;
  const int64_t value = std::strtoll(text.c_str(), nullptr, 10);
  const char unit = text.back();
  return unit == 'K' ? value * 1024 : unit == 'M' ? value * kMiB : value;
}

int64_t buffer_bytes(int64_t l3) {
  int64_t bytes = std::max<int64_t>(2 * kGiB, 8 * l3);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) bytes = std::min<int64_t>(bytes, int64_t{pages} * page / 4);
  return std::max<int64_t>(bytes / 4096 * 4096, 64 * kMiB);
}

// The slice [begin, end) of `words` owned by thread t of `threads` (4 KiB-aligned boundaries).
struct Slice {
  int64_t begin, end;
};
Slice slice_of(int64_t words, int32_t t, int32_t threads) {
  const int64_t per = (words / threads + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  const int64_t begin = std::min(words, per * t);
  return {begin, std::min(words, begin + per)};
}

uint64_t read_slice(const uint64_t* data, Slice s) {
  Line a{}, b{};
  int64_t i = s.begin;
  for (; i + 16 <= s.end; i += 16) {
    Line x, y;
    __builtin_memcpy(&x, data + i, sizeof(x));
    __builtin_memcpy(&y, data + i + 8, sizeof(y));
    a += x;
    b += y;
  }
  uint64_t total = 0;
  for (; i < s.end; ++i) total += data[i];
  const Line c = a + b;
  for (int k = 0; k < 8; ++k) total += c[k];
  return total;
}

}  // namespace

CpuReadCeiling measure_cpu_read_ceiling(double min_time, int64_t bytes) {
  CpuReadCeiling result;
  result.l3_bytes = l3_size_bytes();
  result.bytes =
      bytes > 0 ? std::max<int64_t>(bytes / 4096 * 4096, 4096) : buffer_bytes(result.l3_bytes);
  result.threads = team_size();
  result.binding = binding_text();
  const int64_t words = result.bytes / int64_t(sizeof(uint64_t));
  const int32_t threads = result.threads;
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[static_cast<size_t>(words)]);
  uint64_t* data = buffer.get();

  // Pre-fault: each thread writes the slice it will read (first touch places its pages).
#pragma omp parallel num_threads(threads)
  {
    const Slice s = slice_of(words, thread_index(), threads);
    for (int64_t i = s.begin; i < s.end; ++i) data[i] = static_cast<uint64_t>(i);
  }
  uint64_t sink = 0;
  auto pass = [&] {
    uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += read_slice(data, slice_of(words, thread_index(), threads));
    sink += total;
  };
  pass();  // warm-up (TLB, frequency, thread wake-up)

  using Clock = std::chrono::steady_clock;
  std::vector<double> gbs;
  const Clock::time_point start = Clock::now();
  while (static_cast<int32_t>(gbs.size()) < kMinPasses ||
         (std::chrono::duration<double>(Clock::now() - start).count() < min_time &&
          static_cast<int32_t>(gbs.size()) < kMaxPasses)) {
    const Clock::time_point t0 = Clock::now();
    pass();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    gbs.push_back(static_cast<double>(result.bytes) / ns);
  }
  asm volatile("" : : "r"(sink));
  std::sort(gbs.begin(), gbs.end());
  const size_t n = gbs.size();
  result.passes = static_cast<int32_t>(n);
  result.median_gbs = n % 2 ? gbs[n / 2] : 0.5 * (gbs[n / 2 - 1] + gbs[n / 2]);
  result.max_gbs = gbs.back();
  result.min_gbs = gbs.front();
  return result;
}

std::string describe_ceiling(const char* when, const CpuReadCeiling& c) {
  return fmt::format(
      "memory read ceiling ({}): median {:.1f} GB/s (max {:.1f}, min {:.1f}) over {} passes of a "
      "{:.2f} GiB sequential read (pre-faulted, 1 warm-up pass), {} threads, {}, L3 {}",
      when, c.median_gbs, c.max_gbs, c.min_gbs, c.passes, static_cast<double>(c.bytes) / kGiB,
      c.threads, c.binding,
      c.l3_bytes > 0 ? fmt::format("{} MiB", c.l3_bytes / kMiB) : std::string("unknown"));
}

std::string ratio_text(double ratio) {
  return ratio > 1.0 ? fmt::format("{:.2f}!", ratio) : fmt::format("{:.2f}", ratio);
}

std::string ceiling_footer(const CpuReadCeiling& before, const CpuReadCeiling& after,
                           double max_ratio) {
  const double drift =
      before.median_gbs > 0 ? (after.median_gbs / before.median_gbs - 1.0) * 100.0 : 0.0;
  std::string text = describe_ceiling("after the rows", after) +
                     fmt::format(
                         "\nceiling drift: {:+.1f}% (ratios use the ceiling before the "
                         "rows, {:.1f} GB/s)\n",
                         drift, before.median_gbs);
  if (drift > 15.0 || drift < -15.0) {
    text +=
        "WARNING: the ceiling moved by more than 15% during the run (other load on the "
        "machine?); the ratios are uncertain by as much.\n";
  }
  if (max_ratio > 1.0) {
    text += fmt::format(
        "WARNING: ratio above 1.0 (max {:.2f}, marked '!'): a KV read faster than the DRAM read "
        "ceiling was (partly) served from cache: each sample re-reads the same KV, which stays "
        "cached when its size is near or below the L3 ({}). Such a ratio is not a fraction of "
        "memory bandwidth.\n",
        max_ratio,
        before.l3_bytes > 0 ? fmt::format("{} MiB", before.l3_bytes / kMiB) : "size unknown");
  }
  return text;
}

}  // namespace pagedattn::tools
