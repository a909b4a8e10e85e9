// The prologue the two decode kernels share (decode_tc_kernel.cuh, decode_kernel.cuh): what a
// CTA's work item of the split-KV partition (a chunk of one request's KV) and its head tile (a KV
// head and up to kMaxGroupPerCta of its query heads) stand for. One copy, so that the two kernels
// cannot disagree on a request's key range, its split flag or its window.
#pragma once

#include <cstdint>

#include "cuda/common/guard.cuh"
#include "cuda/decode/decode_params.h"

namespace pagedattn::cuda {

struct DecodeWork {
  int request = 0;
  bool split = false;   // the request has more than one item: partials, merged after
  int merge_first = 0;  // the request's first item in the partition
  int merge_items = 0;  // ... and its item count
  int page_begin = 0;   // the request's first entry of kv_indices
  int kv_len = 0;
  // This item's keys [tok_begin, tok_end): its chunk of the request's kv_len, from the sliding
  // window's first key on (tok_begin >= tok_end: nothing to see).
  int tok_begin = 0, tok_end = 0;
  int kv_head = 0;   // the head tile's KV head,
  int qo_head0 = 0;  // its first query head
  int heads = 0;     // and its query head count (<= kMaxGroupPerCta)
};

// The work of item `item` for head tile `head_tile`; false when the item is past the partition's
// count (nothing to do). The partition's reads go out together, before the count is known (one
// memory latency, not two, before the request's metadata): the grid never exceeds the partition
// arrays' capacity (run_decode bounds it by the workspace's max_items), and an entry past the
// count is read but not used. The request's reads (merge_indptr, kv_indptr, kv_last_page_len)
// then go out together too, and are checked (common/guard.cuh): a request whose KV metadata is
// bad gets no keys (its rows 0 / -inf).
__device__ __forceinline__ bool decode_work(const DecodeParams& p, int item, int head_tile,
                                            DecodeWork& w) {
  // Loads through L2 (ld.global.cg): the tensor-core kernel may issue them before its pdl_wait()
  // (DecodeParams::early_metadata), and no SM's L1 may hold a line of an earlier step's plan.
  const int num_items = __ldcg(&p.partition.info->num_items);
  const int request = __ldcg(p.partition.work_request + item);
  const int chunk = __ldcg(p.partition.work_chunk + item);
  const int64_t chunk_pages = __ldcg(&p.partition.info->chunk_pages);
  if (item >= num_items) return false;
  w.kv_head = head_tile / p.group_tiles;
  const int head_begin = (head_tile % p.group_tiles) * kMaxGroupPerCta;
  w.heads = min(kMaxGroupPerCta, p.group - head_begin);
  w.qo_head0 = w.kv_head * p.group + head_begin;

  w.request = request;
  w.merge_first = __ldcg(p.partition.merge_indptr + request);
  w.merge_items = __ldcg(p.partition.merge_indptr + request + 1) - w.merge_first;
  w.split = w.merge_items > 1;
  const int page_size = p.page_size;
  w.page_begin = __ldcg(p.kv_indptr + request);
  const int page_end = __ldcg(p.kv_indptr + request + 1);
  const int last_page_len = __ldcg(p.kv_last_page_len + request);
  // Metadata on trust (common/guard.h): a request with a bad KV range or last-page length runs
  // without KV (its rows 0 / -inf); the split partition gave it items as for its page count.
  const int num_pages = kv_metadata_ok(p.guard, p.kv_indices, request, w.page_begin, page_end,
                                       last_page_len, page_size)
                            ? page_end - w.page_begin
                            : 0;
  w.kv_len = num_pages == 0 ? 0 : (num_pages - 1) * page_size + last_page_len;
  const int64_t chunk_tokens = chunk_pages * page_size;
  w.tok_begin = static_cast<int>(min(static_cast<int64_t>(w.kv_len), chunk * chunk_tokens));
  w.tok_end = static_cast<int>(min(static_cast<int64_t>(w.kv_len), (chunk + 1) * chunk_tokens));
  if (p.window_left >= 0) w.tok_begin = max(w.tok_begin, w.kv_len - 1 - p.window_left);
  return true;
}

}  // namespace pagedattn::cuda
