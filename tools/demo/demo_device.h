// The demo on a GPU: a device mirror of the host KV cache and the device buffers of one attention
// batch, for the batches whose selected backend runs on CUDA.
//
// The host cache stays the engine's source of truth (store_kv and fork's copy_tokens write it);
// the pages written since the last device batch are marked with touch() and copied to the device
// pool, page by page, before the next one (an allocation page is one contiguous block of K and one
// of V in both layouts). q and the planner's metadata are uploaded per batch, out and lse
// downloaded for the checks. Everything runs on the default stream.
//
// In a build without CUDA, constructing a DeviceMirror throws Error (the backend selection never
// asks for one there).
#pragma once

#include <cstdint>
#include <memory>
#include <set>

#include "pagedattn/backend.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/planner.h"

namespace pagedattn::tools::demo {

class DeviceMirror {
 public:
  // Capacities: `max_rows` query rows of `row_elements` (Hq * D) each, `max_batch` requests,
  // `max_indices` attention-page ids per batch.
  DeviceMirror(const HostKvCache& cache, int64_t max_rows, int64_t row_elements, int32_t max_batch,
               int64_t max_indices);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  void touch(int32_t alloc_page) { dirty_.insert(alloc_page); }
  // Copies the touched pages to the device; returns the device cache viewed with `page_size`.
  PagedKv sync(int32_t page_size);
  // q [rows, Hq, D] to the device (the returned view has the host view's shape).
  TensorView upload_q(const TensorView& host_q);
  // The planner's CSR arrays to the device, as a StepMetadata with device views.
  StepMetadata upload_metadata(const StepMetadata& host);
  // Device out [rows, Hq, D] bf16 and lse [rows, Hq] f32, filled with a NaN pattern.
  void poisoned_outputs(int64_t rows, int64_t heads, TensorView* out, TensorView* lse);
  // Waits for the device and copies out / lse into the host views (same shapes, contiguous).
  void download(const TensorView& out, const TensorView& lse, const TensorView& host_out,
                const TensorView& host_lse);
  void synchronize();

 private:
  struct Buffers;
  const HostKvCache& cache_;
  std::set<int32_t> dirty_;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace pagedattn::tools::demo
