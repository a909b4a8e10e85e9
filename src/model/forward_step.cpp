// StepPlanner (forward_step.h): a step's requests -> token ids, positions, slots, the planner's CSR
// metadata and the backend's plan. The block tables are copied into one [B, max_blocks] table
// (padded with page 0, never read past a request's length) for the planner's block-table input.
#include "model/forward_step.h"

#include <algorithm>

#include "core/check.h"

namespace pagedattn::model {
namespace {

TensorView i32_view(std::vector<int32_t>& values, int64_t n) {
  return TensorView::contiguous(values.data(), DType::kI32, {n});
}

}  // namespace

StepPlanner::StepPlanner(const ModelConfig& config, Selection selection, Device device,
                         DeviceStep* device_step)
    : mla_(config.is_mla()),
      heads_(static_cast<int32_t>(config.num_attention_heads)),
      kv_heads_(config.is_mla() ? 1 : static_cast<int32_t>(config.num_key_value_heads)),
      sm_scale_(static_cast<float>(config.softmax_scale())),
      rope_style_(config.rope.layout == RopeLayout::kInterleaved ? ops::RopeStyle::kInterleaved
                                                                 : ops::RopeStyle::kNeox),
      selection_(std::move(selection)),
      device_(device),
      device_step_(device_step) {
  PA_CHECK(device_.type == DeviceType::kCPU || device_step_ != nullptr,
           "step planner: device {} without a device step", device_.str());
  if (mla_) {
    head_dim_qk_ = static_cast<int32_t>(config.mla->kv_lora_rank + config.mla->qk_rope_head_dim);
    head_dim_vo_ = static_cast<int32_t>(config.mla->kv_lora_rank);
  } else {
    head_dim_qk_ = head_dim_vo_ = static_cast<int32_t>(config.head_dim);
  }
  // Fail at load, not at the first step, when no backend can run this model's attention.
  for (bool decode : {true, false}) {
    OpDesc op;
    op.op = mla_ ? (decode ? OpKind::kMlaDecode : OpKind::kMlaExtend)
                 : (decode ? OpKind::kDecode : OpKind::kPrefill);
    op.device = device_;
    op.q_dtype = device_.type == DeviceType::kCPU ? DType::kF32 : DType::kBF16;
    op.kv_dtype = DType::kBF16;
    op.num_qo_heads = heads_;
    op.num_kv_heads = kv_heads_;
    op.head_dim_qk = head_dim_qk_;
    op.head_dim_vo = head_dim_vo_;
    op.page_size = 16;
    select_backend(Registry::builtin(), selection_, op);
  }
}

DType StepPlanner::query_dtype(const KvPool& pool) const {
  // The CPU backend takes f32 q over any cache; on CUDA q is in the cache's dtype, except over
  // fp8 (the kernels take bf16 / f16 q there).
  if (device_.type == DeviceType::kCPU) return DType::kF32;
  return pool.config().dtype == DType::kFP8E4M3 ? fp8_query_dtype_ : pool.config().dtype;
}

OpDesc StepPlanner::describe(bool decode, const KvPool& pool) const {
  OpDesc op;
  op.op = mla_ ? (decode ? OpKind::kMlaDecode : OpKind::kMlaExtend)
               : (decode ? OpKind::kDecode : OpKind::kPrefill);
  op.device = device_;
  op.q_dtype = query_dtype(pool);
  op.kv_dtype = pool.config().dtype;
  op.num_qo_heads = heads_;
  op.num_kv_heads = kv_heads_;
  op.head_dim_qk = head_dim_qk_;
  op.head_dim_vo = head_dim_vo_;
  op.page_size = pool.page_size();
  op.layout = pool.config().layout;
  op.causal = true;
  return op;
}

StepContext& StepPlanner::prepare(const Step& step, const KvPool& pool, const ops::RopeTable& rope,
                                  int32_t padded_batch) {
  PA_CHECK(!step.requests.empty(), "step: no requests");
  PA_CHECK(pool.is_mla() == mla_, "step: the KV pool holds {} caches, the model needs {}",
           pool.is_mla() ? "latent" : "K/V", mla_ ? "latent" : "K/V");
  PA_CHECK(pool.device() == device_, "step: the KV pool is on {}, the model on {}",
           pool.device().str(), device_.str());
  const int32_t num_reqs = static_cast<int32_t>(step.requests.size());
  const int32_t alloc = pool.alloc_page_size();
  StepContext& ctx = context_;
  ctx.tokens = 0;
  ctx.decode = true;
  int64_t max_blocks = 1;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const RequestStep& req = step.requests[static_cast<size_t>(r)];
    const int64_t new_tokens = static_cast<int64_t>(req.tokens.size());
    PA_CHECK(new_tokens >= 1, "step: request {} has no new tokens", r);
    PA_CHECK(req.cached_len >= 0, "step: request {} has cached_len {}", r, req.cached_len);
    PA_CHECK(!req.wants_logits || (req.num_logit_rows >= 1 && req.num_logit_rows <= new_tokens),
             "step: request {} wants {} logit rows of {} new tokens (expected 1 to {})", r,
             req.num_logit_rows, new_tokens, new_tokens);
    PA_CHECK(req.positions.empty() || static_cast<int64_t>(req.positions.size()) == new_tokens,
             "step: request {} has {} positions for {} new tokens", r, req.positions.size(),
             new_tokens);
    const int64_t seq_len = req.cached_len + new_tokens;
    const int64_t blocks_needed = (seq_len + alloc - 1) / alloc;
    PA_CHECK(static_cast<int64_t>(req.block_table.size()) >= blocks_needed,
             "step: request {} has {} tokens ({} cached + {} new) but its block table holds {} "
             "pages of {} (needs {})",
             r, seq_len, req.cached_len, new_tokens, req.block_table.size(), alloc, blocks_needed);
    max_blocks = std::max(max_blocks, blocks_needed);
    ctx.tokens += new_tokens;
    ctx.decode = ctx.decode && new_tokens == 1;
  }
  PA_CHECK(padded_batch == 0 || (ctx.decode && padded_batch >= num_reqs),
           "step: padded_batch {} for {} requests ({}; padding is for decode steps)", padded_batch,
           num_reqs, ctx.decode ? "decode" : "not decode");
  if (!step.sampling.empty()) {
    const size_t rows = logit_rows(step).size();
    PA_CHECK(step.sampling.size() == rows,
             "step: sampling has {} entries for {} logits rows (expected one per row)",
             step.sampling.size(), rows);
    for (size_t i = 0; i < rows; ++i) {
      if (step.sampling[i].sample) ops::row_filter(step.sampling[i]);  // throws when out of range
    }
  }
  // Engine tables for the planner (it validates page ids and lengths before writing anything).
  block_table_.assign(static_cast<size_t>(num_reqs * max_blocks), 0);
  seq_lens_.resize(static_cast<size_t>(num_reqs));
  q_lens_.resize(static_cast<size_t>(num_reqs));
  token_ids_.clear();
  ctx.positions.clear();
  ctx.slots.clear();
  int64_t attention_pages = 0;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const RequestStep& req = step.requests[static_cast<size_t>(r)];
    const int64_t new_tokens = static_cast<int64_t>(req.tokens.size());
    const int64_t seq_len = req.cached_len + new_tokens;
    const int64_t blocks = (seq_len + alloc - 1) / alloc;
    std::copy_n(req.block_table.begin(), blocks, block_table_.begin() + r * max_blocks);
    seq_lens_[static_cast<size_t>(r)] = static_cast<int32_t>(seq_len);
    q_lens_[static_cast<size_t>(r)] = static_cast<int32_t>(new_tokens);
    attention_pages += (seq_len + pool.page_size() - 1) / pool.page_size();
    for (int64_t i = 0; i < new_tokens; ++i) {
      const int64_t index = req.cached_len + i;
      const int32_t position = req.positions.empty() ? static_cast<int32_t>(index)
                                                     : req.positions[static_cast<size_t>(i)];
      PA_CHECK(position >= 0 && position < rope.max_positions(),
               "step: request {} token {} has position {} outside [0, {}) (the RoPE table; "
               "ModelOptions::max_positions)",
               r, i, position, rope.max_positions());
      token_ids_.push_back(req.tokens[static_cast<size_t>(i)]);
      ctx.positions.push_back(position);
      const int32_t page = req.block_table[static_cast<size_t>(index / alloc)];
      ctx.slots.push_back(int64_t{page} * alloc + index % alloc);
    }
  }
  // Padding rows: no KV stored (slot -1), no pages attended.
  for (int32_t r = num_reqs; r < padded_batch; ++r) {
    token_ids_.push_back(0);
    ctx.positions.push_back(0);
    ctx.slots.push_back(-1);
    ++ctx.tokens;
  }
  const int32_t batch = std::max(num_reqs, padded_batch);
  if (!storage_ || storage_batch_ < batch || storage_pages_ < attention_pages) {
    storage_batch_ = std::max(storage_batch_, batch);
    storage_pages_ = std::max(storage_pages_, std::max<int64_t>(attention_pages, 1) * 2);
    storage_ = std::make_unique<PlanStorage>(storage_batch_, storage_pages_);
  }
  PlanInput input;
  input.table = BlockTableInput{block_table_, max_blocks};
  input.num_reqs = num_reqs;
  input.seq_lens = seq_lens_;
  if (!ctx.decode) input.q_lens = q_lens_;
  input.alloc_page_size = alloc;
  input.page_size = pool.page_size();
  input.num_alloc_pages = pool.num_pages();
  input.padded_batch = padded_batch;
  const PlanSummary summary = plan(input, storage_->buffers());

  StepMetadata& meta = ctx.meta;
  meta.batch_size = summary.batch_size;
  meta.qo_indptr = i32_view(storage_->qo_indptr, summary.batch_size + 1);
  meta.kv_indptr = i32_view(storage_->kv_indptr, summary.batch_size + 1);
  meta.kv_indices = i32_view(storage_->kv_indices, std::max<int64_t>(summary.num_pages, 1));
  meta.kv_last_page_len = i32_view(storage_->kv_last_page_len, summary.batch_size);
  meta.max_q_len = summary.max_q_len;
  meta.num_pages_hint = summary.num_pages;
  if (device_step_ != nullptr) meta = device_step_->upload(meta);
  ctx.slot_view = TensorView::contiguous(ctx.slots.data(), DType::kI64, {ctx.tokens});
  ctx.rope = &rope;
  ctx.rope_style = rope_style_;
  ctx.sm_scale = sm_scale_;

  const OpDesc op = describe(ctx.decode, pool);
  BackendSlot& slot = slots_by_op_[static_cast<size_t>(op.op)];
  backend_for(ctx.decode, pool);
  WorkspaceLimits& limits = slot.limits;
  const bool fits = slot.workspace && limits.max_batch >= summary.batch_size &&
                    limits.max_pages >= summary.num_pages && limits.max_qo_rows >= ctx.tokens;
  if (!fits) {
    limits.max_batch = std::max(limits.max_batch, summary.batch_size * 2);
    limits.max_pages = std::max<int64_t>(limits.max_pages, summary.num_pages * 2);
    limits.max_qo_rows = std::max<int64_t>(limits.max_qo_rows, ctx.tokens * 2);
    limits.max_qo_heads = heads_;
    limits.max_head_dim = std::max(head_dim_qk_, head_dim_vo_);
    limits.validate_metadata = validate_metadata_;
    slot.workspace = slot.backend->create_workspace(limits);
    ++workspace_generation_;
    if (device_step_ != nullptr) device_step_->adopt(*slot.workspace);
  }
  slot.backend->plan(*slot.workspace, op, meta);
  ctx.backend = slot.backend;
  ctx.workspace = slot.workspace.get();
  return ctx;
}

void StepPlanner::check_device_errors() {
  for (BackendSlot& slot : slots_by_op_) {
    if (slot.workspace) slot.workspace->check_device_errors();
  }
}

const Backend& StepPlanner::backend_for(bool decode, const KvPool& pool) {
  const OpDesc op = describe(decode, pool);
  BackendSlot& slot = slots_by_op_[static_cast<size_t>(op.op)];
  if (slot.backend == nullptr) slot.backend = &select_backend(Registry::builtin(), selection_, op);
  return *slot.backend;
}

const std::vector<int64_t>& StepPlanner::logit_rows(const Step& step) {
  rows_.clear();
  int64_t start = 0;
  for (const RequestStep& req : step.requests) {
    const int64_t n = static_cast<int64_t>(req.tokens.size());
    if (!req.wants_logits) {
      start += n;
      continue;
    }
    const int64_t count = step.rows == LogitsRows::kAll ? n : req.num_logit_rows;
    for (int64_t i = n - count; i < n; ++i) rows_.push_back(start + i);
    start += n;
  }
  return rows_;
}

}  // namespace pagedattn::model
