// Argument validation of the CPU backend: turns DecodeArgs / PrefillArgs / MlaArgs into a
// Problem (cpu_problem.h) after checking everything, so that a bad call throws before any output
// byte is written. Order: options, queries, cache, outputs, then the metadata against all of them.
#include <cmath>

#include "core/check.h"
#include "cpu/cpu_problem.h"
#include "planner/metadata_check.h"

namespace pagedattn::cpu {
namespace {

constexpr std::initializer_list<DType> kQueryDtypes = {DType::kF32, DType::kF16, DType::kBF16};
constexpr std::initializer_list<DType> kKvDtypes = {DType::kF32, DType::kF16, DType::kBF16,
                                                    DType::kFP8E4M3};

void check_head_dim(std::string_view name, int64_t dim, int32_t max_dim) {
  PA_CHECK(dim > 0 && dim % kHeadDimMultiple == 0 && dim <= max_dim,
           "{}: head_dim {} is not supported by the cpu backend (expected a multiple of {} in "
           "[{}, {}])",
           name, dim, kHeadDimMultiple, kHeadDimMultiple, max_dim);
}

void check_scale(std::string_view name, float scale, DType kv_dtype) {
  PA_CHECK(std::isfinite(scale) && scale > 0, "{}: {} must be finite and > 0", name, scale);
  PA_CHECK(kv_dtype == DType::kFP8E4M3 || scale == 1.0f,
           "{}: {} with a {} cache (dequantisation scales apply to fp8_e4m3 caches; expected 1)",
           name, scale, dtype_name(kv_dtype));
}

void check_sm_scale(std::string_view name, float sm_scale) {
  PA_CHECK(std::isfinite(sm_scale) && sm_scale > 0,
           "{}: {} must be finite and > 0 (it is explicit, e.g. 1/sqrt(head_dim))", name, sm_scale);
}

RowSource row_source(const TensorView& view) {
  return {static_cast<const char*>(view.data), view.dtype, view.strides[0], view.strides[1],
          static_cast<int32_t>(view.shape[2])};
}

// A 1-D int32 host metadata array with at least `min_size` entries, contiguous.
const int32_t* metadata(std::string_view name, const TensorView& view, int64_t min_size) {
  check_tensor(name, view, {kAnySize}, DType::kI32, Device::cpu());
  PA_CHECK(view.shape[0] >= min_size, "{}: {} entries, expected at least {}", name, view.shape[0],
           min_size);
  PA_CHECK(view.shape[0] <= 1 || view.strides[0] == 1, "{}: stride {}, expected 1 (contiguous)",
           name, view.strides[0]);
  return view.data_as<const int32_t>();
}

void set_outputs(Problem& p, const TensorView& out, const TensorView& lse, DType q_dtype) {
  check_tensor("out", out, {p.rows, p.heads, p.dim_vo}, q_dtype, Device::cpu());
  check_inner_contiguous("out", out);
  p.out = static_cast<char*>(out.data);
  p.out_dtype = out.dtype;
  p.out_row_stride = out.strides[0];
  p.out_head_stride = out.strides[1];
  if (lse.defined()) {
    check_tensor("lse", lse, {p.rows, p.heads}, DType::kF32, Device::cpu());
    p.lse = lse.data_as<float>();
    p.lse_row_stride = lse.strides[0];
    p.lse_head_stride = lse.strides[1];
  }
}

// Checks the step metadata's views (dtype, device, contiguity, sizes), then its values against the
// problem's rows and cache size (check_metadata_values, shared with the CUDA backends' validating
// mode); fills the pointers.
void set_metadata(Problem& p, const StepMetadata& meta, int64_t num_attention_pages,
                  bool one_row_per_request) {
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0, "meta.batch_size: {} must be >= 0", batch);
  p.batch = batch;
  p.kv_indptr = metadata("meta.kv_indptr", meta.kv_indptr, int64_t{batch} + 1);
  p.kv_last_page_len = metadata("meta.kv_last_page_len", meta.kv_last_page_len, batch);
  p.kv_indices = metadata("meta.kv_indices", meta.kv_indices, 0);
  const int32_t* qo = nullptr;
  if (meta.qo_indptr.defined()) {
    qo = metadata("meta.qo_indptr", meta.qo_indptr, int64_t{batch} + 1);
  }
  if (one_row_per_request) {
    PA_CHECK(p.rows == batch,
             "q: {} rows, expected meta.batch_size = {} (decode: one query row per request)",
             p.rows, batch);
  } else if (qo == nullptr) {
    PA_CHECK(p.rows == batch,
             "meta.qo_indptr: missing, which means one query row per request, but q has {} rows "
             "for batch_size {}",
             p.rows, batch);
  }
  MetadataArrays arrays;
  arrays.batch = batch;
  arrays.qo_indptr = qo;
  arrays.kv_indptr = p.kv_indptr;
  arrays.kv_indices = p.kv_indices;
  arrays.num_indices = meta.kv_indices.shape[0];
  arrays.kv_last_page_len = p.kv_last_page_len;
  arrays.max_q_len = meta.max_q_len;
  MetadataBounds bounds;
  bounds.page_size = p.page_size;
  bounds.num_attention_pages = num_attention_pages;
  bounds.rows = p.rows;
  bounds.one_row_per_request = one_row_per_request;
  check_metadata_values(arrays, bounds);
  if (!one_row_per_request) p.qo_indptr = qo;
}

// Shared by decode and prefill: q, the MHA/GQA cache and the options.
Problem make_kv_problem(OpKind op, const TensorView& q, const PagedKv& kv,
                        const AttentionOptions& options) {
  Problem p;
  p.op = op;
  check_sm_scale("options.sm_scale", options.sm_scale);
  PA_CHECK(std::isfinite(options.logits_soft_cap) && options.logits_soft_cap >= 0,
           "options.logits_soft_cap: {} must be >= 0 (0 = off)", options.logits_soft_cap);
  PA_CHECK(options.window_left >= -1, "options.window_left: {} must be >= -1 (-1 = off)",
           options.window_left);
  p.sm_scale = options.sm_scale;
  p.soft_cap = options.logits_soft_cap;
  p.window_left = options.window_left;
  p.causal = op == OpKind::kDecode ? true : options.causal;

  check_tensor("q", q, {kAnySize, kAnySize, kAnySize}, kQueryDtypes, Device::cpu());
  check_inner_contiguous("q", q);
  p.rows = q.shape[0];
  p.heads = static_cast<int32_t>(q.shape[1]);
  p.dim_qk = static_cast<int32_t>(q.shape[2]);
  PA_CHECK(p.heads > 0, "q: {} query heads, expected > 0", p.heads);
  check_head_dim("q", p.dim_qk, kMaxHeadDimQk);

  check_tensor("kv.k", kv.k, {kAnySize, kAnySize, kAnySize, kAnySize}, kKvDtypes, Device::cpu());
  check_inner_contiguous("kv.k", kv.k);
  PA_CHECK(kv.page_size >= 1, "kv.page_size: {} must be >= 1", kv.page_size);
  const int64_t alloc = kv.alloc_page_size();
  PA_CHECK(alloc >= kv.page_size && alloc % kv.page_size == 0,
           "kv.page_size: {} does not divide the allocation page size {} of kv.k", kv.page_size,
           alloc);
  p.kv_heads = kv.num_kv_heads();
  PA_CHECK(p.kv_heads > 0 && p.heads % p.kv_heads == 0,
           "q: {} query heads is not a multiple of the cache's {} KV heads", p.heads, p.kv_heads);
  p.group = p.heads / p.kv_heads;
  PA_CHECK(kv.head_dim() == p.dim_qk, "kv.k: head_dim {} differs from q's head_dim {}",
           kv.head_dim(), p.dim_qk);
  const bool nhd = kv.layout == KvLayout::kNHD;
  const int64_t pages = kv.num_alloc_pages();
  if (nhd) {
    check_tensor("kv.v", kv.v, {pages, alloc, p.kv_heads, kAnySize}, kv.k.dtype, Device::cpu());
  } else {
    check_tensor("kv.v", kv.v, {pages, p.kv_heads, alloc, kAnySize}, kv.k.dtype, Device::cpu());
  }
  check_inner_contiguous("kv.v", kv.v);
  p.dim_vo = static_cast<int32_t>(kv.v.shape[3]);
  check_head_dim("kv.v", p.dim_vo, kMaxHeadDimVo);
  PA_CHECK(op != OpKind::kDecode || p.dim_vo == p.dim_qk,
           "kv.v: head_dim {} differs from k's {} (decode needs equal head dims)", p.dim_vo,
           p.dim_qk);
  check_scale("kv.k_scale", kv.k_scale, kv.k.dtype);
  check_scale("kv.v_scale", kv.v_scale, kv.k.dtype);

  p.q = row_source(q);
  p.kv_dtype = kv.k.dtype;
  p.page_size = kv.page_size;
  p.pages_per_alloc = static_cast<int32_t>(alloc / kv.page_size);
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  auto paged = [nhd](const TensorView& t) {
    return PagedSource{static_cast<const char*>(t.data), t.strides[0],
                       nhd ? t.strides[1] : t.strides[2], nhd ? t.strides[2] : t.strides[1],
                       static_cast<int32_t>(t.shape[3])};
  };
  p.k = paged(kv.k);
  p.v = paged(kv.v);
  return p;
}

}  // namespace

Problem make_problem(const DecodeArgs& args) {
  Problem p = make_kv_problem(OpKind::kDecode, args.q, args.kv, args.options);
  set_outputs(p, args.out, args.lse, args.q.dtype);
  set_metadata(p, args.meta, args.kv.num_attention_pages(), /*one_row_per_request=*/true);
  return p;
}

Problem make_problem(const PrefillArgs& args) {
  Problem p = make_kv_problem(OpKind::kPrefill, args.q, args.kv, args.options);
  set_outputs(p, args.out, args.lse, args.q.dtype);
  set_metadata(p, args.meta, args.kv.num_attention_pages(), /*one_row_per_request=*/false);
  return p;
}

Problem make_problem(const MlaArgs& args) {
  Problem p;
  p.op = OpKind::kMlaExtend;
  check_sm_scale("sm_scale", args.sm_scale);
  p.sm_scale = args.sm_scale;
  p.causal = args.causal;

  check_tensor("q_nope", args.q_nope, {kAnySize, kAnySize, kAnySize}, kQueryDtypes, Device::cpu());
  check_inner_contiguous("q_nope", args.q_nope);
  p.rows = args.q_nope.shape[0];
  p.heads = static_cast<int32_t>(args.q_nope.shape[1]);
  PA_CHECK(p.heads > 0, "q_nope: {} heads, expected > 0", p.heads);
  check_tensor("q_pe", args.q_pe, {p.rows, p.heads, kAnySize}, args.q_nope.dtype, Device::cpu());
  check_inner_contiguous("q_pe", args.q_pe);

  const PagedLatent& kv = args.kv;
  check_tensor("kv.ckv", kv.ckv, {kAnySize, kAnySize, kAnySize}, kKvDtypes, Device::cpu());
  check_inner_contiguous("kv.ckv", kv.ckv);
  const int64_t pages = kv.num_alloc_pages();
  const int64_t alloc = kv.alloc_page_size();
  check_tensor("kv.kpe", kv.kpe, {pages, alloc, kAnySize}, kv.ckv.dtype, Device::cpu());
  check_inner_contiguous("kv.kpe", kv.kpe);
  PA_CHECK(kv.page_size >= 1, "kv.page_size: {} must be >= 1", kv.page_size);
  PA_CHECK(alloc >= kv.page_size && alloc % kv.page_size == 0,
           "kv.page_size: {} does not divide the allocation page size {} of kv.ckv", kv.page_size,
           alloc);
  const int32_t rank = kv.kv_lora_rank(), rope = kv.rope_dim();
  check_head_dim("kv.ckv (kv_lora_rank)", rank, kMaxHeadDimVo);
  PA_CHECK(rope > 0 && rope % kHeadDimMultiple == 0 && rank + rope <= kMaxHeadDimQk,
           "kv.kpe: rope_dim {} is not supported (expected a multiple of {} with kv_lora_rank + "
           "rope_dim <= {})",
           rope, kHeadDimMultiple, kMaxHeadDimQk);
  PA_CHECK(args.q_nope.shape[2] == rank, "q_nope: last dimension {} differs from kv_lora_rank {}",
           args.q_nope.shape[2], rank);
  PA_CHECK(args.q_pe.shape[2] == rope, "q_pe: last dimension {} differs from rope_dim {}",
           args.q_pe.shape[2], rope);
  check_scale("kv.scale", kv.scale, kv.ckv.dtype);

  p.kv_heads = 1;
  p.group = p.heads;
  p.dim_qk = rank + rope;
  p.dim_vo = rank;
  p.q = row_source(args.q_nope);
  p.q_rope = row_source(args.q_pe);
  p.kv_dtype = kv.ckv.dtype;
  p.latent = true;
  p.page_size = kv.page_size;
  p.pages_per_alloc = static_cast<int32_t>(alloc / kv.page_size);
  p.k_scale = p.v_scale = kv.scale;
  p.k = {static_cast<const char*>(kv.ckv.data), kv.ckv.strides[0], kv.ckv.strides[1], 0, rank};
  p.k_rope = {static_cast<const char*>(kv.kpe.data), kv.kpe.strides[0], kv.kpe.strides[1], 0, rope};
  set_outputs(p, args.out, args.lse, args.q_nope.dtype);
  set_metadata(p, args.meta, kv.num_attention_pages(), /*one_row_per_request=*/false);
  return p;
}

}  // namespace pagedattn::cpu
