// The GPU planner: the host planner's metadata (planner.h), built on the device from tables that
// live in device memory, with no host synchronisation (graph-capturable). Host API only: device
// pointers travel as TensorViews and the stream as a void* (a cudaStream_t).
//
//   plan_on_device()        block table or token->slot table + seq_lens (+ q_lens) ->
//                           qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens;
//   split_kv_on_device()    kv_indptr -> the split-KV work partition, by exactly the rule in
//                           planner.h (its outputs equal split_kv_partition()'s).
// Both equal the host functions on valid input (tested). What the host planner would throw for
// (a page id out of range, a length that does not fit the table row, a slot run that is not one
// contiguous page-aligned page, a buffer too small) is reported through a device status word
// instead: the first problem found is recorded, offending page ids are written as 0 (so a kernel
// run on the result stays in bounds), and read_plan_status() turns it into an Error.
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/planner.h"
#include "pagedattn/tensor.h"

namespace pagedattn::cuda {

struct DevicePlanInput {
  TensorView table;         // [num_reqs, row_stride] i32: allocation-page ids, or slots
  bool slot_table = false;  // table holds slots (page * alloc_page_size + offset)
  TensorView seq_lens;      // [num_reqs] i32
  TensorView q_lens;        // [num_reqs] i32 for prefill/extend; undefined for decode
  int32_t num_reqs = 0;
  int32_t alloc_page_size = 0;
  int32_t page_size = 0;  // P, divides alloc_page_size
  int64_t num_alloc_pages = 0;
  int32_t padded_batch = 0;  // 0: no padding
  bool validate = true;      // off: skip the per-token slot-run checks (page ids still clamped)
};

// Device i32 views; their sizes are the capacities. status: [>= 4] i32, see read_plan_status.
struct DevicePlanBuffers {
  TensorView qo_indptr;         // [>= batch + 1]
  TensorView kv_indptr;         // [>= batch + 1]
  TensorView kv_indices;        // [>= total attention pages]
  TensorView kv_last_page_len;  // [>= batch]
  TensorView kv_lens;           // [>= batch]
  TensorView status;            // [>= 4]: code, request, position, value (0 = ok)
};

// Enqueues the planner on `stream`. Host-side checks (shapes, dtypes, devices, capacities that
// the host can know) throw Error before anything is enqueued.
void plan_on_device(const DevicePlanInput& input, const DevicePlanBuffers& buffers, void* stream);

// The split-KV partition of kv_indptr [batch + 1] (device). info: [>= 4] i32 receives
// num_items, chunk_pages, any_split, error (nonzero: work_request/work_chunk too small).
struct DeviceSplitKvBuffers {
  TensorView work_request;  // [>= split_kv_capacity(...)]
  TensorView work_chunk;
  TensorView merge_indptr;  // [>= batch + 1]
  TensorView info;          // [>= 4]
};
void split_kv_on_device(const TensorView& kv_indptr, int32_t batch, const SplitKvConfig& config,
                        const DeviceSplitKvBuffers& buffers, void* stream);

// Waits for `stream` and throws Error describing the first problem the planner recorded in
// `status` (nothing when the plan was valid).
void read_plan_status(const TensorView& status, void* stream);

}  // namespace pagedattn::cuda
