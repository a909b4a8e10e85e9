// The host planner: engine tables (block table or token->slot table) -> CSR metadata.
//
// Two passes over the batch, so that bad input is reported before anything is written:
//   1. per request: lengths against the table row, q_len <= seq_len, the page ids of the row
//      (block form: every used entry in range; slot form: every token's slot, each allocation
//      page one contiguous page-aligned run), and the attention-page count ceil(seq_len / P);
//      then the capacities of the caller's buffers against the totals;
//   2. the writes: allocation page b becomes attention pages b*r .. b*r + r - 1 (r = A / P), the
//      last allocation page of a request only as far as its tokens reach.
// The checks in pass 1 are branch-free reductions over each row (vectorized by the compiler);
// only when a reduction flags a problem is the row rescanned to name the first bad position.
// The writes in pass 2 are a memcpy for r = 1 (block form) and an iota per allocation page
// otherwise, specialised for the common power-of-two ratios.
#include "pagedattn/planner.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace pagedattn {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape of the work: the table form, the page sizes and the table row.
struct Layout {
  const int32_t* table = nullptr;
  int64_t row_stride = 0;
  bool slot_form = false;
  int32_t alloc_page_size = 0;  // A
  int32_t page_size = 0;        // P
  int32_t ratio = 0;            // r = A / P attention pages per allocation page
  int32_t alloc_shift = -1;     // log2(A) when A is a power of two, else -1
  int64_t num_alloc_pages = 0;

  const int32_t* row(int32_t request) const { return table + request * row_stride; }
  // Allocation page holding the first token of a slot (slot form).
  int32_t page_of_slot(int32_t slot) const {
    return alloc_shift >= 0 ? (slot >> alloc_shift) : slot / alloc_page_size;
  }
};

int32_t log2_if_power_of_two(int32_t value) {
  if (value <= 0 || (value & (value - 1)) != 0) return -1;
  int32_t shift = 0;
  while ((1 << shift) != value) ++shift;
  return shift;
}

// ---- pass 1: validation of one request's row ----

// Block form: entries [0, blocks) of the row are allocation-page ids in [0, num_alloc_pages).
void check_block_row(const Layout& layout, int32_t request, int64_t blocks) {
  const int32_t* row = layout.row(request);
  const uint32_t limit =
      static_cast<uint32_t>(std::min<int64_t>(layout.num_alloc_pages, kMaxInt32 + 1));
  uint32_t bad = 0;
  for (int64_t i = 0; i < blocks; ++i) bad |= static_cast<uint32_t>(row[i]) >= limit;
  if (bad == 0) [[likely]] return;
  for (int64_t i = 0; i < blocks; ++i) {
    PA_CHECK(static_cast<uint32_t>(row[i]) < limit,
             "plan: block_table[{}][{}] = {}: page id out of range, expected [0, {}) "
             "(num_alloc_pages)",
             request, i, row[i], layout.num_alloc_pages);
  }
}

// Slot form: tokens [0, seq_len) of the row; the token at position j*A starts allocation page j
// of the request (slot a multiple of A, page in range), and the tokens after it in that page
// follow it contiguously.
void check_slot_row(const Layout& layout, int32_t request, int64_t seq_len) {
  const int32_t* row = layout.row(request);
  const int64_t alloc = layout.alloc_page_size;
  for (int64_t start = 0; start < seq_len; start += alloc) {
    const int32_t base = row[start];
    const bool aligned = layout.alloc_shift >= 0 ? (base & (alloc - 1)) == 0 : base % alloc == 0;
    PA_CHECK(base >= 0, "plan: slots[{}][{}] = {}: negative slot, expected a slot in [0, {})",
             request, start, base, layout.num_alloc_pages * alloc);
    PA_CHECK(aligned,
             "plan: slots[{}][{}] = {}: position {} starts an allocation page, so its slot must "
             "be a multiple of alloc_page_size {}",
             request, start, base, start, alloc);
    PA_CHECK(layout.page_of_slot(base) < layout.num_alloc_pages,
             "plan: slots[{}][{}] = {}: page {} out of range, expected [0, {}) (num_alloc_pages)",
             request, start, base, layout.page_of_slot(base), layout.num_alloc_pages);
    const int64_t count = std::min(alloc, seq_len - start);
    const int32_t* run = row + start;
    uint32_t mismatch = 0;
    for (int64_t k = 1; k < count; ++k) {
      mismatch |= static_cast<uint32_t>(run[k]) ^ static_cast<uint32_t>(base + k);
    }
    if (mismatch == 0) [[likely]] continue;
    for (int64_t k = 1; k < count; ++k) {
      PA_CHECK(run[k] == base + k,
               "plan: slots[{}][{}] = {}: expected {} (slots[{}][{}] = {} plus offset {}: the "
               "slots of one allocation page must be contiguous)",
               request, start + k, run[k], base + k, request, start, base, k);
    }
  }
}

// ---- pass 2: writes ----

// The id of allocation page `block` of the request's row.
template <bool kSlotForm>
int32_t alloc_page(const Layout& layout, const int32_t* row, int64_t block) {
  if constexpr (kSlotForm) {
    return layout.page_of_slot(row[block * layout.alloc_page_size]);
  } else {
    return row[block];
  }
}

// Writes the `pages` attention-page ids of one request. kRatio is r when known at compile time,
// 0 for a runtime r.
template <bool kSlotForm, int32_t kRatio>
void write_request(const Layout& layout, const int32_t* row, int64_t pages, int32_t* out) {
  const int32_t ratio = kRatio > 0 ? kRatio : layout.ratio;
  if constexpr (!kSlotForm && kRatio == 1) {
    std::memcpy(out, row, static_cast<size_t>(pages) * sizeof(int32_t));
    return;
  }
  const int64_t full = pages / ratio;
  for (int64_t block = 0; block < full; ++block) {
    const int32_t first = alloc_page<kSlotForm>(layout, row, block) * ratio;
    int32_t* dst = out + block * ratio;
    for (int32_t k = 0; k < ratio; ++k) dst[k] = first + k;
  }
  const int64_t rest = pages - full * ratio;
  if (rest > 0) {
    const int32_t first = alloc_page<kSlotForm>(layout, row, full) * ratio;
    int32_t* dst = out + full * ratio;
    for (int32_t k = 0; k < rest; ++k) dst[k] = first + k;
  }
}

template <bool kSlotForm, int32_t kRatio>
void write_indices(const Layout& layout, int32_t num_reqs, std::span<const int32_t> kv_indptr,
                   int32_t* kv_indices) {
  for (int32_t r = 0; r < num_reqs; ++r) {
    write_request<kSlotForm, kRatio>(layout, layout.row(r), kv_indptr[r + 1] - kv_indptr[r],
                                     kv_indices + kv_indptr[r]);
  }
}

template <bool kSlotForm>
void dispatch_write(const Layout& layout, int32_t num_reqs, std::span<const int32_t> kv_indptr,
                    int32_t* kv_indices) {
  switch (layout.ratio) {
    case 1: return write_indices<kSlotForm, 1>(layout, num_reqs, kv_indptr, kv_indices);
    case 2: return write_indices<kSlotForm, 2>(layout, num_reqs, kv_indptr, kv_indices);
    case 4: return write_indices<kSlotForm, 4>(layout, num_reqs, kv_indptr, kv_indices);
    case 8: return write_indices<kSlotForm, 8>(layout, num_reqs, kv_indptr, kv_indices);
    case 16: return write_indices<kSlotForm, 16>(layout, num_reqs, kv_indptr, kv_indices);
    default: return write_indices<kSlotForm, 0>(layout, num_reqs, kv_indptr, kv_indices);
  }
}

void check_capacity(std::string_view name, size_t capacity, int64_t needed) {
  PA_CHECK(static_cast<int64_t>(capacity) >= needed,
           "plan: buffer {} holds {} entries, expected at least {}", name, capacity, needed);
}

}  // namespace

PlanSummary plan(const PlanInput& input, const PlanBuffers& buffers) {
  // ---- arguments that do not depend on the data (always checked: they guard memory) ----
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
  PA_CHECK(input.num_alloc_pages >= 0, "plan: num_alloc_pages = {}, expected >= 0",
           input.num_alloc_pages);

  Layout layout;
  layout.alloc_page_size = input.alloc_page_size;
  layout.page_size = input.page_size;
  layout.ratio = input.alloc_page_size / input.page_size;
  layout.alloc_shift = log2_if_power_of_two(input.alloc_page_size);
  layout.num_alloc_pages = input.num_alloc_pages;
  PA_CHECK(input.num_alloc_pages * layout.ratio <= kMaxInt32 + 1,
           "plan: num_alloc_pages = {} x {} attention pages each exceeds the int32 page ids",
           input.num_alloc_pages, layout.ratio);
  std::span<const int32_t> table;
  const char* table_name = "";
  if (const auto* block = std::get_if<BlockTableInput>(&input.table)) {
    table = block->block_table;
    layout.row_stride = block->row_stride;
    table_name = "block_table";
  } else {
    const auto& slot = std::get<SlotTableInput>(input.table);
    table = slot.slots;
    layout.row_stride = slot.row_stride;
    layout.slot_form = true;
    table_name = "slots";
  }
  layout.table = table.data();
  PA_CHECK(layout.row_stride >= 0, "plan: {} row_stride = {}, expected >= 0", table_name,
           layout.row_stride);
  PA_CHECK(static_cast<int64_t>(table.size()) >= num_reqs * layout.row_stride,
           "plan: {} has {} entries, expected num_reqs x row_stride = {} x {} = {}", table_name,
           table.size(), num_reqs, layout.row_stride, num_reqs * layout.row_stride);
  const int64_t tokens_per_row =
      layout.slot_form ? layout.row_stride : layout.row_stride * layout.alloc_page_size;

  // ---- pass 1: lengths, page ids, totals ----
  const int32_t batch = input.padded_batch > 0 ? input.padded_batch : num_reqs;
  int64_t total_pages = 0;
  int64_t total_rows = prefill ? 0 : batch;
  int32_t max_q_len = prefill ? 0 : (batch > 0 ? 1 : 0);
  int32_t max_kv_len = 0;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const int32_t seq_len = input.seq_lens[r];
    if (input.validate) {
      PA_CHECK(seq_len >= 0 && seq_len <= tokens_per_row,
               "plan: seq_lens[{}] = {} does not fit the table row, expected [0, {}] ({})",
               r, seq_len, tokens_per_row,
               layout.slot_form ? fmt::format("row_stride {} tokens", layout.row_stride)
                                : fmt::format("row_stride {} blocks x alloc_page_size {}",
                                              layout.row_stride, layout.alloc_page_size));
      if (prefill) {
        PA_CHECK(input.q_lens[r] >= 0 && input.q_lens[r] <= seq_len,
                 "plan: q_lens[{}] = {} with seq_lens[{}] = {}, expected 0 <= q_len <= seq_len",
                 r, input.q_lens[r], r, seq_len);
      }
      if (layout.slot_form) {
        check_slot_row(layout, r, seq_len);
      } else {
        check_block_row(layout, r, ceil_div(seq_len, layout.alloc_page_size));
      }
    }
    total_pages += ceil_div(seq_len, layout.page_size);
    max_kv_len = std::max(max_kv_len, seq_len);
    if (prefill) {
      total_rows += input.q_lens[r];
      max_q_len = std::max(max_q_len, input.q_lens[r]);
    }
  }
  PA_CHECK(total_pages <= kMaxInt32, "plan: {} attention pages in the batch exceed int32 indptr",
           total_pages);
  PA_CHECK(total_rows <= kMaxInt32, "plan: {} query rows in the batch exceed int32 indptr",
           total_rows);
  check_capacity("qo_indptr", buffers.qo_indptr.size(), int64_t{batch} + 1);
  check_capacity("kv_indptr", buffers.kv_indptr.size(), int64_t{batch} + 1);
  check_capacity("kv_last_page_len", buffers.kv_last_page_len.size(), batch);
  check_capacity("kv_lens", buffers.kv_lens.size(), batch);
  check_capacity("kv_indices", buffers.kv_indices.size(), total_pages);

  // ---- pass 2: writes ----
  int32_t* qo_indptr = buffers.qo_indptr.data();
  int32_t* kv_indptr = buffers.kv_indptr.data();
  int32_t* last_page_len = buffers.kv_last_page_len.data();
  int32_t* kv_lens = buffers.kv_lens.data();
  const int32_t page_size = layout.page_size;
  int32_t pages = 0;
  int32_t rows = 0;
  qo_indptr[0] = 0;
  kv_indptr[0] = 0;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const int32_t seq_len = input.seq_lens[r];
    pages += (seq_len + page_size - 1) / page_size;
    rows += prefill ? input.q_lens[r] : 1;
    kv_indptr[r + 1] = pages;
    qo_indptr[r + 1] = rows;
    last_page_len[r] = seq_len == 0 ? 0 : (seq_len - 1) % page_size + 1;
    kv_lens[r] = seq_len;
  }
  // Padding requests: no pages; one query row each for decode, none for prefill.
  for (int32_t r = num_reqs; r < batch; ++r) {
    rows += prefill ? 0 : 1;
    kv_indptr[r + 1] = pages;
    qo_indptr[r + 1] = rows;
    last_page_len[r] = 0;
    kv_lens[r] = 0;
  }
  const std::span<const int32_t> indptr(kv_indptr, static_cast<size_t>(batch) + 1);
  if (layout.slot_form) {
    dispatch_write<true>(layout, num_reqs, indptr, buffers.kv_indices.data());
  } else {
    dispatch_write<false>(layout, num_reqs, indptr, buffers.kv_indices.data());
  }

  PlanSummary summary;
  summary.num_reqs = num_reqs;
  summary.batch_size = batch;
  summary.num_pages = total_pages;
  summary.num_qo_rows = total_rows;
  summary.max_q_len = max_q_len;
  summary.max_kv_len = max_kv_len;
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
