// The GPU planner's kernels: the host planner's CSR metadata and the split-KV partition, computed
// on the device (API and checks: gpu_planner.cpp).
//
//   plan_lengths_kernel   one CTA of 1024 threads walks the batch 1024 requests at a time: each
//                         thread one request (length checks, pages = ceil(seq_len / P),
//                         last_page_len), a block-wide scan with a running carry gives kv_indptr
//                         and qo_indptr; padding requests get no pages (and one query row for
//                         decode).
//   plan_indices_kernel   one CTA per request writes its attention-page ids (allocation page b ->
//                         b * r .. b * r + r - 1) from the block table or the slots, checking page
//                         ids and, for slots, that each allocation page is one aligned contiguous
//                         run.
//   split_kv_kernel       one CTA: chunk_pages from kv_indptr[batch] (or the sum of the
//                         requests' pages, if larger: a bad kv_indptr), items per request, a
//                         scan for merge_indptr, then each request writes its items.
// Problems go to a status word (first one wins, atomicCAS), never to a trap. Each kernel is
// launched with programmatic dependent launch (cuda/launch.h): pdl_wait() is its first statement.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/common/pdl.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/planner/planner_kernels.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda {
namespace {

constexpr int kScanThreads = 1024;

struct SplitParams {
  const int32_t* kv_indptr;
  int32_t batch;
  bool enable;
  int32_t target_items;
  int32_t min_chunk_pages;
  int32_t* work_request;
  int32_t* work_chunk;
  int64_t capacity;
  int32_t* merge_indptr;
  PlanInfo* info;
};

__device__ void report(int32_t* status, int32_t code, int32_t request, int64_t position,
                       int64_t value) {
  if (atomicCAS(status, 0, code) == 0) {
    status[1] = request;
    status[2] = static_cast<int32_t>(position);
    status[3] = static_cast<int32_t>(value);
  }
}

__global__ void __launch_bounds__(kScanThreads) plan_lengths_kernel(const LengthsParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t carry_pages, carry_rows;
  const int tid = threadIdx.x;
  if (tid == 0) {
    carry_pages = 0;
    carry_rows = 0;
    p.kv_indptr[0] = 0;
    p.qo_indptr[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < p.batch; base += kScanThreads) {
    const int r = base + tid;
    int32_t pages = 0, rows = 0, last = 0, len = 0;
    if (r < p.num_reqs) {
      len = p.seq_lens[r];
      if (len < 0 || len > p.tokens_per_row) {
        report(p.status, kSeqLenOutOfRange, r, -1, len);
        len = len < 0 ? 0 : static_cast<int32_t>(p.tokens_per_row);
      }
      rows = 1;
      if (p.q_lens != nullptr) {
        rows = p.q_lens[r];
        if (rows < 0 || rows > len) {
          report(p.status, kQLenOutOfRange, r, -1, rows);
          rows = rows < 0 ? 0 : len;
        }
      }
      pages = (len + p.page_size - 1) / p.page_size;
      last = len == 0 ? 0 : (len - 1) % p.page_size + 1;
    } else if (r < p.batch) {
      rows = p.q_lens == nullptr ? 1 : 0;
    }
    int32_t pages_incl = 0, rows_incl = 0;
    Scan(temp).InclusiveSum(pages, pages_incl);
    __syncthreads();
    Scan(temp).InclusiveSum(rows, rows_incl);
    if (r < p.batch) {
      p.kv_indptr[r + 1] = carry_pages + pages_incl;
      p.qo_indptr[r + 1] = carry_rows + rows_incl;
      p.kv_last_page_len[r] = last;
      p.kv_lens[r] = len;
    }
    __syncthreads();
    if (tid == kScanThreads - 1) {
      carry_pages += pages_incl;
      carry_rows += rows_incl;
    }
    __syncthreads();
  }
  if (tid == 0 && carry_pages > p.indices_capacity) {
    report(p.status, kIndicesTooSmall, -1, -1, carry_pages);
  }
}

__global__ void __launch_bounds__(256) plan_indices_kernel(const IndicesParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  if (p.status[0] == kIndicesTooSmall) return;  // the plan does not fit: write nothing
  const int r = blockIdx.x;
  const int32_t begin = p.kv_indptr[r];
  const int32_t pages = p.kv_indptr[r + 1] - begin;
  const int32_t* row = p.table + r * p.row_stride;
  for (int j = threadIdx.x; j < pages; j += blockDim.x) {
    const int32_t block = j / p.ratio;
    const int32_t sub = j - block * p.ratio;
    int32_t alloc_page = 0;
    if (!p.slot_table) {
      alloc_page = row[block];
      if (alloc_page < 0 || alloc_page >= p.num_alloc_pages) {
        report(p.status, kBlockPageOutOfRange, r, block, alloc_page);
        alloc_page = 0;
      }
    } else {
      const int64_t position = int64_t{block} * p.alloc_page_size;
      const int32_t slot = row[position];
      if (slot < 0 || slot % p.alloc_page_size != 0) {
        report(p.status, kSlotUnaligned, r, position, slot);
        alloc_page = 0;
      } else {
        alloc_page = slot / p.alloc_page_size;
        if (alloc_page >= p.num_alloc_pages) {
          report(p.status, kSlotPageOutOfRange, r, position, slot);
          alloc_page = 0;
        }
      }
    }
    p.kv_indices[begin + j] = alloc_page * p.ratio + sub;
  }
  if (p.slot_table && p.validate) {
    const int32_t len = p.kv_lens[r];
    for (int pos = threadIdx.x; pos < len; pos += blockDim.x) {
      const int start = pos - pos % p.alloc_page_size;
      if (pos != start && row[pos] != row[start] + (pos - start)) {
        report(p.status, kSlotRunBroken, r, pos, row[pos]);
      }
    }
  }
}

__global__ void __launch_bounds__(kScanThreads) split_kv_kernel(const SplitParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  using Reduce = cub::BlockReduce<int64_t, kScanThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } temp;
  __shared__ int32_t carry;
  __shared__ int any_split;
  __shared__ int64_t request_pages;
  const int tid = threadIdx.x;
  // Metadata on trust (common/guard.h): a request whose kv_indptr pair is negative or decreasing
  // counts 0 pages (one item, which the attention kernel runs as a request without KV), and
  // chunk_pages comes from at least the sum of the requests' pages (and stays an int32), so that
  // the items never outnumber target_items + batch (the grid the attention kernels launch for
  // them: an item past the grid would never run, and its split request never be merged) whatever
  // kv_indptr holds. For a valid kv_indptr the sum is kv_indptr[batch] - kv_indptr[0] <=
  // kv_indptr[batch]: the rule of planner.h, unchanged.
  auto request_pages_of = [&](int r) -> int64_t {
    const int32_t begin = p.kv_indptr[r], end = p.kv_indptr[r + 1];
    return begin >= 0 && end >= begin ? end - begin : 0;
  };
  int64_t my_pages = 0;
  for (int r = tid; r < p.batch; r += kScanThreads) my_pages += request_pages_of(r);
  const int64_t sum_pages = Reduce(temp.reduce).Sum(my_pages);
  if (tid == 0) request_pages = sum_pages;
  __syncthreads();
  const int64_t total = max(static_cast<int64_t>(p.kv_indptr[p.batch]), request_pages);
  int64_t chunk_pages;
  if (p.enable) {
    const int64_t target = max(1, p.target_items);
    chunk_pages = max(static_cast<int64_t>(p.min_chunk_pages), (total + target - 1) / target);
  } else {
    chunk_pages = max(int64_t{1}, total);
  }
  chunk_pages = min(chunk_pages, static_cast<int64_t>(INT32_MAX));
  if (tid == 0) {
    carry = 0;
    any_split = 0;
    p.merge_indptr[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < p.batch; base += kScanThreads) {
    const int r = base + tid;
    int32_t items = 0;
    if (r < p.batch) {
      const int64_t pages = request_pages_of(r);
      items = static_cast<int32_t>(max(int64_t{1}, (pages + chunk_pages - 1) / chunk_pages));
    }
    int32_t incl = 0;
    Scan(temp.scan).InclusiveSum(items, incl);
    if (r < p.batch) {
      const int32_t end = carry + incl;
      p.merge_indptr[r + 1] = end;
      for (int32_t c = 0; c < items; ++c) {
        const int64_t item = end - items + c;
        if (item < p.capacity) {
          p.work_request[item] = r;
          p.work_chunk[item] = c;
        }
      }
      if (items > 1) any_split = 1;
    }
    __syncthreads();
    if (tid == kScanThreads - 1) carry += incl;
    __syncthreads();
  }
  if (tid == 0) {
    p.info->num_items = carry;
    p.info->chunk_pages = static_cast<int32_t>(chunk_pages);
    p.info->any_split = any_split;
    p.info->error = carry > p.capacity ? 1 : 0;
  }
}

}  // namespace

void launch_plan_lengths(const LengthsParams& params, void* stream) {
  launch_kernel(plan_lengths_kernel, 1, kScanThreads, 0, static_cast<cudaStream_t>(stream), params);
  check_launch("plan_lengths_kernel");
}

void launch_plan_indices(const IndicesParams& params, int32_t num_reqs, void* stream) {
  if (num_reqs == 0) return;
  launch_kernel(plan_indices_kernel, num_reqs, 256, 0, static_cast<cudaStream_t>(stream), params);
  check_launch("plan_indices_kernel");
}

void launch_split_kv(const int32_t* kv_indptr, int32_t batch, const SplitKvConfig& config,
                     int32_t* work_request, int32_t* work_chunk, int64_t capacity,
                     int32_t* merge_indptr, PlanInfo* info, void* stream) {
  SplitParams params{
      kv_indptr,    batch,      config.enable, config.target_items, config.min_chunk_pages,
      work_request, work_chunk, capacity,      merge_indptr,        info};
  launch_kernel(split_kv_kernel, 1, kScanThreads, 0, static_cast<cudaStream_t>(stream), params);
  check_launch("split_kv_kernel");
}

}  // namespace pagedattn::cuda
