// Operation names, the one-line description of an operation, and deriving that description
// from a call's arguments (shapes, dtypes, device, options).
#include "core/check.h"
#include "pagedattn/backend.h"

namespace pagedattn {
namespace {

void require_dims(std::string_view name, const TensorView& view, int32_t ndim,
                  std::string_view shape) {
  PA_CHECK(view.ndim == ndim, "describe_op: {} has shape {} ({} dimensions), expected {}", name,
           view.shape_str(), view.ndim, shape);
}

int32_t extent(const TensorView& view, int dim) { return static_cast<int32_t>(view.shape[dim]); }

}  // namespace

std::string_view op_name(OpKind op) {
  switch (op) {
    case OpKind::kDecode:
      return "decode";
    case OpKind::kPrefill:
      return "prefill";
    case OpKind::kMlaDecode:
      return "mla_decode";
    case OpKind::kMlaExtend:
      return "mla_extend";
  }
  return "unknown";
}

std::string OpDesc::str() const {
  std::string text =
      fmt::format("{} on {}: q {}, kv {}, heads {}/{}, head_dim {}/{}, page_size {}", op_name(op),
                  device.str(), dtype_name(q_dtype), dtype_name(kv_dtype), num_qo_heads,
                  num_kv_heads, head_dim_qk, head_dim_vo, page_size);
  if (!is_mla(op)) text += fmt::format(", {}", layout_name(layout));
  if (op == OpKind::kPrefill || op == OpKind::kMlaExtend) text += causal ? ", causal" : ", full";
  if (soft_cap) text += ", soft_cap";
  if (sliding_window) text += ", sliding_window";
  return text;
}

namespace {

// Decode and prefill describe the same fields: q [rows, Hq, Dqk] over a paged K/V cache.
OpDesc describe_paged(OpKind kind, const TensorView& q, const PagedKv& kv,
                      const AttentionOptions& options, std::string_view q_shape) {
  require_dims("q", q, 3, q_shape);
  require_dims("kv.k", kv.k, 4, "a 4-D paged cache");
  require_dims("kv.v", kv.v, 4, "a 4-D paged cache");
  OpDesc op;
  op.op = kind;
  op.device = q.device;
  op.q_dtype = q.dtype;
  op.kv_dtype = kv.k.dtype;
  op.num_qo_heads = extent(q, 1);
  op.num_kv_heads = kv.num_kv_heads();
  op.head_dim_qk = extent(q, 2);
  op.head_dim_vo = extent(kv.v, 3);
  op.page_size = kv.page_size;
  op.layout = kv.layout;
  op.causal = options.causal;
  op.soft_cap = options.logits_soft_cap > 0.0f;
  op.sliding_window = options.window_left >= 0;
  return op;
}

}  // namespace

OpDesc describe_op(const DecodeArgs& args) {
  return describe_paged(OpKind::kDecode, args.q, args.kv, args.options, "[B, Hq, D]");
}

OpDesc describe_op(const PrefillArgs& args) {
  return describe_paged(OpKind::kPrefill, args.q, args.kv, args.options, "[T, Hq, Dqk]");
}

OpDesc describe_op(const MlaArgs& args, OpKind kind) {
  PA_CHECK(is_mla(kind),
           "describe_op: operation {} is not an MLA operation (expected mla_decode "
           "or mla_extend)",
           op_name(kind));
  require_dims("q_nope", args.q_nope, 3, "[T, H, kv_lora_rank]");
  require_dims("q_pe", args.q_pe, 3, "[T, H, rope_dim]");
  require_dims("kv.ckv", args.kv.ckv, 3, "[pages, alloc_page_size, kv_lora_rank]");
  OpDesc op;
  op.op = kind;
  op.device = args.q_nope.device;
  op.q_dtype = args.q_nope.dtype;
  op.kv_dtype = args.kv.ckv.dtype;
  op.num_qo_heads = extent(args.q_nope, 1);
  op.num_kv_heads = 1;
  op.head_dim_qk = extent(args.q_nope, 2) + extent(args.q_pe, 2);
  op.head_dim_vo = extent(args.q_nope, 2);
  op.page_size = args.kv.page_size;
  op.layout = KvLayout::kNHD;
  op.causal = args.causal;
  return op;
}

}  // namespace pagedattn
