// Batch decode on CUDA: supports(), plan() and run() for OpKind::kDecode (host side; the kernels
// are launched from decode_launch.cu).
//
// plan: the split-KV partition of kv_indptr (planner.h's rule, target = resident decode CTAs /
// KV heads) is computed on the device into the workspace; the host never learns the item count,
// so the decode grid is the bound batch + target_items and CTAs past info->num_items exit.
// run: one decode kernel instantiation per (head dim, q dtype, KV dtype), chosen by the KV dtype
// alone (decode_launch.cu): tensor cores for KV of q's dtype, CUDA cores for fp8 KV; page size,
// layout, group size, soft-cap and window are runtime values. The partials of split requests are
// combined
//   lse = M + log(sum_i exp(lse_i - M)),  out = sum_i exp(lse_i - lse) * out_i
// by the last CTA of each (request, head tile) in the tensor-core kernel, and by a merge kernel
// (one CTA per request and query head) after the CUDA-core kernel. Two environment switches,
// PAGEDATTN_DECODE_KV_PREFETCH and PAGEDATTN_DECODE_MERGE_READ (below); the alternatives measured
// against these (the CUDA-core kernel for bf16 KV, the merge kernel after the tensor-core one,
// evict-first KV loads) are in bench/RESULTS.md, "Tried and retired".
#include "cuda/decode/decode.h"

#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_fault.h"
#include "cuda/decode/decode_params.h"
#include "cuda/metadata_validate.h"
#include "cuda/planner/planner_kernels.h"

namespace pagedattn::cuda {
namespace {

// One of a switch's values (ARCHITECTURE.md, "Switches"), read per call so that tests can
// switch: `unset` when the variable is not set, an error naming it for a value not in `choices`.
struct SwitchValue {
  std::string_view name;
  int32_t value;
};
int32_t switch_value(const char* variable, std::initializer_list<SwitchValue> choices,
                     int32_t unset) {
  const char* env = std::getenv(variable);
  if (env == nullptr) return unset;
  std::string expected;
  for (const SwitchValue& choice : choices) {
    if (choice.name == env) return choice.value;
    expected += fmt::format("{}{}", expected.empty() ? "" : ", ", choice.name);
  }
  PA_FAIL("{}='{}': expected one of {}", variable, env, expected);
}

// PAGEDATTN_DECODE_KV_PREFETCH=lines|bulk|off (off when unset).
int32_t kv_prefetch_switch() {
  return switch_value(
      "PAGEDATTN_DECODE_KV_PREFETCH",
      {{"lines", kKvPrefetchLines}, {"bulk", kKvPrefetchBulk}, {"off", kKvPrefetchNone}},
      kKvPrefetchNone);
}

// PAGEDATTN_DECODE_MERGE_READ=bulk|loads (loads when unset).
int32_t merge_read_switch() {
  return switch_value("PAGEDATTN_DECODE_MERGE_READ",
                      {{"bulk", kMergeReadBulk}, {"loads", kMergeReadLoads}}, kMergeReadLoads);
}

void check_meta_i32(std::string_view name, const TensorView& view, int64_t min_elements,
                    Device device) {
  check_tensor(name, view, {kAnySize}, DType::kI32, device);
  PA_CHECK(view.strides[0] == 1 || view.shape[0] <= 1, "meta.{}: stride {}, expected 1", name,
           view.strides[0]);
  PA_CHECK(view.shape[0] >= min_elements, "meta.{}: {} entries, expected at least {}", name,
           view.shape[0], min_elements);
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

Support supports_decode(const OpDesc& op) {
  if (op.op != OpKind::kDecode) return Support::no("cuda decode: not a decode operation");
  if (op.device.type != DeviceType::kCUDA) {
    return Support::no(fmt::format("cuda: device {} is not a CUDA device", op.device.str()));
  }
  if (op.q_dtype != DType::kBF16 && op.q_dtype != DType::kF16) {
    return Support::no(
        fmt::format("cuda decode: q dtype {} (supported: bf16, f16)", dtype_name(op.q_dtype)));
  }
  if (op.kv_dtype != op.q_dtype && op.kv_dtype != DType::kFP8E4M3) {
    return Support::no(
        fmt::format("cuda decode: kv dtype {} with q dtype {} (supported: the q "
                    "dtype or fp8_e4m3)",
                    dtype_name(op.kv_dtype), dtype_name(op.q_dtype)));
  }
  if (op.head_dim_qk != op.head_dim_vo ||
      (op.head_dim_qk != 64 && op.head_dim_qk != 128 && op.head_dim_qk != 256)) {
    return Support::no(
        fmt::format("cuda decode: head_dim qk {} / vo {} (supported: 64, 128, "
                    "256, equal)",
                    op.head_dim_qk, op.head_dim_vo));
  }
  if (op.num_kv_heads < 1 || op.num_qo_heads < 1 || op.num_qo_heads % op.num_kv_heads != 0) {
    return Support::no(
        fmt::format("cuda decode: {} query heads over {} KV heads (expected a "
                    "multiple)",
                    op.num_qo_heads, op.num_kv_heads));
  }
  if (op.page_size < 1) {
    return Support::no(fmt::format("cuda decode: page_size {} (expected >= 1)", op.page_size));
  }
  return Support::yes();
}

void plan_decode(CudaWorkspace& workspace, const OpDesc& op, const StepMetadata& meta) {
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0 && batch <= workspace.limits().max_batch,
           "plan: batch_size {} (expected 0 .. workspace max_batch {})", batch,
           workspace.limits().max_batch);
  const Device device = Device::cuda(workspace.device());
  check_meta_i32("kv_indptr", meta.kv_indptr, int64_t{batch} + 1, device);
  if (workspace.validating()) {
    // WorkspaceLimits::validate_metadata: what the kernels recorded so far, then this step's
    // metadata, checked on the host (the pool's size is known at run_decode).
    PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(workspace.stream)));
    workspace.check_device_errors();
    validate_on_host(meta, {.page_size = op.page_size, .one_row_per_request = true},
                     /*with_qo=*/true, device, workspace.stream);
  }
  const SplitKvConfig config = workspace.split_config(op, batch);
  launch_split_kv(meta.kv_indptr.data_as<const int32_t>(), batch, config, workspace.work_request(),
                  workspace.work_chunk(), workspace.max_items(), workspace.merge_indptr(),
                  workspace.info(), workspace.stream);
  workspace.planned = true;
  workspace.planned_op = op;
  workspace.planned_meta = meta;
  workspace.planned_split = config;
  // Here, not in CudaBackend::plan: DecodeGraphRunner plans through this function directly, and
  // the next run's metadata may still be in flight (the partition above, a device planner).
  workspace.decode_runs_since_plan = 0;
}

void run_decode(CudaWorkspace& workspace, const DecodeArgs& args) {
  const Device device = Device::cuda(workspace.device());
  const OpDesc op = describe_op(args);
  const Support support = supports_decode(op);
  PA_CHECK(support.ok, "run_decode: {} ({})", support.reason, op.str());
  const int64_t batch = args.q.shape[0];
  const int32_t hq = op.num_qo_heads, hkv = op.num_kv_heads, dim = op.head_dim_qk;
  check_tensor("q", args.q, {batch, hq, dim}, {DType::kBF16, DType::kF16}, device);
  check_inner_contiguous("q", args.q);
  args.kv.validate(device);
  check_tensor("kv.k", args.kv.k, {kAnySize, kAnySize, kAnySize, dim}, op.kv_dtype, device);
  check_tensor("kv.v", args.kv.v, {kAnySize, kAnySize, kAnySize, dim}, op.kv_dtype, device);
  check_inner_contiguous("kv.k", args.kv.k);
  check_inner_contiguous("kv.v", args.kv.v);
  check_tensor("out", args.out, {batch, hq, dim}, args.q.dtype, device);
  check_inner_contiguous("out", args.out);
  if (args.lse.defined()) check_tensor("lse", args.lse, {batch, hq}, DType::kF32, device);
  PA_CHECK(args.meta.batch_size == batch, "meta.batch_size: {}, expected q's batch {}",
           args.meta.batch_size, batch);
  check_meta_i32("kv_indptr", args.meta.kv_indptr, batch + 1, device);
  check_meta_i32("kv_last_page_len", args.meta.kv_last_page_len, batch, device);
  check_meta_i32("kv_indices", args.meta.kv_indices, 0, device);
  PA_CHECK(args.options.sm_scale > 0.0f && std::isfinite(args.options.sm_scale),
           "options.sm_scale: {}, expected a finite value > 0", args.options.sm_scale);
  PA_CHECK(args.options.logits_soft_cap >= 0.0f,
           "options.logits_soft_cap: {}, expected >= 0 (0 = off)", args.options.logits_soft_cap);
  // 16-byte vector loads of K/V rows.
  const int64_t vec = 16 / dtype_size(op.kv_dtype);
  for (const auto* view : {&args.kv.k, &args.kv.v}) {
    const char* name = view == &args.kv.k ? "kv.k" : "kv.v";
    PA_CHECK(aligned16(view->data), "{}: data pointer {} is not 16-byte aligned", name, view->data);
    for (int d = 0; d < 3; ++d) {
      PA_CHECK(view->strides[d] % vec == 0,
               "{}: stride[{}] = {} elements, expected a multiple of {} (16-byte rows)", name, d,
               view->strides[d], vec);
    }
  }
  // The plan.
  PA_CHECK(workspace.planned && workspace.planned_op.op == OpKind::kDecode,
           "run_decode: the workspace holds no decode plan (call plan() for this step first)");
  PA_CHECK(workspace.planned_meta.kv_indptr.data == args.meta.kv_indptr.data &&
               workspace.planned_meta.batch_size == args.meta.batch_size &&
               workspace.planned_op.num_kv_heads == hkv &&
               workspace.planned_op.page_size == args.kv.page_size,
           "run_decode: the workspace was planned for another step ({}, batch {}); this call is "
           "{}, batch {}",
           workspace.planned_op.str(), workspace.planned_meta.batch_size, op.str(), batch);
  PA_CHECK(workspace.stream == args.stream,
           "run_decode: stream {} differs from the workspace's plan stream {}", args.stream,
           workspace.stream);
  PA_CHECK(hq <= workspace.limits().max_qo_heads && dim <= workspace.limits().max_head_dim,
           "run_decode: {} heads x head_dim {} exceed the workspace limits ({} x {})", hq, dim,
           workspace.limits().max_qo_heads, workspace.limits().max_head_dim);
  if (workspace.validating()) {
    validate_on_host(args.meta,
                     {.page_size = args.kv.page_size,
                      .num_attention_pages = args.kv.num_attention_pages(),
                      .rows = batch,
                      .one_row_per_request = true},
                     /*with_qo=*/true, device, args.stream);
  }
  if (batch == 0) return;

  const int grid_items = static_cast<int>(std::min<int64_t>(
      workspace.max_items(), batch + std::max(1, workspace.planned_split.target_items)));
  PA_CHECK(int64_t{grid_items} * hq * dim <= workspace.partial_out_capacity(),
           "run_decode: partial outputs need {} floats, the workspace holds {}",
           int64_t{grid_items} * hq * dim, workspace.partial_out_capacity());

  const bool nhd = args.kv.layout == KvLayout::kNHD;
  const auto& k = args.kv.k;
  const auto& v = args.kv.v;
  DecodeParams params{};
  params.q = args.q.data;
  params.q_stride_batch = args.q.strides[0];
  params.q_stride_head = args.q.strides[1];
  params.out = args.out.data;
  params.out_stride_batch = args.out.strides[0];
  params.out_stride_head = args.out.strides[1];
  params.lse = args.lse.defined() && !kFaultLseNotWritten ? args.lse.data_as<float>() : nullptr;
  params.lse_stride_batch = args.lse.defined() ? args.lse.strides[0] : 0;
  params.lse_stride_head = args.lse.defined() ? args.lse.strides[1] : 0;
  params.k = k.data;
  params.v = v.data;
  params.k_stride_page = k.strides[0];
  params.k_stride_token = nhd ? k.strides[1] : k.strides[2];
  params.k_stride_head = nhd ? k.strides[2] : k.strides[1];
  params.v_stride_page = v.strides[0];
  params.v_stride_token = nhd ? v.strides[1] : v.strides[2];
  params.v_stride_head = nhd ? v.strides[2] : v.strides[1];
  params.page_size = args.kv.page_size;
  params.pages_per_alloc = args.kv.alloc_page_size() / args.kv.page_size;
  params.kv_indptr = args.meta.kv_indptr.data_as<const int32_t>();
  params.kv_indices = args.meta.kv_indices.data_as<const int32_t>();
  params.kv_last_page_len = args.meta.kv_last_page_len.data_as<const int32_t>();
  params.batch = static_cast<int32_t>(batch);
  params.num_qo_heads = hq;
  params.num_kv_heads = hkv;
  params.group = hq / hkv;
  params.group_tiles = (params.group + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  constexpr float kLog2e = 1.4426950408889634f;
  const float cap = args.options.logits_soft_cap;
  params.q_scale =
      faulty_sm_scale(args.options.sm_scale) * args.kv.k_scale * (cap > 0.0f ? 1.0f : kLog2e);
  params.soft_cap = cap;
  params.soft_cap_log2 = cap * kLog2e;
  params.v_scale = args.kv.v_scale;
  params.window_left = faulty_window(args.options.window_left);
  params.partition = workspace.partition();
  params.partial_out = workspace.partial_out();
  params.partial_lse = workspace.partial_lse();
  params.merge_counters = workspace.merge_counters();
  params.guard = workspace.guard(OpKind::kDecode);
  params.guard.pool_pages = pool_pages_bound(args.kv.num_attention_pages());
  params.guard.num_indices = args.meta.kv_indices.shape[0];
  params.guard.num_rows = batch;
  params.early_metadata = workspace.decode_runs_since_plan > 0;
  params.kv_prefetch = kv_prefetch_switch();
  params.merge_read = merge_read_switch();
  params.trace = workspace.decode_trace(workspace.decode_runs_since_plan);
  PA_CHECK(batch * hkv * params.group_tiles <= workspace.merge_counters_capacity(),
           "run_decode: {} requests x {} head tiles exceed the workspace's {} merge counters",
           batch, hkv * params.group_tiles, workspace.merge_counters_capacity());

  ++workspace.decode_runs_since_plan;
  launch_decode(params, dim, args.q.dtype, op.kv_dtype, grid_items, args.stream);
}

}  // namespace pagedattn::cuda
