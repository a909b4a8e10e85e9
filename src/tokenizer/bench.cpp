// Tokenizer benchmarks for `pagedattn bench tokenize` (see tokenizer.h): single-threaded encode
// throughput, and the cost of one streamed token through IncrementalDecoder. Time is the calling
// thread's CPU time: equal to wall time on a quiet machine, and still meaningful on a shared one
// (where wall time counts the other processes' turns on the cores).
#include <time.h>

#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {
namespace {

double thread_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace

EncodeBenchmark bench_encode(const Tokenizer& tokenizer, std::string_view text, int64_t min_bytes) {
  EncodeBenchmark result;
  if (text.empty()) return result;
  (void)tokenizer.encode(text, false);  // warm: the word cache, as in a running server
  double start = thread_seconds();
  while (result.bytes < min_bytes) {
    result.tokens += static_cast<int64_t>(tokenizer.encode(text, false).size());
    result.bytes += static_cast<int64_t>(text.size());
  }
  result.seconds = (thread_seconds() - start);
  result.megabytes_per_second = static_cast<double>(result.bytes) / result.seconds / 1e6;
  return result;
}

EncodeBenchmark bench_encode_lines(const Tokenizer& tokenizer, std::span<const std::string> lines,
                                   int64_t min_bytes) {
  EncodeBenchmark result;
  int64_t pass_bytes = 0;
  for (const std::string& line : lines) pass_bytes += static_cast<int64_t>(line.size());
  if (pass_bytes == 0) return result;
  for (const std::string& line : lines) (void)tokenizer.encode(line, false);  // warm
  double start = thread_seconds();
  while (result.bytes < min_bytes) {
    for (const std::string& line : lines) {
      result.tokens += static_cast<int64_t>(tokenizer.encode(line, false).size());
    }
    result.bytes += pass_bytes;
  }
  result.seconds = (thread_seconds() - start);
  result.megabytes_per_second = static_cast<double>(result.bytes) / result.seconds / 1e6;
  return result;
}

double bench_incremental_decode_ns(const Tokenizer& tokenizer, std::span<const TokenId> ids,
                                   int repeats) {
  if (ids.empty()) return 0;
  IncrementalDecoder decoder(tokenizer, false);
  std::string out;
  double start = thread_seconds();
  for (int repeat = 0; repeat < repeats; ++repeat) {
    for (TokenId id : ids) decoder.feed(id, out);
    out += decoder.finish();
    out.clear();
  }
  return (thread_seconds() - start) * 1e9 / (static_cast<double>(ids.size()) * repeats);
}

}  // namespace pagedattn::tokenizer
