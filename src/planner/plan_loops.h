// The planner's hot loops (internal to src/planner): the batch as the loops see it, a fast
// divisor for the page sizes, and the three passes — find the first invalid request, sum the
// totals, write the metadata. plan_loops.cpp compiles them for several x86-64 instruction sets
// with runtime dispatch; planner.cpp does the argument checks and the error messages.
#pragma once

#include <cstdint>

#include "pagedattn/planner.h"

namespace pagedattn::planner {

// Division of non-negative int32 values by a fixed divisor d >= 1: a shift when d is a power
// of two, else a 64x64 -> 128-bit multiply-high with M = floor((2^64 - 1) / d) + 1, which is
// exact for every 32-bit numerator (Lemire, Kaser and Kurz, "Faster remainder by direct
// computation", 2019).
struct Divisor {
  uint32_t value = 1;
  int32_t shift = 0;  // log2(value) when a power of two, else -1
  uint64_t magic = 0;

  explicit Divisor(uint32_t d) : value(d) {
    shift = (d & (d - 1)) == 0 ? __builtin_ctz(d) : -1;
    if (shift < 0) magic = ~uint64_t{0} / d + 1;
  }
  uint32_t div(uint32_t n) const {
    return shift >= 0 ? n >> shift
                      : static_cast<uint32_t>((static_cast<unsigned __int128>(magic) * n) >> 64);
  }
  uint32_t ceil_div(uint32_t n) const { return div(n + value - 1); }  // n < 2^31, d < 2^31
};

// One batch of the engine's tables, with the derived sizes the loops need.
struct BatchView {
  const int32_t* table = nullptr;  // [num_reqs, row_stride]: block ids or slots
  int64_t row_stride = 0;
  bool slot_form = false;
  const int32_t* seq_lens = nullptr;  // [num_reqs]
  const int32_t* q_lens = nullptr;    // [num_reqs], null for decode
  int32_t num_reqs = 0;
  int32_t batch = 0;  // padded
  int32_t alloc_page_size = 1;
  int32_t page_size = 1;
  int32_t ratio = 1;  // alloc_page_size / page_size
  Divisor alloc{1};
  Divisor page{1};
  int64_t num_alloc_pages = 0;
  uint32_t page_limit = 0;  // min(num_alloc_pages, 2^31): valid block ids are below it
  uint32_t slot_limit = 0;  // min(num_alloc_pages * A, 2^31): valid slots are below it
  int64_t tokens_per_row = 0;

  const int32_t* row(int32_t request) const { return table + request * row_stride; }
};

// The first request whose lengths or table row are invalid, or -1 (planner.cpp then names the
// exact position and value).
int32_t first_invalid_request(const BatchView& batch);

struct Totals {
  int64_t pages = 0;
  int64_t rows = 0;
  int32_t max_q_len = 0;
  int32_t max_kv_len = 0;
};
Totals sum_totals(const BatchView& batch);

// Writes every output of the plan; the capacities were checked against sum_totals.
void write_plan(const BatchView& batch, const PlanBuffers& buffers);

}  // namespace pagedattn::planner
