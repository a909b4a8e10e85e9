// The demo's attention step (see demo_attention.h): plan with the host planner (block-table or
// token->slot form), run the selected backend for each page size, time the backend's plan + run,
// check the output.
//
// Checks of one batch, for every page size:
//   - every query row of every real request is finite (out and lse);
//   - padding rows of a decode batch (padded to a power of two, as for CUDA graphs) are 0 with
//     lse = -inf;
//   - sampled rows match the float64 reference over the request's logical K/V, within the
//     output dtype's rounding (bf16: abs 1e-2 + rel 2e-2; lse abs 2e-3 + rel 1e-4);
//   - page-size invariance: every real row agrees with the first page size's output.
// The reference is computed once per batch and shared by the page sizes.
#include "tools/demo/demo_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "reference/reference.h"
#include "tools/demo/demo_device.h"

namespace pagedattn::tools::demo {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TensorView i32_view(std::vector<int32_t>& values, int64_t n) {
  return TensorView::contiguous(values.data(), DType::kI32, {n});
}

// The backend for `op` under `selection`, and so the device its tensors live on: a named backend
// brings its device; "auto" prefers a usable GPU whose backend serves the operation, else the
// CPU (so that a GPU machine runs the demo on the GPU by default).
const Backend& choose_backend(const Selection& selection, OpDesc op) {
  const Registry& registry = Registry::builtin();
  const std::string& spec = selection.for_op(op.op);
  if (spec == "auto") {
    op.device = Device::cuda(0);
    try {
      return select_backend(registry, selection, op);
    } catch (const Error&) {
      // no GPU here, or no GPU backend for this operation: the CPU serves it
    }
    op.device = Device::cpu();
    return select_backend(registry, selection, op);
  }
  const Backend* named = registry.find(spec);
  op.device = named != nullptr && named->device_type() == DeviceType::kCUDA ? Device::cuda(0)
                                                                            : Device::cpu();
  return select_backend(registry, selection, op);
}

// A sampled query row and its reference output.
struct SampleRow {
  int32_t entry = 0;        // index into the batch
  int64_t row = 0;          // query row in q / out
  int32_t kv_len = 0;       // keys it sees
  std::vector<double> out;  // [Hq * D]
  std::vector<double> lse;  // [Hq]
};

void record_failure(DemoResult& result, PageSizeStats& stats, std::string message) {
  ++result.failures;
  ++stats.failures;
  if (result.failure_messages.size() < 10) result.failure_messages.push_back(std::move(message));
}

}  // namespace

struct AttentionRunner::PerPageSize {
  int32_t page_size = 0;
  const Backend* prefill = nullptr;
  const Backend* decode = nullptr;
  std::unique_ptr<Workspace> prefill_workspace, decode_workspace;
  PlanStorage storage;
  // Whether a prefill / decode call at this page size has run (the first one is not timed).
  bool prefill_warm = false, decode_warm = false;
  PerPageSize(int32_t max_batch, int64_t max_pages) : storage(max_batch, max_pages) {}
};

AttentionRunner::AttentionRunner(const ModelShape& shape, const HostKvCache& cache,
                                 const std::vector<int32_t>& page_sizes, const Selection& selection,
                                 int32_t max_batch, int64_t max_tokens, int64_t max_rows,
                                 bool slot_table)
    : shape_(shape),
      cache_(cache),
      slot_table_(slot_table),
      max_batch_(
          static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(std::max(max_batch, 1))))) {
  int64_t max_indices = 1;
  bool on_gpu = false;
  for (int32_t page_size : page_sizes) {
    const int64_t max_pages = max_batch_ * ((max_tokens + page_size - 1) / page_size);
    auto entry = std::make_unique<PerPageSize>(max_batch_, max_pages);
    entry->page_size = page_size;
    OpDesc op;
    op.q_dtype = DType::kBF16;
    op.kv_dtype = cache.config().dtype;
    op.num_qo_heads = shape.qo_heads;
    op.num_kv_heads = shape.kv_heads;
    op.head_dim_qk = op.head_dim_vo = shape.head_dim;
    op.page_size = page_size;
    op.layout = cache.config().layout;
    op.causal = true;
    op.op = OpKind::kPrefill;
    entry->prefill = &choose_backend(selection, op);
    op.op = OpKind::kDecode;
    entry->decode = &choose_backend(selection, op);
    max_indices = std::max(max_indices, max_pages);
    on_gpu = on_gpu || entry->prefill->device_type() == DeviceType::kCUDA ||
             entry->decode->device_type() == DeviceType::kCUDA;
    WorkspaceLimits limits;
    limits.max_batch = max_batch_;
    limits.max_pages = max_pages;
    limits.max_qo_rows = std::max<int64_t>(max_rows, max_batch_);
    limits.max_qo_heads = shape.qo_heads;
    limits.max_head_dim = shape.head_dim;
    entry->prefill_workspace = entry->prefill->create_workspace(limits);
    entry->decode_workspace = entry->decode->create_workspace(limits);
    per_page_size_.push_back(std::move(entry));
  }
  if (on_gpu) {
    mirror_ = std::make_unique<DeviceMirror>(cache, std::max<int64_t>(max_rows, max_batch_),
                                             int64_t{shape.qo_heads} * shape.head_dim, max_batch_,
                                             max_indices);
  }
}

void AttentionRunner::touch(int32_t alloc_page) {
  if (mirror_) mirror_->touch(alloc_page);
}

AttentionRunner::~AttentionRunner() = default;

std::string AttentionRunner::backend_names(OpKind op) const {
  std::string names;
  bool same = true;
  for (const auto& p : per_page_size_) {
    const Backend* b = op == OpKind::kPrefill ? p->prefill : p->decode;
    const Backend* first =
        op == OpKind::kPrefill ? per_page_size_[0]->prefill : per_page_size_[0]->decode;
    same = same && b == first;
    if (!names.empty()) names += ", ";
    names += fmt::format("{} (P={})", b->name(), p->page_size);
  }
  if (same && !per_page_size_.empty()) {
    return std::string(op == OpKind::kPrefill ? per_page_size_[0]->prefill->name()
                                              : per_page_size_[0]->decode->name());
  }
  return names;
}

void AttentionRunner::run(int64_t step, bool prefill, std::span<const BatchEntry> batch,
                          const TensorView& q, std::span<const int32_t> sample,
                          DemoResult& result) {
  const int32_t num_reqs = static_cast<int32_t>(batch.size());
  PA_CHECK(num_reqs <= max_batch_, "demo: batch of {} exceeds the capacity {}", num_reqs,
           max_batch_);
  PA_CHECK(result.per_page_size.size() == per_page_size_.size(),
           "demo: result has {} page-size entries, expected {}", result.per_page_size.size(),
           per_page_size_.size());
  const int64_t hq = shape_.qo_heads, dim = shape_.head_dim, row_elements = hq * dim;
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));

  // The engine's table, in the form chosen: block table [num_reqs, max pages] (vLLM) or token ->
  // slot table [num_reqs, max seq_len] (SGLang); seq_lens, q_lens; first query row per request.
  const int64_t alloc = cache_.config().alloc_page_size;
  int64_t row_stride = 1;
  for (const BatchEntry& e : batch) {
    row_stride = std::max<int64_t>(
        row_stride, slot_table_ ? int64_t{e.seq_len} : static_cast<int64_t>(e.block_table.size()));
  }
  std::vector<int32_t> table(static_cast<size_t>(num_reqs * row_stride), 0);
  std::vector<int32_t> seq_lens(num_reqs), q_lens(num_reqs);
  std::vector<int64_t> first_row(num_reqs + 1, 0);
  for (int32_t r = 0; r < num_reqs; ++r) {
    const BatchEntry& e = batch[r];
    int32_t* row = table.data() + r * row_stride;
    if (slot_table_) {
      for (int64_t t = 0; t < e.seq_len; ++t) {
        row[t] = static_cast<int32_t>(e.block_table[t / alloc] * alloc + t % alloc);
      }
    } else {
      std::copy(e.block_table.begin(), e.block_table.end(), row);
    }
    seq_lens[r] = e.seq_len;
    q_lens[r] = e.q_len;
    first_row[r + 1] = first_row[r] + e.q_len;
  }
  const int64_t real_rows = first_row[num_reqs];
  PA_CHECK(q.ndim == 3 && q.shape[0] == real_rows, "demo: q has {} rows, expected {}", q.shape[0],
           real_rows);
  // Decode batches are padded to a power of two (the sizes a CUDA graph would be captured for).
  const int32_t padded =
      prefill ? num_reqs : static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(num_reqs)));
  const int64_t rows = prefill ? real_rows : padded;
  HostTensor q_padded(DType::kBF16, {rows, hq, dim});
  std::memcpy(q_padded.view().data, q.data, static_cast<size_t>(real_rows * row_elements * 2));

  // The reference for the sampled rows (prefill: the first and the last new row).
  std::vector<SampleRow> samples;
  for (int32_t entry : sample) {
    const BatchEntry& e = batch[entry];
    std::vector<int64_t> rows_to_check = {0};
    if (e.q_len > 1) rows_to_check.push_back(e.q_len - 1);
    for (int64_t i : rows_to_check) {
      SampleRow s;
      s.entry = entry;
      s.row = first_row[entry] + i;
      s.kv_len = static_cast<int32_t>(e.seq_len - e.q_len + i + 1);
      DecodeArgs ref;
      ref.q = q_padded.view();
      ref.q.shape[0] = 1;
      ref.q.data = static_cast<uint16_t*>(q_padded.view().data) + s.row * row_elements;
      const auto logical = [&](const uint16_t* data) {
        return TensorView::contiguous(const_cast<uint16_t*>(data), DType::kBF16,
                                      {1, e.seq_len, shape_.kv_heads, dim});
      };
      ref.kv = PagedKv{logical(e.k_logical), logical(e.v_logical), KvLayout::kNHD, e.seq_len};
      std::vector<int32_t> qo = {0, 1}, kv_indptr = {0, 1}, kv_indices = {0}, last = {s.kv_len};
      ref.meta.batch_size = 1;
      ref.meta.qo_indptr = i32_view(qo, 2);
      ref.meta.kv_indptr = i32_view(kv_indptr, 2);
      ref.meta.kv_indices = i32_view(kv_indices, 1);
      ref.meta.kv_last_page_len = i32_view(last, 1);
      ref.options.sm_scale = sm_scale;
      s.out = testing::reference_decode(ref, &s.lse);
      samples.push_back(std::move(s));
    }
  }

  std::vector<float> first_out;  // every real row of the first page size, for the invariance check
  for (size_t p = 0; p < per_page_size_.size(); ++p) {
    PerPageSize& pp = *per_page_size_[p];
    PageSizeStats& stats = result.per_page_size[p];
    const PagedKv kv = cache_.paged(pp.page_size);

    PlanInput input;
    if (slot_table_) {
      input.table = SlotTableInput{table, row_stride};
    } else {
      input.table = BlockTableInput{table, row_stride};
    }
    input.num_reqs = num_reqs;
    input.seq_lens = seq_lens;
    if (prefill) input.q_lens = q_lens;
    input.alloc_page_size = kv.alloc_page_size();
    input.page_size = pp.page_size;
    input.num_alloc_pages = kv.num_alloc_pages();
    input.padded_batch = padded;
    const auto plan_start = Clock::now();
    const PlanSummary summary = plan(input, pp.storage.buffers());
    stats.planner_seconds += seconds_since(plan_start);

    StepMetadata meta;
    meta.batch_size = summary.batch_size;
    meta.qo_indptr = i32_view(pp.storage.qo_indptr, summary.batch_size + 1);
    meta.kv_indptr = i32_view(pp.storage.kv_indptr, summary.batch_size + 1);
    meta.kv_indices = i32_view(pp.storage.kv_indices, std::max<int64_t>(summary.num_pages, 1));
    meta.kv_last_page_len = i32_view(pp.storage.kv_last_page_len, summary.batch_size);
    meta.max_q_len = summary.max_q_len;
    meta.num_pages_hint = summary.num_pages;

    HostTensor out(DType::kBF16, {rows, hq, dim}), lse(DType::kF32, {rows, hq});
    std::memset(out.view().data, 0xff, static_cast<size_t>(out.bytes()));  // NaN poison
    std::memset(lse.view().data, 0xff, static_cast<size_t>(lse.bytes()));
    AttentionOptions options;
    options.sm_scale = sm_scale;
    options.causal = true;
    const Backend& backend = prefill ? *pp.prefill : *pp.decode;
    Workspace& workspace = prefill ? *pp.prefill_workspace : *pp.decode_workspace;
    const bool gpu = backend.device_type() == DeviceType::kCUDA;
    // On the GPU: the written pages, q and the metadata go up first (not timed: an engine keeps
    // them there), out and lse come back after.
    PagedKv kv_used = kv;
    TensorView q_used = q_padded.view(), out_used = out.view(), lse_used = lse.view();
    StepMetadata meta_used = meta;
    if (gpu) {
      kv_used = mirror_->sync(pp.page_size);
      q_used = mirror_->upload_q(q_padded.view());
      meta_used = mirror_->upload_metadata(meta);
      mirror_->poisoned_outputs(rows, hq, &out_used, &lse_used);
      mirror_->synchronize();
    }
    const auto launch = [&] {
      if (prefill) {
        PrefillArgs args{q_used, kv_used, meta_used, out_used, lse_used, options};
        backend.plan(workspace, describe_op(args), meta_used);
        backend.run_prefill(workspace, args);
      } else {
        DecodeArgs args{q_used, kv_used, meta_used, out_used, lse_used, options};
        backend.plan(workspace, describe_op(args), meta_used);
        backend.run_decode(workspace, args);
      }
    };
    // The first call of each kind at each page size runs once untimed, then is timed again on
    // re-poisoned outputs: one-time costs (a CUDA kernel's first launch loads its module; the
    // first OpenMP region starts the threads) belong to no step; without this they fell on
    // whichever page size runs first (P 1 by default).
    bool& warm = prefill ? pp.prefill_warm : pp.decode_warm;
    if (!warm) {
      launch();
      if (gpu) {
        mirror_->synchronize();
        mirror_->poisoned_outputs(rows, hq, &out_used, &lse_used);
        mirror_->synchronize();
      } else {
        std::memset(out.view().data, 0xff, static_cast<size_t>(out.bytes()));
        std::memset(lse.view().data, 0xff, static_cast<size_t>(lse.bytes()));
      }
      warm = true;
    }
    const auto run_start = Clock::now();
    launch();
    if (gpu) mirror_->synchronize();
    const double elapsed = seconds_since(run_start);
    if (gpu) mirror_->download(out_used, lse_used, out.view(), lse.view());
    if (prefill) {
      stats.prefill_seconds += elapsed;
    } else {
      stats.decode_seconds += elapsed;
      stats.decode_step_seconds.push_back(elapsed);
    }
    for (const BatchEntry& e : batch) {
      if (prefill) {
        const double q_len = e.q_len, prefix = e.seq_len - e.q_len;
        stats.prefill_flops += 4.0 * hq * dim * (q_len * prefix + q_len * (q_len + 1) / 2);
      } else {
        stats.decode_kv_bytes += 2.0 * e.seq_len * shape_.kv_heads * dim * dtype_size(kv.k.dtype);
      }
    }

    const uint16_t* out_bits = out.data<uint16_t>();
    const float* lse_values = lse.data<float>();
    const std::string where =
        fmt::format("step {} {} P={}", step, prefill ? "prefill" : "decode", pp.page_size);
    // Every real row finite.
    ++result.checks;
    for (int64_t i = 0; i < real_rows * row_elements; ++i) {
      if (!std::isfinite(bf16_to_float(out_bits[i]))) {
        record_failure(result, stats, fmt::format("{}: out element {} is not finite", where, i));
        break;
      }
    }
    // Padding rows: 0 and -inf.
    if (rows > real_rows) {
      ++result.checks;
      bool zero = true;
      for (int64_t i = real_rows * row_elements; i < rows * row_elements; ++i) {
        zero = zero && bf16_to_float(out_bits[i]) == 0.0f;
      }
      for (int64_t i = real_rows * hq; i < rows * hq; ++i) {
        zero = zero && lse_values[i] == -std::numeric_limits<float>::infinity();
      }
      if (!zero) {
        record_failure(result, stats,
                       fmt::format("{}: padding rows {}..{} are not out = 0, lse = -inf", where,
                                   real_rows, rows - 1));
      }
    }
    // Page-size invariance on every row: the same logical KV seen with another P gives the same
    // output within the output's rounding (a split-KV merge may round differently).
    if (p == 0) {
      first_out.resize(static_cast<size_t>(real_rows * row_elements));
      for (size_t i = 0; i < first_out.size(); ++i) first_out[i] = bf16_to_float(out_bits[i]);
    } else {
      ++result.checks;
      for (int64_t i = 0; i < real_rows * row_elements; ++i) {
        const float got = bf16_to_float(out_bits[i]), want = first_out[static_cast<size_t>(i)];
        if (!(std::fabs(got - want) <= 1e-2f + 2e-2f * std::fabs(want))) {
          record_failure(result, stats,
                         fmt::format("{}: row {} head {} dim {} = {:.6g}, but {:.6g} with P={}",
                                     where, i / row_elements, i % row_elements / dim, i % dim, got,
                                     want, per_page_size_[0]->page_size));
          break;
        }
      }
    }
    // Sampled rows against the reference.
    for (const SampleRow& s : samples) {
      ++result.checks;
      ++stats.checks;
      int64_t bad = 0;
      std::string first;
      for (int64_t i = 0; i < row_elements; ++i) {
        const double got = bf16_to_float(out_bits[s.row * row_elements + i]);
        const double want = s.out[static_cast<size_t>(i)];
        if (!(std::fabs(got - want) <= 1e-2 + 2e-2 * std::fabs(want))) {
          if (bad++ == 0)
            first = fmt::format("out[head {}, dim {}] = {:.6g}, expected {:.6g}", i / dim, i % dim,
                                got, want);
        }
      }
      for (int64_t h = 0; h < hq; ++h) {
        const double got = lse_values[s.row * hq + h];
        const double want = s.lse[static_cast<size_t>(h)];
        if (!(std::fabs(got - want) <= 2e-3 + 1e-4 * std::fabs(want))) {
          if (bad++ == 0)
            first = fmt::format("lse[head {}] = {:.7g}, expected {:.7g}", h, got, want);
        }
      }
      if (bad > 0) {
        record_failure(result, stats,
                       fmt::format("{}: request {} row {} (kv_len {}): {} mismatches, first {}",
                                   where, batch[s.entry].request_id, s.row - first_row[s.entry],
                                   s.kv_len, bad, first));
      }
    }
  }
}

}  // namespace pagedattn::tools::demo
