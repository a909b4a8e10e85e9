// The demo's attention step: one batch (prefill or decode) planned and run once per attention page
// size over the same cache, timed, and checked against the float64 reference.
//
// The reference does not read the paged cache: each sampled request carries its logical K/V (the
// tokens it has seen, in order, as written to the cache) and the reference attends over that as
// one contiguous page. A check therefore covers everything between the engine's tokens and the
// output: store_kv's slots, the allocator's block tables and fork copies, the planner's metadata
// and the backend's kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/backend.h"
#include "pagedattn/planner.h"
#include "pagedattn/registry.h"
#include "tools/demo/demo.h"

namespace pagedattn::tools::demo {

// One request's part of a batch.
struct BatchEntry {
  std::span<const int32_t> block_table;  // allocation-page ids
  int32_t seq_len = 0;                   // KV tokens, this step's new ones included
  int32_t q_len = 0;                     // query rows (the new tokens; 1 for decode)
  const uint16_t* k_logical = nullptr;   // [seq_len, Hkv, D] bf16 bits, in token order
  const uint16_t* v_logical = nullptr;
  int64_t request_id = 0;  // for messages
};

struct ModelShape {
  int32_t qo_heads = 32;
  int32_t kv_heads = 8;
  int32_t head_dim = 128;
};

class DeviceMirror;  // demo_device.h

class AttentionRunner {
 public:
  // `max_batch`: most requests in one batch; `max_tokens`: longest request; `max_rows`: most
  // query rows in one batch; `slot_table`: hand the planner token->slot tables instead of block
  // tables. Selects the backends per page size (Error if one cannot serve).
  AttentionRunner(const ModelShape& shape, const HostKvCache& cache,
                  const std::vector<int32_t>& page_sizes, const Selection& selection,
                  int32_t max_batch, int64_t max_tokens, int64_t max_rows, bool slot_table);
  ~AttentionRunner();

  std::string backend_names(OpKind op) const;
  // The host wrote allocation page `alloc_page` (store or fork copy): a GPU backend needs it.
  void touch(int32_t alloc_page);  // e.g. "cpu", or "cpu (P=1), cuda (P=16)"

  // Runs `batch` for every page size. q: [sum of q_len, Hq, D] bf16. `sample`: indices into
  // `batch` whose rows are checked (prefill: the first and last new row of each). Statistics
  // and check outcomes go to `result` (per_page_size in the constructor's order).
  void run(int64_t step, bool prefill, std::span<const BatchEntry> batch, const TensorView& q,
           std::span<const int32_t> sample, DemoResult& result);

 private:
  struct PerPageSize;
  ModelShape shape_;
  const HostKvCache& cache_;
  bool slot_table_ = false;
  int32_t max_batch_;
  std::vector<std::unique_ptr<PerPageSize>> per_page_size_;
  std::unique_ptr<DeviceMirror> mirror_;  // when a selected backend runs on CUDA
};

}  // namespace pagedattn::tools::demo
