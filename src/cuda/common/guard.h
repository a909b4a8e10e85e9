// The metadata guards of the CUDA kernels, their host-visible side: what a kernel needs to check
// the step metadata it turns into addresses (MetadataGuard, a member of every kernel's
// parameters), and the record of the first violation (FaultRecord, in host-mapped pinned memory
// owned by the workspace: cuda/fault_log.h). No CUDA types: included by the host launchers and by
// the kernels (the device side is guard.cuh).
//
// The contract (run_* takes the metadata on trust, with no host sync): whatever the metadata
// says, no kernel reads or writes outside the cache, the metadata arrays, q or out. A request
// whose KV metadata is bad (kv_indptr decreasing or outside kv_indices, kv_last_page_len out of
// range, q_len > kv_len) is run as a request without KV: its rows get out = 0 and lse = -inf. A
// page id outside the pool is not read (zero-filled, or page 0 read in its place and masked);
// the rows of the CTAs that met it get 0 / -inf, split requests included (the item's partial lse
// is poisoned, kPoisonedPartialBits, and every merge writes a row with a poisoned partial as 0 /
// -inf). A request whose query range itself is bad (qo_indptr decreasing or outside q's rows, or
// a q_len past the max_q_len hint the grid was sized by) has no rows to trust: nothing is written
// for it. Every violation is recorded, the first one wins; the workspace's
// check_device_errors() reports it after the caller's sync.
#pragma once

#include <cstdint>

namespace pagedattn::cuda {

// FaultRecord::code; the fields each one fills, and the host's message, are in fault_log.cpp.
enum FaultCode : int32_t {
  kFaultNone = 0,
  // index: the position in kv_indices; value: the page id; limit: the pool's attention pages.
  kFaultPageOutOfRange = 1,
  // index: kv_indptr[request]; value: kv_indptr[request + 1].
  kFaultKvIndptrDecreasing = 2,
  // index, value: kv_indptr[request], kv_indptr[request + 1]; limit: kv_indices' entries.
  kFaultKvIndptrPastIndices = 3,
  // index: the request's pages; value: kv_last_page_len[request]; limit: P.
  kFaultLastPageLen = 4,
  // index, value: qo_indptr[request], qo_indptr[request + 1]; limit: q's rows.
  kFaultQoIndptr = 5,
  // value: q_len; limit: max_q_len.
  kFaultQLenOverMax = 6,
  // value: q_len; limit: kv_len.
  kFaultQLenOverKvLen = 7,
};

// The first violation since the host last cleared it. Written by the device (fields first, the
// code last); read by the host after a sync.
struct FaultRecord {
  int32_t code;        // FaultCode (0: none)
  int32_t op;          // OpKind of the call
  int32_t request;     // the request's index in the batch
  int32_t generation;  // written by the host only: what a new fault's claim must win (guard.cuh)
  int64_t index;
  int64_t value;
  int64_t limit;
};

// What a kernel checks the metadata against, and where it records a violation.
struct MetadataGuard {
  FaultRecord* record = nullptr;  // the device's pointer to the host-mapped record (null: none)
  int32_t* claim = nullptr;       // device memory: the generation of the last recorded fault
  uint32_t pool_pages = 0;        // attention pages in the cache: valid ids are [0, pool_pages)
  int64_t num_indices = 0;        // entries of kv_indices
  int64_t num_rows = 0;           // query rows of the call (q.shape[0])
  int32_t max_q_len = 0;          // the q_len bound the grid was sized by (0: none)
  int32_t op = 0;                 // OpKind, for the report
};

// MetadataGuard::pool_pages for a cache of `pages` attention pages: page ids are int32, so the
// bound stays below 2^31 (and a negative id, compared unsigned, can never pass it).
inline uint32_t pool_pages_bound(int64_t pages) {
  return pages <= 0           ? 0u
         : pages >= INT32_MAX ? static_cast<uint32_t>(INT32_MAX)
                              : static_cast<uint32_t>(pages);
}

// The partial lse of a split item whose CTA met a bad page id: a NaN whose payload no arithmetic
// produces (the device's NaN is 0x7fffffff), so that the merge can tell it from any real lse.
inline constexpr uint32_t kPoisonedPartialBits = 0x7fc0bad0u;

}  // namespace pagedattn::cuda
