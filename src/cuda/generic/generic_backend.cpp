// The "cuda_generic" backend (generic.h): supports() / describe() / an empty workspace / run_* over
// the one generic kernel (generic_kernel.cu). Arguments are checked on the host (shapes, dtypes,
// devices), with errors naming the argument; the metadata is read on the device only.
#include <cuda_runtime_api.h>

#include <cmath>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/fault_log.h"
#include "cuda/generic/generic.h"
#include "cuda/generic/generic_params.h"
#include "cuda/metadata_validate.h"

namespace pagedattn::cuda {
namespace {

using generic::GenericParams;
using generic::kMaxDim;

// Nothing to plan: the kernel reads the metadata as it is (checked on the device: common/guard.h;
// the first violation is recorded in `faults` and reported by check_device_errors()).
class GenericWorkspace final : public Workspace {
 public:
  explicit GenericWorkspace(const WorkspaceLimits& limits) : validate(limits.validate_metadata) {}
  void check_device_errors() override { faults.check(); }

  FaultLog faults;
  bool validate = false;             // WorkspaceLimits::validate_metadata
  OpKind planned = OpKind::kDecode;  // the last plan()'s operation (an MLA call's report)
};

bool is_query_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

void check_metadata(const StepMetadata& meta, Device device) {
  PA_CHECK(meta.batch_size >= 0, "meta.batch_size: {} (expected >= 0)", meta.batch_size);
  const int64_t batch = meta.batch_size;
  check_tensor("meta.qo_indptr", meta.qo_indptr, {kAnySize}, DType::kI32, device);
  check_tensor("meta.kv_indptr", meta.kv_indptr, {kAnySize}, DType::kI32, device);
  check_tensor("meta.kv_indices", meta.kv_indices, {kAnySize}, DType::kI32, device);
  check_tensor("meta.kv_last_page_len", meta.kv_last_page_len, {kAnySize}, DType::kI32, device);
  PA_CHECK(meta.qo_indptr.shape[0] >= batch + 1 && meta.kv_indptr.shape[0] >= batch + 1 &&
               meta.kv_last_page_len.shape[0] >= batch,
           "meta: qo_indptr [{}], kv_indptr [{}], kv_last_page_len [{}] for batch_size {} "
           "(expected >= {}, {}, {})",
           meta.qo_indptr.shape[0], meta.kv_indptr.shape[0], meta.kv_last_page_len.shape[0], batch,
           batch + 1, batch + 1, batch);
  for (const TensorView* view :
       {&meta.qo_indptr, &meta.kv_indptr, &meta.kv_indices, &meta.kv_last_page_len}) {
    PA_CHECK(view->strides[0] == 1 || view->shape[0] <= 1,
             "meta: stride {} (expected contiguous int32 arrays)", view->strides[0]);
  }
}

void set_metadata(const StepMetadata& meta, GenericParams& p) {
  p.qo_indptr = meta.qo_indptr.data_as<const int32_t>();
  p.kv_indptr = meta.kv_indptr.data_as<const int32_t>();
  p.kv_indices = meta.kv_indices.data_as<const int32_t>();
  p.kv_last_page_len = meta.kv_last_page_len.data_as<const int32_t>();
  p.batch = meta.batch_size;
}

void set_output(const TensorView& out, const TensorView& lse, GenericParams& p) {
  p.out = out.data;
  p.out_stride_row = out.strides[0];
  p.out_stride_head = out.strides[1];
  if (lse.defined()) {
    p.lse = lse.data_as<float>();
    p.lse_stride_row = lse.strides[0];
    p.lse_stride_head = lse.strides[1];
  }
}

// The guard of a call (common/guard.h), and the host check first in validating mode.
MetadataGuard guard_for(GenericWorkspace& ws, OpKind op, const StepMetadata& meta, int64_t rows,
                        int64_t pool_pages, int32_t page_size, Device device, void* stream) {
  if (ws.validate) {
    validate_on_host(meta,
                     {.page_size = page_size,
                      .num_attention_pages = pool_pages,
                      .rows = rows,
                      .one_row_per_request = op == OpKind::kDecode},
                     /*with_qo=*/true, device, stream);
  }
  MetadataGuard g = ws.faults.guard(op);
  g.pool_pages = pool_pages_bound(pool_pages);
  g.num_indices = meta.kv_indices.shape[0];
  g.num_rows = rows;
  return g;
}

// Decode and prefill: q [rows, Hq, Dqk] over K / V.
void run_paged(GenericWorkspace& ws, OpKind op, const TensorView& q, const PagedKv& kv,
               const StepMetadata& meta, const TensorView& out, const TensorView& lse,
               const AttentionOptions& options, bool causal, void* stream) {
  const std::string_view what = op_name(op);
  const Device device = q.device;
  PA_CHECK(device.type == DeviceType::kCUDA, "{} q: on {}, expected a CUDA device", what,
           device.str());
  kv.validate(device);
  const int64_t heads = q.ndim == 3 ? q.shape[1] : 0, dim = q.ndim == 3 ? q.shape[2] : 0;
  check_tensor("q", q, {kAnySize, kAnySize, kAnySize}, {DType::kF32, DType::kF16, DType::kBF16},
               device);
  check_inner_contiguous("q", q);
  const int64_t rows = q.shape[0];
  const int64_t kv_heads = kv.num_kv_heads(), dim_v = kv.v.shape[3];
  PA_CHECK(kv.k.shape[3] == dim, "kv.k: head_dim {} (expected q's {})", kv.k.shape[3], dim);
  PA_CHECK(kv_heads >= 1 && heads % kv_heads == 0,
           "q: {} heads over {} KV heads (expected a multiple)", heads, kv_heads);
  PA_CHECK(dim >= 1 && dim <= kMaxDim && dim_v >= 1 && dim_v <= kMaxDim,
           "head_dim {} / {} (cuda_generic: 1 .. {})", dim, dim_v, kMaxDim);
  check_tensor("out", out, {rows, heads, dim_v}, q.dtype, device);
  check_inner_contiguous("out", out);
  if (lse.defined()) check_tensor("lse", lse, {rows, heads}, DType::kF32, device);
  check_metadata(meta, device);
  PA_CHECK(std::isfinite(options.sm_scale) && options.sm_scale > 0.0f,
           "options.sm_scale: {} (expected finite > 0)", options.sm_scale);
  PA_CHECK(options.logits_soft_cap >= 0.0f, "options.logits_soft_cap: {} (expected >= 0)",
           options.logits_soft_cap);
  PA_CHECK(options.window_left >= -1, "options.window_left: {} (expected >= -1)",
           options.window_left);

  const bool nhd = kv.layout == KvLayout::kNHD;
  const auto slice = [&](const TensorView& cache) {
    generic::CacheSlice s;
    s.data = cache.data;
    s.stride_page = cache.strides[0];
    s.stride_token = nhd ? cache.strides[1] : cache.strides[2];
    s.stride_head = nhd ? cache.strides[2] : cache.strides[1];
    return s;
  };
  GenericParams p;
  p.q1 = {q.data, q.strides[0], q.strides[1]};
  p.k1 = slice(kv.k);
  p.v = slice(kv.v);
  p.dim1 = static_cast<int32_t>(dim);
  p.dim_v = static_cast<int32_t>(dim_v);
  set_output(out, lse, p);
  set_metadata(meta, p);
  p.rows = rows;
  p.num_qo_heads = static_cast<int32_t>(heads);
  p.group = static_cast<int32_t>(heads / kv_heads);
  p.page_size = kv.page_size;
  p.pages_per_alloc = kv.alloc_page_size() / kv.page_size;
  p.sm_scale = options.sm_scale;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.soft_cap = options.logits_soft_cap;
  p.window_left = options.window_left;
  p.causal = causal;
  p.guard = guard_for(ws, op, meta, rows, kv.num_attention_pages(), kv.page_size, device, stream);
  generic::launch_generic_attention(p, q.dtype, kv.k.dtype, stream);
}

class GenericBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda_generic"; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }

  Support supports(const OpDesc& op) const override {
    if (Support device = device_available(); !device) return device;
    if (op.device.type != DeviceType::kCUDA) {
      return Support::no(
          fmt::format("cuda_generic: device {} is not a CUDA device", op.device.str()));
    }
    if (!is_query_dtype(op.q_dtype)) {
      return Support::no(fmt::format("cuda_generic: q dtype {} (supported: f32, f16, bf16)",
                                     dtype_name(op.q_dtype)));
    }
    if (!is_query_dtype(op.kv_dtype) && op.kv_dtype != DType::kFP8E4M3) {
      return Support::no(
          fmt::format("cuda_generic: kv dtype {} (supported: f32, f16, bf16, fp8_e4m3)",
                      dtype_name(op.kv_dtype)));
    }
    if (op.head_dim_qk < 1 || op.head_dim_qk > kMaxDim || op.head_dim_vo < 1 ||
        op.head_dim_vo > kMaxDim || (is_mla(op.op) && op.head_dim_qk <= op.head_dim_vo)) {
      return Support::no(
          fmt::format("cuda_generic: head_dim qk {} / vo {} (supported: 1 .. {}; "
                      "MLA: qk = rank + rope > vo = rank)",
                      op.head_dim_qk, op.head_dim_vo, kMaxDim));
    }
    if (op.num_kv_heads < 1 || op.num_qo_heads < 1 || op.num_qo_heads % op.num_kv_heads != 0 ||
        (is_mla(op.op) && op.num_kv_heads != 1)) {
      return Support::no(fmt::format(
          "cuda_generic: {} query heads over {} KV heads (expected a multiple; MLA: 1 KV head)",
          op.num_qo_heads, op.num_kv_heads));
    }
    if (op.num_qo_heads > 65535) {
      return Support::no(
          fmt::format("cuda_generic: {} query heads (at most 65535)", op.num_qo_heads));
    }
    if (op.page_size < 1) {
      return Support::no(fmt::format("cuda_generic: page_size {} (expected >= 1)", op.page_size));
    }
    return Support::yes();
  }

  std::string describe() const override {
    std::string text =
        "CUDA cores, any shape the tuned kernels do not cover (a fallback, not tuned): decode, "
        "prefill/extend and MLA, q f32/f16/bf16, KV f32/f16/bf16/fp8_e4m3, head dims up to "
        "2048, any group size, any page size, NHD/HND, soft-cap, sliding window";
    if (const Support device = device_available(); !device) {
      text += fmt::format(" [unavailable: {}]", device.reason);
    }
    return text;
  }

  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits& limits) const override {
    if (Support device = device_available(); !device) {
      PA_FAIL("backend 'cuda_generic': {}", device.reason);
    }
    return std::make_unique<GenericWorkspace>(limits);
  }

  void plan(Workspace& workspace, const OpDesc& op, const StepMetadata&) const override {
    GenericWorkspace& ws = as_generic(workspace);
    ws.planned = op.op;
    if (ws.validate) {  // WorkspaceLimits::validate_metadata: what the kernels recorded so far
      PA_CUDA_CHECK(cudaDeviceSynchronize());
      ws.check_device_errors();
    }
  }

  void run_decode(Workspace& workspace, const DecodeArgs& args) const override {
    GenericWorkspace& ws = as_generic(workspace);
    PA_CHECK(args.q.ndim == 3 && args.meta.batch_size == args.q.shape[0],
             "run_decode: meta.batch_size {} for q of shape {} (expected one row per request)",
             args.meta.batch_size, args.q.shape_str());
    run_paged(ws, OpKind::kDecode, args.q, args.kv, args.meta, args.out, args.lse, args.options,
              /*causal=*/true, args.stream);
  }

  void run_prefill(Workspace& workspace, const PrefillArgs& args) const override {
    GenericWorkspace& ws = as_generic(workspace);
    run_paged(ws, OpKind::kPrefill, args.q, args.kv, args.meta, args.out, args.lse, args.options,
              args.options.causal, args.stream);
  }

  void run_mla(Workspace& workspace, const MlaArgs& args) const override {
    GenericWorkspace& ws = as_generic(workspace);
    const Device device = args.q_nope.device;
    PA_CHECK(device.type == DeviceType::kCUDA, "run_mla q_nope: on {}, expected a CUDA device",
             device.str());
    const PagedLatent& kv = args.kv;
    kv.validate(device);
    const int64_t rank = kv.kv_lora_rank(), rope = kv.rope_dim();
    PA_CHECK(rank + rope <= kMaxDim, "kv_lora_rank {} + rope_dim {} (cuda_generic: at most {})",
             rank, rope, kMaxDim);
    check_tensor("q_nope", args.q_nope, {kAnySize, kAnySize, rank},
                 {DType::kF32, DType::kF16, DType::kBF16}, device);
    const int64_t rows = args.q_nope.shape[0], heads = args.q_nope.shape[1];
    PA_CHECK(heads >= 1 && heads <= 65535, "q_nope: {} heads (expected 1 .. 65535)", heads);
    check_tensor("q_pe", args.q_pe, {rows, heads, rope}, args.q_nope.dtype, device);
    check_inner_contiguous("q_nope", args.q_nope);
    check_inner_contiguous("q_pe", args.q_pe);
    check_tensor("out", args.out, {rows, heads, rank}, args.q_nope.dtype, device);
    check_inner_contiguous("out", args.out);
    if (args.lse.defined()) check_tensor("lse", args.lse, {rows, heads}, DType::kF32, device);
    check_metadata(args.meta, device);
    PA_CHECK(std::isfinite(args.sm_scale) && args.sm_scale > 0.0f,
             "sm_scale: {} (expected finite > 0)", args.sm_scale);
    PA_CHECK(std::isfinite(kv.scale) && kv.scale > 0.0f, "kv.scale: {} (expected finite > 0)",
             kv.scale);
    const auto slice = [](const TensorView& cache) {
      return generic::CacheSlice{cache.data, cache.strides[0], cache.strides[1], 0};
    };
    GenericParams p;
    p.q1 = {args.q_nope.data, args.q_nope.strides[0], args.q_nope.strides[1]};
    p.q2 = {args.q_pe.data, args.q_pe.strides[0], args.q_pe.strides[1]};
    p.k1 = slice(kv.ckv);
    p.k2 = slice(kv.kpe);
    p.v = slice(kv.ckv);
    p.dim1 = static_cast<int32_t>(rank);
    p.dim2 = static_cast<int32_t>(rope);
    p.dim_v = static_cast<int32_t>(rank);
    set_output(args.out, args.lse, p);
    set_metadata(args.meta, p);
    p.rows = rows;
    p.num_qo_heads = static_cast<int32_t>(heads);
    p.group = static_cast<int32_t>(heads);
    p.page_size = kv.page_size;
    p.pages_per_alloc = kv.alloc_page_size() / kv.page_size;
    p.sm_scale = args.sm_scale;
    p.k_scale = p.v_scale = kv.scale;
    p.causal = args.causal;
    p.guard = guard_for(ws, is_mla(ws.planned) ? ws.planned : OpKind::kMlaExtend, args.meta, rows,
                        kv.num_attention_pages(), kv.page_size, device, args.stream);
    generic::launch_generic_attention(p, args.q_nope.dtype, kv.ckv.dtype, args.stream);
  }

 private:
  static GenericWorkspace& as_generic(Workspace& workspace) {
    auto* generic = dynamic_cast<GenericWorkspace*>(&workspace);
    PA_CHECK(generic != nullptr,
             "backend 'cuda_generic': the workspace was not created by the cuda_generic backend");
    return *generic;
  }
};

}  // namespace

std::unique_ptr<Backend> make_generic_backend() { return std::make_unique<GenericBackend>(); }

}  // namespace pagedattn::cuda
