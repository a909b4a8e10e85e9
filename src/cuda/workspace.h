// The CUDA backend's workspace: fixed device buffers sized once from WorkspaceLimits, so that
// plan() and run_*() never allocate (and can be captured in a CUDA graph).
//
// What lives here (all int32 unless noted; "items" are split-KV work items, see planner.h):
//   partition   work_request [max_items], work_chunk [max_items], merge_indptr [max_batch + 1],
//               info: PlanInfo (num_items, chunk_pages, any_split) written by the GPU partition
//               kernel, read by the decode kernels: the host never learns num_items (no sync).
//   partial     partial_out f32 [capacity], partial_lse f32 [capacity]: per (item, qo head) partial
//               outputs of split requests, merged by the merge kernel. Decode uses them as
//               [item, Hq, D] and [item, Hq]; other ops may use them as they like, within the same
//               call (contents are not preserved between run_*() calls).
//   scratch     raw device bytes for the prefill / MLA kernels (same rule).
//   counters    int32 [max_batch * max_qo_heads], zero between calls: the tensor-core decode
//               kernel counts the finished items of each (request, head tile) here; the last one
//               merges the request's partials and sets its counter back to 0.
//   faults      the record of the first metadata violation the kernels met (fault_log.h:
//               host-mapped), reported by check_device_errors().
// A workspace belongs to one device (the current one when it was created) and one stream at a
// time: plan() and run_*() must be issued on the same stream, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda/common/guard.h"
#include "pagedattn/backend.h"
#include "pagedattn/planner.h"

namespace pagedattn::cuda {

class FaultLog;

// An owning cudaMalloc'd buffer (movable, not copyable). Bytes are not initialised.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Written on the device by the partition kernel.
struct PlanInfo {
  int32_t num_items;
  int32_t chunk_pages;
  int32_t any_split;
  int32_t error;  // nonzero: the partition did not fit the workspace (see PlanError)
};

// Device pointers of the split-KV partition, as the kernels read them.
struct PartitionView {
  const int32_t* work_request = nullptr;  // [max_items]
  const int32_t* work_chunk = nullptr;    // [max_items]
  const int32_t* merge_indptr = nullptr;  // [batch + 1]
  const PlanInfo* info = nullptr;
  int32_t max_items = 0;  // grid bound: items beyond info->num_items exit at once
};

// The launch shape of an MLA step (mla.cpp): rows per request bound (q_len * H), row block (16 or
// 64 rows), row blocks per item, the split-KV config and the work items of the grid.
struct MlaShape {
  int64_t partial_rows = 0;
  int block_rows = 0;
  int64_t row_blocks = 0;
  SplitKvConfig config;
  int64_t grid_items = 0;  // work items the grid covers (grid.y = grid_items * cluster)
  int cluster = 1;         // CTAs per work item (mla::MlaParams::cluster)
};

class CudaWorkspace final : public Workspace {
 public:
  explicit CudaWorkspace(const WorkspaceLimits& limits);
  ~CudaWorkspace() override;

  const WorkspaceLimits& limits() const { return limits_; }
  int device() const { return device_; }
  int num_sms() const { return num_sms_; }

  // ---- split-KV partition (decode) ----
  // The configuration plan() uses for `op` on `batch` requests: target items = resident CTAs /
  // CTAs per item (KV heads x head tiles), rounded down to a multiple of the batch when the batch
  // is smaller, so that requests of one length get equal chunks and fill one wave (a target of
  // 33 items for 16 requests would cut each into two long chunks and a short third).
  SplitKvConfig split_config(const OpDesc& op, int32_t batch) const;
  // Upper bound on items for any plan of this workspace (the grid size of the decode kernel).
  int32_t max_items() const { return max_items_; }
  int32_t* work_request() const { return work_request_.as<int32_t>(); }
  int32_t* work_chunk() const { return work_chunk_.as<int32_t>(); }
  int32_t* merge_indptr() const { return merge_indptr_.as<int32_t>(); }
  PlanInfo* info() const { return info_.as<PlanInfo>(); }
  PartitionView partition() const;

  // ---- partial results of split work, f32 ----
  float* partial_out() const { return partial_out_.as<float>(); }
  int64_t partial_out_capacity() const { return partial_out_capacity_; }  // floats
  float* partial_lse() const { return partial_lse_.as<float>(); }
  int64_t partial_lse_capacity() const { return partial_lse_capacity_; }  // floats

  // ---- per (request, head tile) arrival counters of split decode, zero between calls ----
  int32_t* merge_counters() const { return merge_counters_.as<int32_t>(); }
  int64_t merge_counters_capacity() const { return merge_counters_capacity_; }

  // ---- the persistent prefill grid's unit counters: [next unit, CTAs done], zero between calls ----
  int32_t* prefill_unit_counters() const { return prefill_unit_counters_.as<int32_t>(); }

  // ---- raw scratch for prefill / MLA ----
  void* scratch() const { return scratch_.data(); }
  size_t scratch_bytes() const { return scratch_.bytes(); }

  // ---- metadata guards (common/guard.h) ----
  // The guard of a call of `op`: this workspace's fault record (the caller fills in the sizes).
  MetadataGuard guard(OpKind op) const;
  // Workspace::check_device_errors (backend.h): the first recorded violation, as an Error.
  void check_device_errors() override;
  // WorkspaceLimits::validate_metadata: plan() and run_* check the metadata on the host first.
  bool validating() const { return limits_.validate_metadata; }

  // The stream plan() enqueues on (a cudaStream_t; null = the legacy default stream). Decode,
  // and MLA when plan() ran its partition, must run on the same stream as the plan (checked).
  void* stream = nullptr;

  // ---- the last plan (set by Backend::plan, checked by run_*) ----
  bool planned = false;
  OpDesc planned_op;
  StepMetadata planned_meta;
  SplitKvConfig planned_split;
  // MLA: plan() ran the step's partition for this shape (when the metadata carried max_q_len).
  bool mla_partitioned = false;
  // run_decode calls since the last plan_decode(): the first one after a plan reads its metadata
  // only after its wait for the previous kernel (DecodeParams::early_metadata).
  int64_t decode_runs_since_plan = 0;
  MlaShape mla_shape;

  // ---- diagnostic: the decode kernel's phase stamps (DecodeTrace, pagedattn/cuda_graph.h) ----
  // Stamp rows for the first `launches` run_decode calls after each plan, kDecodeTraceWords u64
  // per CTA of the grid's bound (max_items x max_qo_heads CTAs); zeroed here.
  void enable_decode_trace(int32_t launches);
  // Launch `index`'s rows (null when tracing is off or index >= the launches enabled).
  unsigned long long* decode_trace(int64_t index) const;
  int64_t decode_trace_ctas() const { return int64_t{max_items_} * limits_.max_qo_heads; }
  const DeviceBuffer& decode_trace_buffer() const { return decode_trace_; }  // every launch's rows

 private:
  WorkspaceLimits limits_;
  int device_ = 0;
  int num_sms_ = 0;
  int32_t max_items_ = 0;
  int64_t partial_out_capacity_ = 0;
  int64_t partial_lse_capacity_ = 0;
  int64_t merge_counters_capacity_ = 0;
  DeviceBuffer merge_counters_;
  DeviceBuffer prefill_unit_counters_;
  DeviceBuffer work_request_, work_chunk_, merge_indptr_, info_;
  DeviceBuffer partial_out_, partial_lse_, scratch_;
  DeviceBuffer decode_trace_;
  int32_t decode_trace_launches_ = 0;
  std::unique_ptr<FaultLog> faults_;
};

// Resident decode CTAs per SM that the split rule targets (see decode launcher).
inline constexpr int kDecodeCtasPerSm = 2;
// Query heads of one decode CTA (a larger GQA group takes several CTAs per KV head).
inline constexpr int kDecodeMaxGroupPerCta = 16;

// The decode split target (SplitKvConfig::target_items) on `num_sms` SMs: the resident CTA slots
// (num_sms * kDecodeCtasPerSm) over the CTAs of one item (KV heads x head tiles of up to
// kDecodeMaxGroupPerCta query heads), rounded down to a multiple of `batch` when the batch is
// smaller, so that requests of one length get equal chunks that fill one wave. At least 1.
int32_t decode_split_target(int32_t num_sms, int32_t num_qo_heads, int32_t num_kv_heads,
                            int32_t batch);

// What an MLA launch shape depends on besides the step: the device's SMs and the workspace's
// item and partial capacities.
struct MlaCapacity {
  int32_t num_sms = 0;
  int32_t max_items = 0;
  int64_t partial_out = 0;  // f32 elements
  int64_t partial_lse = 0;
  int32_t max_cluster = 1;  // CTAs per item the 16-row kernel takes (mla_cluster_limit)
};

// The MLA launch shape (host arithmetic, unit-tested without a device): rows per request bounded by
// max_q_len * heads; 16-row blocks when that is at most 16, else 64; one CTA per SM, so
// c = max(1, SMs / (batch * row blocks)) CTAs per request. 16-row blocks take a cluster of C = c
// CTAs per item when c is a power of two <= max_cluster (one item a request: the cluster replaces
// the split), else none (C = 1); the split-KV target is batch * (c / C) items (a multiple of the
// batch: requests of one length get equal chunks); chunks of at least 128 tokens per CTA; no split
// (one item per request) when the partials would not fit the capacities.
MlaShape mla_launch_shape(const MlaCapacity& capacity, int32_t heads, int32_t page_size,
                          int32_t batch, int64_t max_q_len);

}  // namespace pagedattn::cuda
