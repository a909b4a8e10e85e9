// The planner's hot loops. Each entry point is compiled for x86-64-v4 (AVX-512), x86-64-v3
// (AVX2) and the baseline with runtime dispatch (GCC target_clones), once per batch; the work
// itself lives in always-inline templates specialised on the table form and on the common
// attention pages per allocation page (r = A / P), so the inner loops have constant trip counts
// and vectorize.
//
// Validation is branch-free per row: an OR-reduction of "bad" bits, so the common all-valid case
// costs one streaming read of the used part of the table.
//   block form: every used id below num_alloc_pages (one unsigned compare also catches < 0);
//   slot form:  each allocation-page start aligned to A and in range, and every other token
//               its left neighbour + 1 (so each page's slots are one contiguous run).
#include "planner/plan_loops.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PA_PLANNER_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// Keeps the short per-request copies as inline vector loops: a libc memcpy call per request of
// a few dozen bytes costs more than the copy (13% of the write pass at 16 pages per request).
#define PA_NO_MEMCPY_CALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define PA_PLANNER_CLONES
#define PA_NO_MEMCPY_CALLS
#endif
#define PA_INLINE inline __attribute__((always_inline))

namespace pagedattn::planner {
namespace {

// ---- validation ----

PA_INLINE uint32_t bad_block_ids(const int32_t* row, int64_t count, uint32_t limit) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad |= static_cast<uint32_t>(row[i]) >= limit;
  return bad;
}

// Slot form with A a power of two >= 2.
PA_INLINE uint32_t bad_slots_pow2(const int32_t* row, uint32_t tokens, uint32_t alloc,
                                  uint32_t slot_limit) {
  const uint32_t mask = alloc - 1;
  uint32_t bad = 0;
  for (uint32_t start = 0; start < tokens; start += alloc) {
    const uint32_t base = static_cast<uint32_t>(row[start]);
    bad |= (base >= slot_limit) | ((base & mask) != 0);
  }
  const uint32_t* slots = reinterpret_cast<const uint32_t*>(row);
  uint32_t diff = 0;
  for (uint32_t t = 1; t < tokens; ++t) {
    const uint32_t inside = (t & mask) != 0 ? ~0u : 0u;  // not the first token of a page
    diff |= (slots[t] - slots[t - 1] - 1u) & inside;
  }
  return bad | (diff != 0);
}

// Slot form, any A (A = 1: a range check per token).
PA_INLINE uint32_t bad_slots_any(const int32_t* row, uint32_t tokens, const Divisor& alloc,
                                 uint32_t slot_limit) {
  uint32_t bad = 0;
  for (uint32_t start = 0; start < tokens; start += alloc.value) {
    const uint32_t base = static_cast<uint32_t>(row[start]);
    bad |= (base >= slot_limit) | (base - alloc.div(base) * alloc.value != 0);
    const uint32_t count = std::min(alloc.value, tokens - start);
    const uint32_t* run = reinterpret_cast<const uint32_t*>(row + start);
    uint32_t diff = 0;
    for (uint32_t k = 1; k < count; ++k) diff |= run[k] ^ (base + k);
    bad |= diff != 0;
  }
  return bad;
}

// ---- writes ----
//
// Everything the loops read is copied into locals and every pointer is __restrict: the outputs
// are int32 like the inputs, and without that the compiler reloads the batch's fields after each
// store and versions each copy loop on an aliasing test.

struct WriteArgs {
  const int32_t* __restrict table;
  int64_t row_stride;
  const int32_t* __restrict seq_lens;
  const int32_t* __restrict q_lens;
  int32_t num_reqs, batch;
  uint32_t alloc_page_size, page_size, ratio;
  Divisor alloc, page;
};

// Attention-page id of the first attention page of allocation page `block` of a row.
template <bool kSlotForm>
PA_INLINE uint32_t first_page(const int32_t* __restrict row, uint32_t block, uint32_t ratio,
                              uint32_t alloc_page_size, Divisor alloc) {
  if constexpr (kSlotForm) {
    return alloc.div(static_cast<uint32_t>(row[block * alloc_page_size])) * ratio;
  } else {
    return static_cast<uint32_t>(row[block]) * ratio;
  }
}

// All outputs; kRatio = r, or 0 for a runtime r. Two loops, so that each keeps its few live
// values in registers: the per-request metadata, then the page ids of each request.
template <bool kSlotForm, int32_t kRatio, bool kPrefill>
PA_INLINE void write_all(const WriteArgs a, int32_t* __restrict qo_indptr,
                         int32_t* __restrict kv_indptr, int32_t* __restrict indices,
                         int32_t* __restrict last_page_len, int32_t* __restrict kv_lens) {
  const Divisor page = a.page;
  const uint32_t page_size = a.page_size;
  const int32_t* __restrict seq_lens = a.seq_lens;
  uint32_t pages = 0, rows = 0;
  qo_indptr[0] = 0;
  kv_indptr[0] = 0;
  for (int32_t r = 0; r < a.num_reqs; ++r) {
    const uint32_t len = static_cast<uint32_t>(seq_lens[r]);
    const uint32_t count = page.ceil_div(len);
    pages += count;
    rows += kPrefill ? static_cast<uint32_t>(a.q_lens[r]) : 1u;
    kv_indptr[r + 1] = static_cast<int32_t>(pages);
    qo_indptr[r + 1] = static_cast<int32_t>(rows);
    last_page_len[r] = static_cast<int32_t>(len - (count > 0 ? (count - 1) * page_size : 0));
    kv_lens[r] = static_cast<int32_t>(len);
  }
  // Padding requests: no pages; one query row each for decode, none for prefill.
  for (int32_t r = a.num_reqs; r < a.batch; ++r) {
    rows += kPrefill ? 0u : 1u;
    kv_indptr[r + 1] = static_cast<int32_t>(pages);
    qo_indptr[r + 1] = static_cast<int32_t>(rows);
    last_page_len[r] = 0;
    kv_lens[r] = 0;
  }

  const uint32_t ratio = kRatio > 0 ? kRatio : a.ratio;
  const Divisor alloc = a.alloc;
  const uint32_t alloc_page_size = a.alloc_page_size;
  const int32_t* __restrict table = a.table;
  const int64_t row_stride = a.row_stride;
  for (int32_t r = 0; r < a.num_reqs; ++r) {
    const int32_t* __restrict row = table + r * row_stride;
    int32_t* __restrict out = indices + kv_indptr[r];
    const uint32_t count = static_cast<uint32_t>(kv_indptr[r + 1] - kv_indptr[r]);
    if constexpr (!kSlotForm && kRatio == 1) {
      for (uint32_t i = 0; i < count; ++i) out[i] = row[i];
    } else {
      const uint32_t full = count / ratio;
      for (uint32_t block = 0; block < full; ++block) {
        // Slot form: one slot per allocation page is read, A slots apart; prefetch ahead so
        // the strided reads overlap instead of waiting on memory one by one.
        if constexpr (kSlotForm) __builtin_prefetch(row + (block + 16) * alloc_page_size);
        const uint32_t first = first_page<kSlotForm>(row, block, ratio, alloc_page_size, alloc);
        for (uint32_t k = 0; k < ratio; ++k) out[block * ratio + k] = first + k;
      }
      const uint32_t rest = count - full * ratio;
      if (rest > 0) {
        const uint32_t first = first_page<kSlotForm>(row, full, ratio, alloc_page_size, alloc);
        for (uint32_t k = 0; k < rest; ++k) out[full * ratio + k] = first + k;
      }
    }
  }
}

template <bool kSlotForm, int32_t kRatio>
PA_INLINE void write_mode(const WriteArgs& a, const PlanBuffers& out) {
  if (a.q_lens != nullptr) {
    write_all<kSlotForm, kRatio, true>(a, out.qo_indptr.data(), out.kv_indptr.data(),
                                       out.kv_indices.data(), out.kv_last_page_len.data(),
                                       out.kv_lens.data());
  } else {
    write_all<kSlotForm, kRatio, false>(a, out.qo_indptr.data(), out.kv_indptr.data(),
                                        out.kv_indices.data(), out.kv_last_page_len.data(),
                                        out.kv_lens.data());
  }
}

template <bool kSlotForm>
PA_INLINE void write_form(const WriteArgs& b, const PlanBuffers& out) {
  switch (b.ratio) {
    case 1:
      return write_mode<kSlotForm, 1>(b, out);
    case 2:
      return write_mode<kSlotForm, 2>(b, out);
    case 4:
      return write_mode<kSlotForm, 4>(b, out);
    case 8:
      return write_mode<kSlotForm, 8>(b, out);
    case 16:
      return write_mode<kSlotForm, 16>(b, out);
    case 32:
      return write_mode<kSlotForm, 32>(b, out);
    case 64:
      return write_mode<kSlotForm, 64>(b, out);
    default:
      return write_mode<kSlotForm, 0>(b, out);
  }
}

}  // namespace

namespace {

enum class RowCheck { kBlockIds, kSlotsPerToken, kSlotsPow2, kSlotsAny };

// Whether any request of the batch is invalid, without a branch per request: bad bits are ORed
// over the whole batch (a request with bad lengths has its row skipped, not read).
template <RowCheck kCheck, bool kPrefill>
PA_INLINE bool any_invalid(const BatchView& b) {
  const int32_t* __restrict seq_lens = b.seq_lens;
  const int32_t* __restrict q_lens = b.q_lens;
  const int32_t* __restrict table = b.table;
  const int64_t row_stride = b.row_stride, tokens_per_row = b.tokens_per_row;
  const Divisor alloc = b.alloc;
  const uint32_t page_limit = b.page_limit, slot_limit = b.slot_limit;
  uint32_t bad = 0;
  for (int32_t r = 0; r < b.num_reqs; ++r) {
    const int32_t len = seq_lens[r];
    uint32_t length_bad = (len < 0) | (len > tokens_per_row);
    if constexpr (kPrefill) length_bad |= (q_lens[r] < 0) | (q_lens[r] > len);
    bad |= length_bad;
    const uint32_t tokens = length_bad != 0 ? 0u : static_cast<uint32_t>(len);
    const int32_t* row = table + r * row_stride;
    if constexpr (kCheck == RowCheck::kBlockIds) {
      bad |= bad_block_ids(row, alloc.ceil_div(tokens), page_limit);
    } else if constexpr (kCheck == RowCheck::kSlotsPerToken) {
      bad |= bad_block_ids(row, tokens, slot_limit);  // A = 1: every token starts a page
    } else if constexpr (kCheck == RowCheck::kSlotsPow2) {
      bad |= bad_slots_pow2(row, tokens, alloc.value, slot_limit);
    } else {
      bad |= bad_slots_any(row, tokens, alloc, slot_limit);
    }
  }
  return bad != 0;
}

template <RowCheck kCheck>
PA_INLINE bool any_invalid_mode(const BatchView& b) {
  return b.q_lens != nullptr ? any_invalid<kCheck, true>(b) : any_invalid<kCheck, false>(b);
}

// The first invalid request (the batch is known to hold one).
int32_t first_invalid(const BatchView& b) {
  BatchView one = b;
  for (int32_t r = 0; r < b.num_reqs; ++r) {
    one.num_reqs = 1;
    one.table = b.row(r);
    one.seq_lens = b.seq_lens + r;
    one.q_lens = b.q_lens != nullptr ? b.q_lens + r : nullptr;
    if (!b.slot_form) {
      if (any_invalid_mode<RowCheck::kBlockIds>(one)) return r;
    } else if (any_invalid_mode<RowCheck::kSlotsAny>(one)) {
      return r;
    }
  }
  return -1;
}

}  // namespace

PA_PLANNER_CLONES int32_t first_invalid_request(const BatchView& b) {
  bool bad = false;
  if (!b.slot_form) {
    bad = any_invalid_mode<RowCheck::kBlockIds>(b);
  } else if (b.alloc.value == 1) {
    bad = any_invalid_mode<RowCheck::kSlotsPerToken>(b);
  } else if (b.alloc.shift >= 1) {
    bad = any_invalid_mode<RowCheck::kSlotsPow2>(b);
  } else {
    bad = any_invalid_mode<RowCheck::kSlotsAny>(b);
  }
  return bad ? first_invalid(b) : -1;
}

Totals sum_totals(const BatchView& b) {
  Totals t;
  for (int32_t r = 0; r < b.num_reqs; ++r) {
    const int32_t len = b.seq_lens[r];
    t.pages += b.page.ceil_div(static_cast<uint32_t>(len));
    t.max_kv_len = std::max(t.max_kv_len, len);
  }
  if (b.q_lens != nullptr) {
    for (int32_t r = 0; r < b.num_reqs; ++r) {
      t.rows += b.q_lens[r];
      t.max_q_len = std::max(t.max_q_len, b.q_lens[r]);
    }
  } else {
    t.rows = b.batch;
    t.max_q_len = b.batch > 0 ? 1 : 0;
  }
  return t;
}

PA_PLANNER_CLONES PA_NO_MEMCPY_CALLS void write_plan(const BatchView& b, const PlanBuffers& out) {
  const WriteArgs args{b.table,
                       b.row_stride,
                       b.seq_lens,
                       b.q_lens,
                       b.num_reqs,
                       b.batch,
                       static_cast<uint32_t>(b.alloc_page_size),
                       static_cast<uint32_t>(b.page_size),
                       static_cast<uint32_t>(b.ratio),
                       b.alloc,
                       b.page};
  if (b.slot_form) {
    write_form<true>(args, out);
  } else {
    write_form<false>(args, out);
  }
}

}  // namespace pagedattn::planner
