// Workspace sizing and the work partition of the CPU backend (see cpu_plan.h).
#include "cpu/cpu_plan.h"

#include <algorithm>

#include "core/check.h"

namespace pagedattn::cpu {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kMaxPartialBytes = int64_t{64} << 20;

}  // namespace

uint64_t metadata_fingerprint(int32_t batch, const int32_t* kv_indptr, const int32_t* qo_indptr) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the counts
  auto mix = [&hash](int64_t value) {
    hash ^= static_cast<uint64_t>(value);
    hash *= 1099511628211ull;
  };
  for (int32_t r = 0; r < batch; ++r) {
    mix(kv_indptr[r + 1] - kv_indptr[r]);
    mix(qo_indptr ? qo_indptr[r + 1] - qo_indptr[r] : 1);
  }
  return hash;
}

CpuWorkspace::CpuWorkspace(const WorkspaceLimits& limits, int32_t threads,
                           int64_t min_work_per_thread)
    : limits_(limits),
      threads_(std::max(1, threads)),
      min_work_per_thread_(std::max<int64_t>(1, min_work_per_thread)) {
  PA_CHECK(limits.max_batch >= 0 && limits.max_pages >= 0 && limits.max_qo_rows >= 0,
           "limits: negative capacity (max_batch {}, max_pages {}, max_qo_rows {})",
           limits.max_batch, limits.max_pages, limits.max_qo_rows);
  PA_CHECK(limits.max_qo_heads >= 1, "limits.max_qo_heads: {} must be >= 1", limits.max_qo_heads);
  PA_CHECK(limits.max_head_dim >= kHeadDimMultiple, "limits.max_head_dim: {} must be >= {}",
           limits.max_head_dim, kHeadDimMultiple);
  const int64_t dim_qk = round_up(std::min(limits.max_head_dim, kMaxHeadDimQk), kHeadDimMultiple);
  const int64_t dim_vo = std::min<int64_t>(dim_qk, kMaxHeadDimVo);
  max_rows_ = std::max<int64_t>(kTileRows, limits.max_qo_heads);
  // Per thread: q tile, accumulators, scores, m/l/alpha, converted K and V blocks.
  scratch_floats_ = round_up(max_rows_ * dim_qk, 16) + round_up(max_rows_ * dim_vo, 16) +
                    round_up(max_rows_ * kBlockTokens, 16) + 3 * round_up(max_rows_, 16) +
                    round_up(int64_t{kBlockTokens} * dim_qk, 16) +
                    round_up(int64_t{kBlockTokens} * dim_vo, 16);
  scratch_.assign(static_cast<size_t>(scratch_floats_ * threads_), 0.0f);
  const int64_t item_capacity =
      int64_t{limits.max_batch} + limits.max_qo_rows + 16 * int64_t{threads_} + 1;
  items.resize(static_cast<size_t>(item_capacity));
  merges.resize(static_cast<size_t>(item_capacity));
  const int64_t partial_rows = std::min<int64_t>(
      8 * int64_t{threads_} * max_rows_, kMaxPartialBytes / int64_t(sizeof(float)) / dim_vo);
  partial_out.assign(static_cast<size_t>(partial_rows * dim_vo), 0.0f);
  partial_lse.assign(static_cast<size_t>(partial_rows), 0.0f);
}

void build_plan(CpuWorkspace& ws, const OpDesc& op, const StepMetadata& meta) {
  const WorkspaceLimits& limits = ws.limits();
  ws.plan.ready = false;
  PA_CHECK(op.device.type == DeviceType::kCPU, "op.device: {}, expected cpu", op.device.str());
  PA_CHECK(op.num_qo_heads >= 1 && op.num_kv_heads >= 1 && op.num_qo_heads % op.num_kv_heads == 0,
           "op: {} query heads is not a multiple of {} KV heads", op.num_qo_heads, op.num_kv_heads);
  PA_CHECK(op.num_qo_heads <= limits.max_qo_heads,
           "op.num_qo_heads: {} exceeds the workspace's limits.max_qo_heads {}", op.num_qo_heads,
           limits.max_qo_heads);
  PA_CHECK(op.head_dim_qk <= limits.max_head_dim && op.head_dim_vo <= limits.max_head_dim,
           "op.head_dim: {}/{} exceeds the workspace's limits.max_head_dim {}", op.head_dim_qk,
           op.head_dim_vo, limits.max_head_dim);
  PA_CHECK(op.page_size >= 1, "op.page_size: {} must be >= 1", op.page_size);
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0 && batch <= limits.max_batch,
           "meta.batch_size: {} is outside the workspace's [0, limits.max_batch = {}]", batch,
           limits.max_batch);
  check_tensor("meta.kv_indptr", meta.kv_indptr, {kAnySize}, DType::kI32, Device::cpu());
  PA_CHECK(meta.kv_indptr.shape[0] >= int64_t{batch} + 1 &&
               (meta.kv_indptr.shape[0] <= 1 || meta.kv_indptr.strides[0] == 1),
           "meta.kv_indptr: shape {} stride {}, expected >= {} contiguous entries",
           meta.kv_indptr.shape_str(), meta.kv_indptr.strides[0], int64_t{batch} + 1);
  const int32_t* kv_indptr = meta.kv_indptr.data_as<const int32_t>();
  const int32_t* qo_indptr = nullptr;
  const bool one_row_each = op.op == OpKind::kDecode || !meta.qo_indptr.defined();
  if (!one_row_each) {
    check_tensor("meta.qo_indptr", meta.qo_indptr, {kAnySize}, DType::kI32, Device::cpu());
    PA_CHECK(meta.qo_indptr.shape[0] >= int64_t{batch} + 1 &&
                 (meta.qo_indptr.shape[0] <= 1 || meta.qo_indptr.strides[0] == 1),
             "meta.qo_indptr: shape {} stride {}, expected >= {} contiguous entries",
             meta.qo_indptr.shape_str(), meta.qo_indptr.strides[0], int64_t{batch} + 1);
    qo_indptr = meta.qo_indptr.data_as<const int32_t>();
  }
  auto q_begin = [&](int32_t r) -> int64_t { return qo_indptr ? qo_indptr[r] : r; };
  auto q_len = [&](int32_t r) -> int64_t {
    return qo_indptr ? std::max(0, qo_indptr[r + 1] - qo_indptr[r]) : 1;
  };
  auto pages_of = [&](int32_t r) -> int64_t {
    return std::max(0, kv_indptr[r + 1] - kv_indptr[r]);
  };

  CpuPlan& plan = ws.plan;
  plan = CpuPlan{};
  plan.op = op.op;
  plan.batch = batch;
  plan.heads = op.num_qo_heads;
  plan.kv_heads = is_mla(op.op) ? 1 : op.num_kv_heads;
  plan.dim_qk = op.head_dim_qk;
  plan.dim_vo = op.head_dim_vo;
  plan.page_size = op.page_size;
  plan.total_pages = kv_indptr[batch] - kv_indptr[0];
  plan.total_rows = qo_indptr ? qo_indptr[batch] - qo_indptr[0] : batch;
  plan.fingerprint = metadata_fingerprint(batch, kv_indptr, qo_indptr);
  PA_CHECK(plan.total_pages <= limits.max_pages,
           "meta.kv_indptr: {} pages exceeds the workspace's limits.max_pages {}", plan.total_pages,
           limits.max_pages);
  PA_CHECK(plan.total_rows <= limits.max_qo_rows,
           "meta.qo_indptr: {} query rows exceeds the workspace's limits.max_qo_rows {}",
           plan.total_rows, limits.max_qo_rows);
  const int32_t group = plan.heads / plan.kv_heads;
  plan.tile_tokens = std::max(1, kTileRows / group);
  // NHD decode: one unit per item covers every KV head (one query row per request, so its
  // Hq rows fit the per-thread scratch sized for max(kTileRows, max_qo_heads) rows). With P = 1
  // the two layouts are the same bytes.
  const bool all_heads = op.op == OpKind::kDecode && plan.kv_heads > 1 &&
                         (op.layout == KvLayout::kNHD || op.page_size == 1);
  plan.heads_per_unit = all_heads ? plan.kv_heads : 1;
  const int64_t head_units = plan.kv_heads / plan.heads_per_unit;

  // Units without splitting, the page work they carry, and the step's work (bytes of KV read,
  // weighted by the rows each tile computes; see kMinWorkPerThread).
  const int64_t token_bytes =
      int64_t{plan.kv_heads} * (plan.dim_qk + plan.dim_vo) * dtype_size(op.kv_dtype);
  int64_t units = 0, weighted_pages = 0, max_pages = 0, work = 0;
  for (int32_t r = 0; r < batch; ++r) {
    const int64_t tiles = ceil_div(q_len(r), plan.tile_tokens);
    units += tiles;
    weighted_pages += tiles * pages_of(r);
    max_pages = std::max(max_pages, pages_of(r));
    const int64_t tile_rows = std::min<int64_t>(q_len(r), plan.tile_tokens) * group;
    work += tiles * pages_of(r) * plan.page_size * token_bytes * ceil_div(tile_rows, 8);
  }
  const int32_t threads = static_cast<int32_t>(
      std::clamp<int64_t>(ceil_div(work, ws.min_work_per_thread()), 1, ws.threads()));
  int64_t chunk_pages = 0;
  if (threads > 1 && units * head_units < 2 * int64_t{threads}) {
    const int64_t target_items = ceil_div(4 * int64_t{threads}, head_units);
    // An all-heads unit does heads_per_unit times the work per token: its chunks may be as short.
    const int64_t min_chunk_tokens =
        std::max<int64_t>(kBlockTokens, kMinChunkTokens / plan.heads_per_unit);
    chunk_pages = std::max(ceil_div(min_chunk_tokens, plan.page_size),
                           ceil_div(weighted_pages, target_items));
    if (chunk_pages >= max_pages) chunk_pages = 0;
  }

  // Build; if a split does not fit the workspace, retry with chunks twice as large.
  const int64_t item_capacity = static_cast<int64_t>(ws.items.size());
  const int64_t partial_capacity = static_cast<int64_t>(ws.partial_lse.size());
  for (;;) {
    int64_t num_items = 0, num_merges = 0, partial_rows = 0;
    bool fits = true;
    for (int32_t r = 0; r < batch && fits; ++r) {
      const int64_t pages = pages_of(r);
      const int64_t chunks =
          chunk_pages == 0 || pages <= chunk_pages ? 1 : ceil_div(pages, chunk_pages);
      for (int64_t t0 = 0; t0 < q_len(r) && fits; t0 += plan.tile_tokens) {
        const int64_t t1 = std::min<int64_t>(q_len(r), t0 + plan.tile_tokens);
        const int64_t tile_partial_rows = (t1 - t0) * plan.heads;
        if (num_items + chunks > item_capacity ||
            (chunks > 1 && (partial_rows + chunks * tile_partial_rows > partial_capacity ||
                            int64_t(plan.dim_vo) * (partial_rows + chunks * tile_partial_rows) >
                                int64_t(ws.partial_out.size())))) {
          fits = false;
          break;
        }
        if (chunks > 1)
          ws.merges[num_merges++] = {static_cast<int32_t>(num_items), static_cast<int32_t>(chunks)};
        for (int64_t c = 0; c < chunks; ++c) {
          WorkItem& item = ws.items[num_items++];
          item.request = r;
          item.page_begin = static_cast<int32_t>(c * (chunks > 1 ? chunk_pages : 0));
          item.page_end = static_cast<int32_t>(
              chunks > 1 ? std::min<int64_t>(pages, (c + 1) * chunk_pages) : pages);
          item.q_begin = q_begin(r) + t0;
          item.q_end = q_begin(r) + t1;
          item.partial = chunks > 1 ? partial_rows : -1;
          if (chunks > 1) partial_rows += tile_partial_rows;
        }
      }
    }
    if (fits) {
      plan.chunk_pages = static_cast<int32_t>(chunk_pages);
      plan.num_items = static_cast<int32_t>(num_items);
      plan.num_merges = static_cast<int32_t>(num_merges);
      plan.partial_rows = partial_rows;
      plan.threads = static_cast<int32_t>(std::clamp<int64_t>(num_items * head_units, 1, threads));
      plan.ready = true;
      return;
    }
    PA_CHECK(chunk_pages != 0,
             "plan: {} work items exceed the workspace's capacity {} (limits.max_batch + "
             "limits.max_qo_rows)",
             num_items, item_capacity);
    chunk_pages *= 2;
    if (chunk_pages >= max_pages) chunk_pages = 0;
  }
}

int32_t planned_kv_chunks(const CpuWorkspace& workspace) {
  int32_t chunks = 1;
  for (int32_t g = 0; g < workspace.plan.num_merges; ++g) {
    chunks = std::max(chunks, workspace.merges[g].num_items);
  }
  return chunks;
}

}  // namespace pagedattn::cpu
