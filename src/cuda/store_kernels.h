// The device store's kernels (store_kernels.cu) and their launchers; the API and its checks are in
// store.cpp (include/pagedattn/cuda_store.h). Host-side declarations only.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// One pool's part of a store: [num_tokens, rows, width] input rows into a cache whose row
// (page, offset, row) starts at page * stride_page + offset * stride_token + row * stride_row
// (elements).
struct StoreRows {
  void* cache;
  int64_t stride_page, stride_token, stride_row;
  float scale;  // fp8 caches: stored = value / scale
  const void* input;
  DType input_dtype;  // f32 / f16 / bf16
  int64_t in_stride_token, in_stride_row, in_stride_elem;
  int64_t rows, width;
};

// The parts stored by one launch (K and V, or ckv and kpe), all into caches of one dtype and
// through the same slots.
constexpr int kMaxStoreParts = 2;
struct StoreBatch {
  StoreRows part[kMaxStoreParts];
  int32_t num_parts;  // 1 .. kMaxStoreParts
  int64_t alloc_page_size, num_slots;
  const void* slots;
  bool slots_i64;
  int64_t slots_stride;
  const int32_t* status;  // null: skip bad slots
};

// Records the first slot >= num_slots in status[0..3] (1, token, slot high, slot low).
void launch_check_slots(const void* slots, bool slots_i64, int64_t stride, int64_t num_tokens,
                        int64_t num_slots, int32_t* status, void* stream);
// Converts and writes every part's rows in one launch (nothing at all if status is set and
// nonzero).
void launch_store(DType cache_dtype, const StoreBatch& batch, int64_t num_tokens, void* stream);

}  // namespace pagedattn::cuda
