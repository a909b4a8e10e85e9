// The full check of a step's metadata values on the host (StepMetadata's arrays, read as host
// int32 arrays): every request's KV range, kv_last_page_len, page ids against the pool, the query
// ranges, q_len <= kv_len and the max_q_len hint. One definition with one set of messages, shared
// by the CPU backend (every run_*, before anything is written: cpu_validate.cpp) and the CUDA
// backends' validating mode (WorkspaceLimits::validate_metadata: cuda/metadata_validate.cpp copies
// the device metadata to the host first). The device kernels check the same rules as they run
// (cuda/common/guard.cuh) without a sync, and record the first violation instead of throwing.
#pragma once

#include <cstdint>

namespace pagedattn {

// The arrays (host memory, contiguous int32).
struct MetadataArrays {
  int32_t batch = 0;
  const int32_t* qo_indptr = nullptr;   // [batch + 1]; null: one query row per request
  const int32_t* kv_indptr = nullptr;   // [batch + 1]
  const int32_t* kv_indices = nullptr;  // [num_indices] (may be null when num_indices is 0)
  int64_t num_indices = 0;
  const int32_t* kv_last_page_len = nullptr;  // [batch]
  int32_t max_q_len = 0;                      // StepMetadata::max_q_len (0: no hint)
};

// What the call knows to check the arrays against.
struct MetadataBounds {
  int32_t page_size = 0;             // attention page size P (>= 1)
  int64_t num_attention_pages = -1;  // the pool's; -1: unknown (page ids are not checked)
  int64_t rows = -1;                 // query rows T of the call; -1: unknown
  bool one_row_per_request = false;  // decode: qo_indptr, when given, is 0, 1, ..., batch
};

// Throws Error naming the first bad entry, its value and what was expected. Order: kv_indptr[0],
// then per request kv_indptr (decreasing) and kv_last_page_len ([1, P] for a request with pages,
// [0, P] without), kv_indices' length, the page ids, then the query rows: decode's identity
// qo_indptr, or qo_indptr[0] = 0, non-decreasing, qo_indptr[batch] = rows, each q_len within
// max_q_len and within the request's kv_len (a request's query rows are the last q_len of its
// keys; a lone row over no KV, a decode batch's padding, is allowed: it writes 0 / -inf).
void check_metadata_values(const MetadataArrays& arrays, const MetadataBounds& bounds);

}  // namespace pagedattn
