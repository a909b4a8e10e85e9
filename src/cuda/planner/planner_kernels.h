// The GPU planner kernels (planner_kernels.cu) and their raw-pointer launchers, used by the public
// API (gpu_planner.cpp, include/pagedattn/cuda_planner.h) and by the backend's plan(). Host-side
// declarations only, no CUDA types.
#pragma once

#include <cstdint>

#include "pagedattn/planner.h"

namespace pagedattn::cuda {

struct PlanInfo;

// The status word's codes (status[0]; status[1..3] = request, position, value).
enum PlanStatusCode : int32_t {
  kPlanOk = 0,
  kSeqLenOutOfRange = 1,
  kQLenOutOfRange = 2,
  kBlockPageOutOfRange = 3,
  kSlotUnaligned = 4,
  kSlotPageOutOfRange = 5,
  kSlotRunBroken = 6,
  kIndicesTooSmall = 7,
};

struct LengthsParams {
  const int32_t* seq_lens;
  const int32_t* q_lens;  // null: decode
  int32_t num_reqs;
  int32_t batch;
  int32_t page_size;
  int64_t tokens_per_row;
  int64_t indices_capacity;
  int32_t* qo_indptr;
  int32_t* kv_indptr;
  int32_t* kv_last_page_len;
  int32_t* kv_lens;
  int32_t* status;
};

struct IndicesParams {
  const int32_t* table;
  int64_t row_stride;  // elements between rows
  bool slot_table;
  bool validate;
  int32_t alloc_page_size;
  int32_t ratio;  // alloc_page_size / page_size
  int64_t num_alloc_pages;
  const int32_t* kv_indptr;
  const int32_t* kv_lens;
  int32_t* kv_indices;
  int32_t* status;
};

// The CSR metadata: lengths, indptrs (one CTA), then the page ids (one CTA per request).
void launch_plan_lengths(const LengthsParams& params, void* stream);
void launch_plan_indices(const IndicesParams& params, int32_t num_reqs, void* stream);

// The split-KV partition (planner.h's rule) of kv_indptr [batch + 1]; items beyond `capacity`
// are not written and info->error is set. config.min_chunk_pages must be >= 1.
void launch_split_kv(const int32_t* kv_indptr, int32_t batch, const SplitKvConfig& config,
                     int32_t* work_request, int32_t* work_chunk, int64_t capacity,
                     int32_t* merge_indptr, PlanInfo* info, void* stream);

}  // namespace pagedattn::cuda
