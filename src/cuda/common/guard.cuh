// The metadata guards of the CUDA kernels, device side (the contract and the record: guard.h).
// Every check is a compare or two on values the kernel has loaded anyway; the report is out of
// line, on the path that meets a violation only.
//
// Recording: the record lives in host-mapped memory; its claim word in device memory. The host
// sets record->generation = g (g >= 1) and clears the code; the first fault after that wins
// atomicCAS(claim, g - 1, g), writes the fields, then the code. Later faults find the claim taken
// (sticky) until the host clears the record and moves the generation on (fault_log.cpp): no
// device memory is reset from the host, so the scheme holds inside CUDA graphs.
#pragma once

#include <cstdint>

#include "cuda/common/guard.h"

namespace pagedattn::cuda {

// Records a fault unless one is recorded already (see above). Out of line: the checks' fast path
// keeps no registers for it.
__device__ __noinline__ inline void record_fault(FaultRecord* record, int32_t* claim, int32_t op,
                                                 int32_t code, int32_t request, int64_t index,
                                                 int64_t value, int64_t limit) {
  if (record == nullptr) return;
  volatile FaultRecord* out = record;
  const int32_t generation = out->generation;
  if (atomicCAS(claim, generation - 1, generation) != generation - 1) return;
  out->op = op;
  out->request = request;
  out->index = index;
  out->value = value;
  out->limit = limit;
  __threadfence_system();  // the fields reach the host before the code that announces them
  out->code = code;
}

__device__ __forceinline__ void report_fault(const MetadataGuard& g, int32_t code, int32_t request,
                                             int64_t index, int64_t value, int64_t limit) {
  record_fault(g.record, g.claim, g.op, code, request, index, value, limit);
}

// Whether `page` is an attention page of the cache (one unsigned compare: negative ids fail too).
__device__ __forceinline__ bool page_in_pool(const MetadataGuard& g, int page) {
  return static_cast<uint32_t>(page) < g.pool_pages;
}

__device__ __forceinline__ void report_page(const MetadataGuard& g, int request, int64_t index,
                                            int page) {
  report_fault(g, kFaultPageOutOfRange, request, index, page, g.pool_pages);
}

// A CTA's note of a page id outside the pool that its threads met: its position in kv_indices and
// the id in one 64-bit shared-memory word (a single atomic store: any thread's note is a
// consistent pair), so that the hot loop that meets it makes no call; one thread reports it at the
// kernel's end, once the accumulators are dead (report_noted_page), if the barrier that ORs the
// threads' flags said that a thread met one. Never read otherwise: no initialisation needed.
// The word is the caller's: a static one (cta_bad_page_note) where the kernel's shared memory has
// room, a slot of its dynamic layout where it does not (MLA: a static variable there would be
// padded to the 1024-byte alignment of another kernel's dynamic array in the same module).
__device__ __forceinline__ unsigned long long* cta_bad_page_note() {
  __shared__ unsigned long long note;
  return &note;
}
__device__ __forceinline__ void note_bad_page(unsigned long long* note, int64_t index, int page) {
  atomicExch(note, (static_cast<unsigned long long>(index) << 32) | static_cast<uint32_t>(page));
}
__device__ __forceinline__ void report_noted_page(const MetadataGuard& g, int request,
                                                  const unsigned long long* note) {
  const unsigned long long word = *note;
  report_page(g, request, static_cast<int64_t>(word >> 32),
              static_cast<int>(static_cast<uint32_t>(word & 0xffffffffu)));
}

// Request `request`'s KV metadata: pages [page_begin, page_end) of kv_indices and
// last_page_len. True when the kernel may read them; else the fault is reported and the request
// must be run without KV (its rows 0 / -inf). An empty pool fails any request with pages (no id
// can be valid, and the kernels that read a substitute page need page 0 to exist).
__device__ __forceinline__ bool kv_metadata_ok(const MetadataGuard& g, const int32_t* kv_indices,
                                               int request, int page_begin, int page_end,
                                               int last_page_len, int page_size) {
  const bool has_pages = page_end > page_begin;
  if (page_begin >= 0 && page_end <= g.num_indices && page_end >= page_begin &&
      last_page_len >= (has_pages ? 1 : 0) && last_page_len <= page_size &&
      (!has_pages || g.pool_pages > 0)) [[likely]] {
    return true;
  }
  if (page_end < page_begin) {
    report_fault(g, kFaultKvIndptrDecreasing, request, page_begin, page_end, 0);
  } else if (page_begin < 0 || page_end > g.num_indices) {
    report_fault(g, kFaultKvIndptrPastIndices, request, page_begin, page_end, g.num_indices);
  } else if (last_page_len < (has_pages ? 1 : 0) || last_page_len > page_size) {
    report_fault(g, kFaultLastPageLen, request, page_end - page_begin, last_page_len, page_size);
  } else {
    report_page(g, request, page_begin, kv_indices[page_begin]);
  }
  return false;
}

// Request `request`'s query rows [q_begin, q_end) (prefill, MLA): inside the call's rows, not
// decreasing, within the max_q_len hint when there is one. False (reported): nothing may be
// read or written for the request.
__device__ __forceinline__ bool query_rows_ok(const MetadataGuard& g, int request, int q_begin,
                                              int q_end) {
  if (q_begin >= 0 && q_end >= q_begin && q_end <= g.num_rows &&
      (g.max_q_len <= 0 || q_end - q_begin <= g.max_q_len)) [[likely]] {
    return true;
  }
  if (q_begin < 0 || q_end < q_begin || q_end > g.num_rows) {
    report_fault(g, kFaultQoIndptr, request, q_begin, q_end, g.num_rows);
  } else {
    report_fault(g, kFaultQLenOverMax, request, 0, q_end - q_begin, g.max_q_len);
  }
  return false;
}

// A request's query rows are the last q_len of its kv_len keys: q_len <= kv_len, except a lone row
// over no KV (a padded decode batch's filler). False (reported): run the request without KV.
__device__ __forceinline__ bool q_len_within_kv(const MetadataGuard& g, int request, int q_len,
                                                int kv_len) {
  if (q_len <= kv_len || (q_len == 1 && kv_len == 0)) [[likely]] {
    return true;
  }
  report_fault(g, kFaultQLenOverKvLen, request, 0, q_len, kv_len);
  return false;
}

// The poisoned partial lse (guard.h) and its test.
__device__ __forceinline__ float poisoned_partial() {
  return __uint_as_float(kPoisonedPartialBits);
}
__device__ __forceinline__ bool is_poisoned(float lse) {
  return __float_as_uint(lse) == kPoisonedPartialBits;
}

}  // namespace pagedattn::cuda
