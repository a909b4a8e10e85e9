// Benchmark rows "B x kv_len" as the command line and the CUDA benchmarks take them (plain C++,
// every build: option errors are reported before any device is touched).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::tools {

// One benchmark row: `batch` requests of `kv_len` tokens; prefill rows also give the new query
// tokens per request (q_len; 0 = decode, kv_len = q_len for a prefill without a cached prefix).
// ragged: the ragged prefill batch (lengths drawn from a seeded generator, see prefill).
struct BatchLen {
  int32_t batch = 0;
  int32_t kv_len = 0;
  int32_t q_len = 0;
  bool ragged = false;
  std::string name() const;  // "64x8192", "16x512/4096", "ragged16/4096"
};

// Parses "BxL[,BxL...]" (prefill also "BxQ/L": Q new tokens over L, and "raggedB/L"); errors
// name `option` and the bad item.
std::vector<BatchLen> parse_batch_lens(const std::string& text, std::string_view option);

}  // namespace pagedattn::tools
