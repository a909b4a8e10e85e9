// The split-KV work partition on the host (the rule is documented in planner.h; the GPU planner
// implements the same rule and is tested for equality with this one).
//
// Two passes over kv_indptr: count the items (to check the caller's capacities before writing),
// then write work_request / work_chunk in request order and merge_indptr, the CSR of each
// request's items.
#include <algorithm>

#include "core/check.h"
#include "pagedattn/planner.h"

namespace pagedattn {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Items of a request with `pages` attention pages.
int64_t items_of(int64_t pages, int64_t chunk_pages) {
  return std::max<int64_t>(1, ceil_div(pages, chunk_pages));
}

}  // namespace

int64_t split_kv_capacity(int32_t batch, int64_t max_pages, const SplitKvConfig& config) {
  PA_CHECK(batch >= 0, "split_kv_capacity: batch = {}, expected >= 0", batch);
  PA_CHECK(max_pages >= 0, "split_kv_capacity: max_pages = {}, expected >= 0", max_pages);
  if (!config.enable) return batch;
  // Items = sum over requests of max(1, ceil(p_r / c)) <= batch + sum(p_r) / c, and
  // c >= ceil(total / target) and c >= min_chunk_pages bound sum(p_r) / c.
  const int64_t target = std::max<int32_t>(1, config.target_items);
  const int64_t min_chunk = std::max<int32_t>(1, config.min_chunk_pages);
  return batch + std::min(target, max_pages / min_chunk);
}

SplitKvSummary split_kv_partition(std::span<const int32_t> kv_indptr, int32_t batch,
                                  const SplitKvConfig& config, const SplitKvBuffers& buffers) {
  PA_CHECK(batch >= 0, "split_kv_partition: batch = {}, expected >= 0", batch);
  PA_CHECK(kv_indptr.size() >= static_cast<size_t>(batch) + 1,
           "split_kv_partition: kv_indptr has {} entries, expected batch + 1 = {}",
           kv_indptr.size(), int64_t{batch} + 1);
  PA_CHECK(config.min_chunk_pages >= 1, "split_kv_partition: min_chunk_pages = {}, expected >= 1",
           config.min_chunk_pages);
  PA_CHECK(kv_indptr[0] == 0, "split_kv_partition: kv_indptr[0] = {}, expected 0", kv_indptr[0]);
  for (int32_t r = 0; r < batch; ++r) {
    PA_CHECK(kv_indptr[r + 1] >= kv_indptr[r],
             "split_kv_partition: kv_indptr[{}] = {} < kv_indptr[{}] = {}, expected "
             "non-decreasing",
             r + 1, kv_indptr[r + 1], r, kv_indptr[r]);
  }
  const int64_t total_pages = kv_indptr[batch];
  int64_t chunk_pages = 0;
  if (config.enable) {
    const int64_t target = std::max<int32_t>(1, config.target_items);
    chunk_pages = std::max<int64_t>(config.min_chunk_pages, ceil_div(total_pages, target));
  } else {
    chunk_pages = std::max<int64_t>(1, total_pages);  // >= every request: one item each
  }

  int64_t num_items = 0;
  for (int32_t r = 0; r < batch; ++r) {
    num_items += items_of(kv_indptr[r + 1] - kv_indptr[r], chunk_pages);
  }
  PA_CHECK(static_cast<int64_t>(buffers.work_request.size()) >= num_items,
           "split_kv_partition: work_request holds {} entries, expected at least {} items",
           buffers.work_request.size(), num_items);
  PA_CHECK(static_cast<int64_t>(buffers.work_chunk.size()) >= num_items,
           "split_kv_partition: work_chunk holds {} entries, expected at least {} items",
           buffers.work_chunk.size(), num_items);
  PA_CHECK(buffers.merge_indptr.size() >= static_cast<size_t>(batch) + 1,
           "split_kv_partition: merge_indptr holds {} entries, expected batch + 1 = {}",
           buffers.merge_indptr.size(), int64_t{batch} + 1);

  SplitKvSummary summary;
  summary.chunk_pages = static_cast<int32_t>(chunk_pages);
  int32_t item = 0;
  buffers.merge_indptr[0] = 0;
  for (int32_t r = 0; r < batch; ++r) {
    const int64_t items = items_of(kv_indptr[r + 1] - kv_indptr[r], chunk_pages);
    summary.any_split |= items > 1;
    for (int32_t chunk = 0; chunk < items; ++chunk, ++item) {
      buffers.work_request[item] = r;
      buffers.work_chunk[item] = chunk;
    }
    buffers.merge_indptr[r + 1] = item;
  }
  summary.num_items = item;
  return summary;
}

}  // namespace pagedattn
