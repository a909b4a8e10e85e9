// Decode steps through CUDA graphs (host API, no CUDA types).
//
// For each padded batch size S in config.batch_sizes, one step's device work is captured once
// into a graph over fixed device buffers: the GPU planner (block table -> qo/kv indptr,
// kv_indices, last_page_len), the split-KV partition, then `num_layers` decode (+ merge)
// launches. A step copies the new block table and lengths into those buffers (one asynchronous
// copy from double-buffered pinned staging) and replays the graph of the smallest S >= num_reqs;
// requests num_reqs .. S-1 are padding (length 0: out = 0, lse = -inf). Since every kernel reads
// its sizes from the device (num_items, kv_indptr, ...), one graph serves any lengths and page
// tables within the capacities. step(..., use_graph = false) launches the same work eagerly (the
// reference the tests compare every replay with, and the baseline of the host-time benchmark).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

// A diagnostic, off unless DecodeGraphConfig::trace: where the tensor-core decode kernel's time
// goes. Thread 0 of every CTA of each layer's launch stamps the device's global timer (ns) as it
// passes each phase below, in this order; `pagedattn bench decode --device cuda` prints a table of
// them per graph row. A stamp costs one store: the traced step is a little slower than the plain
// one.
struct DecodeTrace {
  static constexpr int kPhases = 12;
  static constexpr std::array<const char*, kPhases> kPhaseNames = {
      "start",       // the CTA's first instruction
      "metadata",    // its work item read (partition, request's indptr / last page length)
      "page ids",    // the page ids of its first steps read and checked
      "wait done",   // past the wait for the previous kernel (PDL)
      "q loaded",    // q of its heads in shared memory (a CTA barrier)
      "first K/V",   // warp 0's first step of K and V landed (0: no steps for warp 0)
      "loop done",   // warp 0's last step computed
      "combined",    // every warp done (the barrier before the warps' combine)
      "written",     // thread 0's share of out (or of the item's partial) stored
      "counted",     // split requests: the item's arrival counted (an atomic)
      "merge read",  // split requests, the last item: thread 0's first batch of partials summed
      "end",         // the CTA's last instruction (after the merge, for the last item)
  };
  int32_t layers = 0;            // launches traced: the step's layers
  int64_t ctas = 0;              // stamp rows per layer: the grid's bound (rows never run stay 0)
  std::vector<uint64_t> stamps;  // [layers][ctas][kPhases]; 0: phase not reached
  // [layers][ctas][2]: the SM's cycle counter (clock64) beside the start and end stamps (0: not
  // reached); cycles over ns is the SM's clock rate while the CTA ran.
  std::vector<uint64_t> sm_clocks;
};

struct DecodeGraphConfig {
  PagedKv kv;  // the device cache (allocation page size A, attention page size P)
  int32_t num_qo_heads = 32;
  DType q_dtype = DType::kBF16;
  AttentionOptions options;
  std::vector<int32_t> batch_sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int32_t max_blocks_per_request = 0;  // block-table row stride (allocation pages)
  int32_t num_layers = 1;              // decode launches per step
  // One cache per layer, as a model has (num_layers of them, each shaped like `kv`: dtype,
  // layout, pages, page sizes, heads, head dim); empty: every layer reads `kv` (which then stays
  // in the L2 from layer to layer where it fits).
  std::vector<PagedKv> layer_kv;
  bool with_lse = true;
  bool trace = false;  // record a DecodeTrace of every step (diagnostic; see above)
};

class DecodeGraphRunner {
 public:
  // Allocates the fixed buffers and captures one graph per batch size on `stream`.
  DecodeGraphRunner(const DecodeGraphConfig& config, void* stream);
  ~DecodeGraphRunner();
  DecodeGraphRunner(const DecodeGraphRunner&) = delete;
  DecodeGraphRunner& operator=(const DecodeGraphRunner&) = delete;

  // The fixed device buffers, at full capacity (max batch rows): the caller writes q rows
  // [0, num_reqs) before a step and reads out / lse rows after it.
  TensorView q() const;    // [max_batch, Hq, D]
  TensorView out() const;  // [max_batch, Hq, D]
  TensorView lse() const;  // [max_batch, Hq] f32 (undefined without lse)
  int32_t max_batch() const;

  // One decode step for num_reqs = seq_lens.size() requests; block_table is
  // [num_reqs, max_blocks_per_request] allocation-page ids (host memory). Asynchronous on the
  // stream; returns the padded batch size used.
  int32_t step(std::span<const int32_t> block_table, std::span<const int32_t> seq_lens,
               bool use_graph = true);

  // Waits for the stream and throws if the planner recorded a bad table in the last step, or the
  // decode kernels a metadata violation since the last check (Workspace::check_device_errors).
  void check_last_step() const;
  // The stamps of the last step (config.trace; waits for the stream). Throws without trace.
  DecodeTrace trace() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn::cuda
