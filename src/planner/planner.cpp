// The host planner's entry point: argument checks, the error messages, and the order of the
// passes (plan_loops.cpp holds the loops themselves).
//
//   1. arguments that guard memory (always): sizes of the spans, P dividing A, padding;
//   2. validation (unless validate = false): a branch-free scan finds the first request whose
//      lengths or table row are invalid; only then is that request rescanned here, position by
//      position, to name the first bad entry and its value;
//   3. totals (pages, query rows) against the capacities of the caller's buffers;
//   4. the writes. Nothing is written before every check has passed.
#include "pagedattn/planner.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "planner/plan_loops.h"

namespace pagedattn {
namespace {

using planner::BatchView;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Names the first invalid entry of request `r` (which the fast scan flagged) and throws.
[[noreturn]] void report_invalid_request(const BatchView& b, int32_t r) {
  const int64_t seq_len = b.seq_lens[r];
  PA_CHECK(seq_len >= 0 && seq_len <= b.tokens_per_row,
           "plan: seq_lens[{}] = {} does not fit the table row, expected [0, {}] ({})", r, seq_len,
           b.tokens_per_row,
           b.slot_form ? fmt::format("row_stride {} tokens", b.row_stride)
                       : fmt::format("row_stride {} blocks x alloc_page_size {}", b.row_stride,
                                     b.alloc_page_size));
  if (b.q_lens != nullptr) {
    PA_CHECK(b.q_lens[r] >= 0 && b.q_lens[r] <= seq_len,
             "plan: q_lens[{}] = {} with seq_lens[{}] = {}, expected 0 <= q_len <= seq_len", r,
             b.q_lens[r], r, seq_len);
  }
  const int32_t* row = b.row(r);
  const int64_t alloc = b.alloc_page_size;
  if (!b.slot_form) {
    for (int64_t i = 0; i * alloc < seq_len; ++i) {
      PA_CHECK(row[i] >= 0 && row[i] < b.num_alloc_pages,
               "plan: block_table[{}][{}] = {}: page id out of range, expected [0, {}) "
               "(num_alloc_pages)",
               r, i, row[i], b.num_alloc_pages);
    }
  }
  for (int64_t start = 0; b.slot_form && start < seq_len; start += alloc) {
    const int64_t base = row[start];
    PA_CHECK(base >= 0, "plan: slots[{}][{}] = {}: negative slot, expected a slot in [0, {})", r,
             start, base, b.num_alloc_pages * alloc);
    PA_CHECK(base % alloc == 0,
             "plan: slots[{}][{}] = {}: position {} starts an allocation page, so its slot must "
             "be a multiple of alloc_page_size {}",
             r, start, base, start, alloc);
    PA_CHECK(base / alloc < b.num_alloc_pages,
             "plan: slots[{}][{}] = {}: page {} out of range, expected [0, {}) (num_alloc_pages)",
             r, start, base, base / alloc, b.num_alloc_pages);
    for (int64_t k = 1; k < alloc && start + k < seq_len; ++k) {
      PA_CHECK(row[start + k] == base + k,
               "plan: slots[{}][{}] = {}: expected {} (slots[{}][{}] = {} plus offset {}: the "
               "slots of one allocation page must be contiguous)",
               r, start + k, row[start + k], base + k, r, start, base, k);
    }
  }
  PA_FAIL("plan: request {} is invalid (internal: the scan and the report disagree)", r);
}

void check_capacity(std::string_view name, size_t capacity, int64_t needed) {
  PA_CHECK(static_cast<int64_t>(capacity) >= needed,
           "plan: buffer {} holds {} entries, expected at least {}", name, capacity, needed);
}

}  // namespace

PlanSummary plan(const PlanInput& input, const PlanBuffers& buffers) {
  // ---- 1. arguments that guard memory ----
  const int32_t num_reqs = input.num_reqs;
  PA_CHECK(num_reqs >= 0, "plan: num_reqs = {}, expected >= 0", num_reqs);
  PA_CHECK(input.alloc_page_size >= 1, "plan: alloc_page_size = {}, expected >= 1",
           input.alloc_page_size);
  PA_CHECK(input.page_size >= 1 && input.alloc_page_size % input.page_size == 0,
           "plan: page_size (P) = {} does not divide alloc_page_size = {} (expected a divisor of "
           "{})",
           input.page_size, input.alloc_page_size, input.alloc_page_size);
  PA_CHECK(input.padded_batch == 0 || input.padded_batch >= num_reqs,
           "plan: padded_batch = {} is smaller than num_reqs = {} (expected 0 or >= num_reqs)",
           input.padded_batch, num_reqs);
  PA_CHECK(input.seq_lens.size() >= static_cast<size_t>(num_reqs),
           "plan: seq_lens has {} entries, expected num_reqs = {}", input.seq_lens.size(),
           num_reqs);
  const bool prefill = !input.q_lens.empty();
  PA_CHECK(!prefill || input.q_lens.size() >= static_cast<size_t>(num_reqs),
           "plan: q_lens has {} entries, expected num_reqs = {} (or none for decode)",
           input.q_lens.size(), num_reqs);
  const int32_t ratio = input.alloc_page_size / input.page_size;
  PA_CHECK(input.num_alloc_pages >= 0 && input.num_alloc_pages * ratio <= kMaxInt32 + 1,
           "plan: num_alloc_pages = {}, expected >= 0 and at most 2^31 / (A / P) = {} so that "
           "attention-page ids fit int32",
           input.num_alloc_pages, (kMaxInt32 + 1) / ratio);

  BatchView b;
  std::span<const int32_t> table;
  const char* table_name = "";
  if (const auto* block = std::get_if<BlockTableInput>(&input.table)) {
    table = block->block_table;
    b.row_stride = block->row_stride;
    table_name = "block_table";
  } else {
    const auto& slot = std::get<SlotTableInput>(input.table);
    table = slot.slots;
    b.row_stride = slot.row_stride;
    b.slot_form = true;
    table_name = "slots";
  }
  PA_CHECK(b.row_stride >= 0, "plan: {} row_stride = {}, expected >= 0", table_name, b.row_stride);
  // Compared by division: num_reqs x row_stride may not fit in 64 bits for a bogus stride.
  PA_CHECK(num_reqs == 0 || b.row_stride <= static_cast<int64_t>(table.size()) / num_reqs,
           "plan: {} has {} entries, expected at least num_reqs x row_stride = {} x {}", table_name,
           table.size(), num_reqs, b.row_stride);
  b.table = table.data();
  b.seq_lens = input.seq_lens.data();
  b.q_lens = prefill ? input.q_lens.data() : nullptr;
  b.num_reqs = num_reqs;
  b.batch = input.padded_batch > 0 ? input.padded_batch : num_reqs;
  b.alloc_page_size = input.alloc_page_size;
  b.page_size = input.page_size;
  b.ratio = ratio;
  b.alloc = planner::Divisor(static_cast<uint32_t>(input.alloc_page_size));
  b.page = planner::Divisor(static_cast<uint32_t>(input.page_size));
  b.num_alloc_pages = input.num_alloc_pages;
  b.page_limit = static_cast<uint32_t>(std::min(input.num_alloc_pages, kMaxInt32 + 1));
  b.slot_limit =
      static_cast<uint32_t>(std::min(input.num_alloc_pages * input.alloc_page_size, kMaxInt32 + 1));
  b.tokens_per_row = b.slot_form ? b.row_stride : b.row_stride * input.alloc_page_size;

  // ---- 2. validation ----
  if (input.validate) {
    const int32_t bad = planner::first_invalid_request(b);
    if (bad >= 0) report_invalid_request(b, bad);
  }

  // ---- 3. totals against the capacities ----
  const planner::Totals totals = planner::sum_totals(b);
  PA_CHECK(totals.pages <= kMaxInt32, "plan: {} attention pages in the batch exceed int32 indptr",
           totals.pages);
  PA_CHECK(totals.rows <= kMaxInt32, "plan: {} query rows in the batch exceed int32 indptr",
           totals.rows);
  check_capacity("qo_indptr", buffers.qo_indptr.size(), int64_t{b.batch} + 1);
  check_capacity("kv_indptr", buffers.kv_indptr.size(), int64_t{b.batch} + 1);
  check_capacity("kv_last_page_len", buffers.kv_last_page_len.size(), b.batch);
  check_capacity("kv_lens", buffers.kv_lens.size(), b.batch);
  check_capacity("kv_indices", buffers.kv_indices.size(), totals.pages);

  // ---- 4. writes ----
  planner::write_plan(b, buffers);

  PlanSummary summary;
  summary.num_reqs = num_reqs;
  summary.batch_size = b.batch;
  summary.num_pages = totals.pages;
  summary.num_qo_rows = totals.rows;
  summary.max_q_len = totals.max_q_len;
  summary.max_kv_len = totals.max_kv_len;
  return summary;
}

PlanStorage::PlanStorage(int32_t max_batch, int64_t max_pages) {
  PA_CHECK(max_batch >= 0, "PlanStorage: max_batch = {}, expected >= 0", max_batch);
  PA_CHECK(max_pages >= 0, "PlanStorage: max_pages = {}, expected >= 0", max_pages);
  const size_t batch = static_cast<size_t>(max_batch);
  qo_indptr.assign(batch + 1, 0);
  kv_indptr.assign(batch + 1, 0);
  kv_indices.assign(static_cast<size_t>(max_pages), 0);
  kv_last_page_len.assign(batch, 0);
  kv_lens.assign(batch, 0);
}

PlanBuffers PlanStorage::buffers() {
  return PlanBuffers{qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens};
}

}  // namespace pagedattn
