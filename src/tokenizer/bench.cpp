// Tokenizer benchmarks for `pagedattn bench tokenize` (see tokenizer.h): single-threaded encode
// throughput, and the cost of one streamed token through IncrementalDecoder.
#include <chrono>

#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

EncodeBenchmark bench_encode(const Tokenizer& tokenizer, std::string_view text,
                             int64_t min_bytes) {
  EncodeBenchmark result;
  if (text.empty()) return result;
  (void)tokenizer.encode(text, false);  // warm: the word cache, as in a running server
  auto start = std::chrono::steady_clock::now();
  while (result.bytes < min_bytes) {
    result.tokens += static_cast<int64_t>(tokenizer.encode(text, false).size());
    result.bytes += static_cast<int64_t>(text.size());
  }
  result.seconds = seconds_since(start);
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
  auto start = std::chrono::steady_clock::now();
  while (result.bytes < min_bytes) {
    for (const std::string& line : lines) {
      result.tokens += static_cast<int64_t>(tokenizer.encode(line, false).size());
    }
    result.bytes += pass_bytes;
  }
  result.seconds = seconds_since(start);
  result.megabytes_per_second = static_cast<double>(result.bytes) / result.seconds / 1e6;
  return result;
}

double bench_incremental_decode_ns(const Tokenizer& tokenizer, std::span<const TokenId> ids,
                                   int repeats) {
  if (ids.empty()) return 0;
  IncrementalDecoder decoder(tokenizer, false);
  std::string out;
  auto start = std::chrono::steady_clock::now();
  for (int repeat = 0; repeat < repeats; ++repeat) {
    for (TokenId id : ids) decoder.feed(id, out);
    out += decoder.finish();
    out.clear();
  }
  return seconds_since(start) * 1e9 / (static_cast<double>(ids.size()) * repeats);
}

}  // namespace pagedattn::tokenizer
