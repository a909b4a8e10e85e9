// `pagedattn demo`: a serving trace through the page allocator, the planner and the selected
// backend, checked against the float64 reference as it runs.
//
// The model is one attention layer of a Llama-like shape (Hq 32, Hkv 8, head_dim 128, bf16 q and
// KV) fed with random q/k/v per token. Requests arrive over time with prompts of varied lengths,
// some starting with one of two shared system prompts (held once in the cache and forked: full
// pages shared, the partial last page copied). An engine loop admits requests while pages last
// (queueing the rest), prefills each over its cached prefix, then decodes every running request
// one token per step (block tables growing, pages preempted by recompute when the pool runs
// dry), and frees a request's pages when it finishes. Every attention batch runs once per
// attention page size P over the same cache and metadata, so the P columns of the report are
// measured side by side; a sample of each step's output rows is checked against the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::tools {

struct DemoProgress {
  int64_t step = 0;
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t finished = 0;
  int32_t total = 0;
};

struct DemoOptions {
  int32_t num_requests = 16;
  int32_t decode_steps = 48;  // output length of a request: uniform in [steps / 2, steps]
  uint64_t seed = 1;
  std::vector<int32_t> page_sizes = {1, 16};  // attention page sizes P, each dividing alloc
  int32_t alloc_page_size = 16;
  int32_t min_prompt = 8;
  int32_t max_prompt = 320;
  int32_t max_batch = 8;        // running requests at most
  int32_t num_pages = 0;        // pool size in allocation pages; 0: sized to force some queueing
  int32_t checks_per_step = 2;  // sampled requests checked per batch
  KvLayout layout = KvLayout::kNHD;
  bool slot_table = false;  // planner input: token->slot tables (SGLang) instead of block tables
  std::string backend;      // selection spec; empty: PAGEDATTN_BACKEND, else auto
  // Model shape (Llama-like).
  int32_t num_qo_heads = 32;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  std::function<void(const DemoProgress&)> progress;  // called after every step, if set
};

// Figures of one attention page size over the whole trace.
struct PageSizeStats {
  int32_t page_size = 0;
  double prefill_seconds = 0;  // backend plan + run, summed over prefill batches
  double decode_seconds = 0;   // backend plan + run, summed over decode batches
  double planner_seconds = 0;  // host planner (both kinds)
  std::vector<double> decode_step_seconds;
  double decode_kv_bytes = 0;  // K and V bytes the decode batches had to read
  double prefill_flops = 0;    // 4 * Hq * head_dim per (query row, visible key)
  int64_t checks = 0;          // sampled rows compared with the reference
  int64_t failures = 0;

  double median_decode_ms() const;
  double decode_gbps() const {
    return decode_seconds > 0 ? decode_kv_bytes / decode_seconds / 1e9 : 0;
  }
  double prefill_gflops() const {
    return prefill_seconds > 0 ? prefill_flops / prefill_seconds / 1e9 : 0;
  }
};

struct DemoResult {
  std::string description;  // one line: the model, the layout, the seed
  std::string prefill_backend, decode_backend;
  int64_t steps = 0;  // engine steps
  int64_t prefill_batches = 0, decode_batches = 0;
  int64_t prefill_tokens = 0;  // query rows prefilled (recomputation included)
  int64_t decode_tokens = 0;
  int32_t requests = 0;
  int32_t num_pages = 0;  // pool size (allocation pages)
  int32_t peak_pages_used = 0;
  int64_t forks = 0;  // requests forked from a shared prefix
  int64_t partial_page_copies = 0;
  int64_t queued_admissions = 0;  // steps in which the head of the queue waited for pages
  int64_t preemptions = 0;
  double wall_seconds = 0;
  std::vector<PageSizeStats> per_page_size;
  int64_t checks = 0;  // every check: sampled rows, padding, allocator consistency
  int64_t failures = 0;
  std::vector<std::string> failure_messages;  // the first few

  bool ok() const { return failures == 0 && checks > 0; }
};

// Runs the trace; throws Error for invalid options (naming the option) or a backend that cannot
// run the model. Check failures are counted in the result, not thrown.
DemoResult run_demo(const DemoOptions& options);

// The report: an aligned table with one column per page size.
std::string format_demo_table(const DemoResult& result);

}  // namespace pagedattn::tools
