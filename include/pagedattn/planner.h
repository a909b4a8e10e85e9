// The host planner ("input preparation"): turns the engine's tables into the CSR metadata the
// attention operations read, in caller-owned fixed-capacity buffers.
//
// Inputs, in either form engines use:
//   BlockTableInput: block_table [num_reqs, row_stride] of allocation-page ids (vLLM style);
//   SlotTableInput:  slots [num_reqs, row_stride], slot = page * alloc_page_size + offset
//                    (SGLang style; page ids are read every alloc_page_size tokens).
// with seq_lens [num_reqs] (the whole KV length, new tokens included) and, for prefill/extend,
// q_lens [num_reqs] (the new tokens; the rest of seq_len is a cached prefix).
//
// Outputs, for a batch padded to `padded_batch` requests (padding requests have no pages):
//   qo_indptr        [padded_batch + 1]  query rows; decode: one per request, padding included
//   kv_indptr        [padded_batch + 1]  into kv_indices
//   kv_indices       [kv_indptr[B]]      attention-page ids (see kv_cache.h), P = page_size
//   kv_last_page_len [padded_batch]      in [1, P]; 0 for a request with no pages
//   kv_lens          [padded_batch]      (pages - 1) * P + last_page_len
// and, on request, the split-KV work partition (split_kv_partition below).
//
// Attention pages: with r = alloc_page_size / P, allocation page b is attention pages
// b*r .. b*r + r - 1; a request of seq_len tokens has ceil(seq_len / P) of them (the last one
// partial when P does not divide seq_len). Padding requests and empty requests have no pages,
// kv_last_page_len 0 and kv_lens 0; a padding request has one query row in decode, none in
// prefill. With validate = false only the arguments' sizes and the buffer capacities are checked,
// not the lengths and page ids (a trusted hot path: the table must then be valid, or the output
// is unspecified). Cost: see bench/RESULTS.md (`pagedattn bench plan`).
#pragma once

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace pagedattn {

struct BlockTableInput {
  std::span<const int32_t> block_table;  // [num_reqs, row_stride], allocation-page ids
  int64_t row_stride = 0;                // max blocks per request
};

struct SlotTableInput {
  std::span<const int32_t> slots;  // [num_reqs, row_stride], page * alloc_page_size + offset
  int64_t row_stride = 0;          // max tokens per request
};

struct PlanInput {
  std::variant<BlockTableInput, SlotTableInput> table;
  int32_t num_reqs = 0;
  std::span<const int32_t> seq_lens;  // [num_reqs]
  std::span<const int32_t> q_lens;    // [num_reqs] for prefill/extend; empty for decode
  int32_t alloc_page_size = 0;
  int32_t page_size = 0;        // attention page size P; divides alloc_page_size
  int64_t num_alloc_pages = 0;  // size of the pool, for range checks
  int32_t padded_batch = 0;     // 0: no padding
  bool validate = true;         // off only on a trusted hot path
};

// Caller-owned buffers; their sizes are the capacities.
struct PlanBuffers {
  std::span<int32_t> qo_indptr;         // [>= padded_batch + 1]
  std::span<int32_t> kv_indptr;         // [>= padded_batch + 1]
  std::span<int32_t> kv_indices;        // [>= total attention pages]
  std::span<int32_t> kv_last_page_len;  // [>= padded_batch]
  std::span<int32_t> kv_lens;           // [>= padded_batch]
};

struct PlanSummary {
  int32_t num_reqs = 0;
  int32_t batch_size = 0;   // padded
  int64_t num_pages = 0;    // kv_indptr[batch_size]
  int64_t num_qo_rows = 0;  // qo_indptr[batch_size]
  int32_t max_q_len = 0;
  int32_t max_kv_len = 0;
};

// Fills `buffers`; throws Error naming the offending input (page id out of range, a length that
// does not fit the table, P not dividing alloc_page_size, a slot run that is not one contiguous
// page-aligned page, a buffer too small) before writing anything.
PlanSummary plan(const PlanInput& input, const PlanBuffers& buffers);

// Owning buffers of fixed capacity (what a workspace or a test holds).
class PlanStorage {
 public:
  PlanStorage(int32_t max_batch, int64_t max_pages);
  PlanBuffers buffers();
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens;
};

// ---- split-KV work partition ----
//
// A work item is one chunk of one request's KV (all its query rows and, in the kernels, one KV
// head group). The rule, shared by the host and the GPU planners so their outputs are equal:
//   chunk_pages = max(min_chunk_pages, ceil(total_pages / max(1, target_items)))
//   request r gets n_r = max(1, ceil(pages_r / chunk_pages)) items, in order;
//   item w covers pages [chunk * chunk_pages, min(pages_r, (chunk + 1) * chunk_pages)).
// Requests with n_r > 1 need a merge of their partial outputs (merge_indptr gives their items).
// Every request, padding and empty ones included, has at least one item (it writes its zero
// output). When `enable` is false every request is one item and chunk_pages = max(1, total).
struct SplitKvConfig {
  bool enable = true;
  int32_t target_items = 132;  // e.g. SMs * resident blocks / KV heads per block
  int32_t min_chunk_pages = 1;
};

struct SplitKvBuffers {
  std::span<int32_t> work_request;  // [>= items] request of each item
  std::span<int32_t> work_chunk;    // [>= items] chunk index within the request
  std::span<int32_t> merge_indptr;  // [>= batch + 1] items of request r: [merge_indptr[r], [r+1])
};

struct SplitKvSummary {
  int32_t num_items = 0;
  int32_t chunk_pages = 0;
  bool any_split = false;
};

// Upper bound on items for `batch` requests and `max_pages` pages: buffers of this size suffice.
int64_t split_kv_capacity(int32_t batch, int64_t max_pages, const SplitKvConfig& config);

SplitKvSummary split_kv_partition(std::span<const int32_t> kv_indptr, int32_t batch,
                                  const SplitKvConfig& config, const SplitKvBuffers& buffers);

}  // namespace pagedattn
