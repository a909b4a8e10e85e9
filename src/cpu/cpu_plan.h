// The CPU backend's workspace and work partition.
//
// A work item is (request, tile of its query rows, chunk of its KV pages); a unit of the parallel
// loop is an item for a range of KV heads: one head (prefill, MLA, HND decode), or all of them for
// NHD decode, where a token's K (and V) for every head is one contiguous run (Hkv x D elements),
// so one unit streams whole pages instead of Hkv threads each reading D-element pieces of them.
// Query rows are tiled so that one item's accumulators (rows x group query heads x head_dim_vo
// floats) stay in L2; KV is split into chunks only when there are too few units to keep every
// thread busy (B = 1 with a long context; B = 16 with all-heads units), and split items write f32
// partial outputs with their lse, which a merge pass combines (weights exp(lse_i - max lse)).
//
// All buffers are sized once by create_workspace() from WorkspaceLimits and the thread count;
// plan() fills the item list without allocating and falls back to larger chunks (fewer partials)
// when a split would not fit.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/cpu_problem.h"
#include "pagedattn/backend.h"

namespace pagedattn::cpu {

inline constexpr int32_t kTileRows = 64;         // query rows (tokens x group heads) per item
inline constexpr int32_t kBlockTokens = 32;      // KV tokens converted to f32 at a time
inline constexpr int32_t kMinChunkTokens = 256;  // smaller KV chunks cost more to merge than win
// A step wakes at most one thread per this much work (bytes of KV read, times ceil(rows / 8) for
// tiles with many query rows): each thread then runs >= ~10-25 us, well above the cost of waking
// it, and small steps (a few short decode requests) leave the other cores alone. libgomp's idle
// threads spin ~3 ms before sleeping (OMP_WAIT_POLICY unset), which on an oversubscribed machine
// takes the CPU from the threads doing the work: fewer threads for small steps spin less.
inline constexpr int64_t kMinWorkPerThread = int64_t{256} << 10;

struct WorkItem {
  int32_t request = 0;
  int32_t page_begin = 0;  // chunk of the request's pages: [page_begin, page_end)
  int32_t page_end = 0;
  int64_t q_begin = 0;  // query rows (absolute): [q_begin, q_end)
  int64_t q_end = 0;
  int64_t partial = -1;  // first partial row (row x head) in the workspace, -1: write `out`
};

// A (request, query tile) whose KV was split: items [first_item, first_item + num_items).
struct MergeGroup {
  int32_t first_item = 0;
  int32_t num_items = 0;
};

struct CpuPlan {
  bool ready = false;
  OpKind op = OpKind::kDecode;
  int32_t batch = 0;
  int32_t heads = 0, kv_heads = 0, dim_qk = 0, dim_vo = 0;
  int32_t page_size = 0;
  int64_t total_pages = 0;  // kv_indptr[B] - kv_indptr[0] when planned (staleness check)
  int64_t total_rows = 0;
  uint64_t fingerprint = 0;  // of kv_indptr and qo_indptr: run() refuses a plan for other metadata
  int32_t tile_tokens = 1;
  int32_t heads_per_unit = 1;  // KV heads one unit covers: 1 or kv_heads (NHD decode)
  int32_t threads = 1;         // threads run() uses: <= workspace threads, units, work-based
  int32_t chunk_pages = 0;     // 0: no split
  int32_t num_items = 0;
  int32_t num_merges = 0;
  int64_t partial_rows = 0;
};

class CpuWorkspace final : public Workspace {
 public:
  // `min_work_per_thread`: see kMinWorkPerThread (tests pass 1 to split small cases as if they
  // were large).
  CpuWorkspace(const WorkspaceLimits& limits, int32_t threads,
               int64_t min_work_per_thread = kMinWorkPerThread);

  const WorkspaceLimits& limits() const { return limits_; }
  int32_t threads() const { return threads_; }
  int64_t min_work_per_thread() const { return min_work_per_thread_; }
  int64_t scratch_floats() const { return scratch_floats_; }
  float* scratch(int32_t thread) { return scratch_.data() + thread * scratch_floats_; }
  int64_t max_rows_per_item() const { return max_rows_; }

  CpuPlan plan;
  std::vector<WorkItem> items;     // capacity fixed at creation
  std::vector<MergeGroup> merges;  // capacity fixed at creation
  std::vector<float> partial_out;  // [partial rows, dim_vo]
  std::vector<float> partial_lse;  // [partial rows]

 private:
  WorkspaceLimits limits_;
  int32_t threads_ = 1;
  int64_t min_work_per_thread_ = kMinWorkPerThread;
  int64_t max_rows_ = 0;
  int64_t scratch_floats_ = 0;
  std::vector<float> scratch_;
};

// Fills workspace.plan / items / merges for `op` over `meta` (host metadata). Throws when the
// step exceeds the workspace's limits.
void build_plan(CpuWorkspace& workspace, const OpDesc& op, const StepMetadata& meta);

// Which path the last plan() chose (for the tests that mean a path): the most KV chunks any
// (request, query tile) was split into; 1 = no split.
int32_t planned_kv_chunks(const CpuWorkspace& workspace);

// A hash of the per-request page and row counts (kv_indptr, qo_indptr; null = one row each).
uint64_t metadata_fingerprint(int32_t batch, const int32_t* kv_indptr, const int32_t* qo_indptr);

// Runs a validated problem with the workspace's plan (which must match it), then merges.
void run_problem(CpuWorkspace& workspace, const Problem& problem);

}  // namespace pagedattn::cpu
