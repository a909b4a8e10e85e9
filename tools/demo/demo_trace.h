// The demo's workload: the options' validation, the seeded trace of requests (arrivals, prompt
// and output lengths, shared system prompts) with their random token data, and the pool size.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/dtype.h"
#include "tools/demo/demo.h"

namespace pagedattn::tools::demo {

// Random bf16 values uniform in [-range, range): xorshift, cheap enough for every token.
class ValueSource {
 public:
  explicit ValueSource(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull | 1) {}
  void fill(uint16_t* out, int64_t n, float range) {
    for (int64_t i = 0; i < n; ++i) {
      state_ ^= state_ << 13;
      state_ ^= state_ >> 7;
      state_ ^= state_ << 17;
      const float unit = static_cast<float>(state_ >> 40) * 0x1p-24f;  // [0, 1)
      out[i] = float_to_bf16((2.0f * unit - 1.0f) * range);
    }
  }

 private:
  uint64_t state_;
};

enum class State : uint8_t { kFuture, kWaiting, kRunning, kDone };

struct Request {
  int64_t id = 0;
  int32_t prefix = -1;     // shared prefix index, or -1
  int32_t prompt_len = 0;  // the prefix included
  int32_t output_len = 0;  // decode steps
  int64_t arrival_step = 0;
  State state = State::kFuture;
  int32_t generated = 0;       // decode tokens produced
  int32_t cached = 0;          // tokens in the cache
  std::vector<uint16_t> k, v;  // logical K/V [prompt_len + generated, Hkv, D], filled on admission
  int32_t total_tokens() const { return prompt_len + generated; }
};

// A shared system prompt: one cache entry (an allocator request of its own) that requests fork.
struct Prefix {
  int32_t length = 0;
  int64_t id = 0;  // allocator id
  bool resident = false;
  std::vector<uint16_t> k, v;  // [length, Hkv, D]
};

struct Trace {
  std::vector<Request> requests;  // in arrival order
  std::vector<Prefix> prefixes;
  int64_t longest = 0;  // most tokens of one request (prompt + output)
};

// Throws Error naming the first bad option (as its command-line flag).
void validate_options(const DemoOptions& options);

Trace make_trace(const DemoOptions& options, std::mt19937_64& rng, ValueSource& values);

// The pool size in allocation pages: options.num_pages, or by default about 45% of what the
// largest max_batch requests would hold at once (so admission queues and decode preempts now and
// then). Throws Error when it is below what the trace needs to finish: the largest request plus
// the prefixes plus 2.
int64_t pool_pages(const DemoOptions& options, const Trace& trace);

}  // namespace pagedattn::tools::demo
