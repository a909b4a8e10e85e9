// Host side of CUDA MLA (absorbed DeepSeek MLA over the latent cache): supports(), validation and
// the launch of the partition, the kernel and the merge (src/cuda/mla/). Served: bf16 queries,
// bf16 or fp8 e4m3 cache (with its scale), rank 512 + rope 64, any head count, any page size.
//
// One kernel serves decode (q_len 1, or 2..4 for speculative decoding) and extend (longer q_len):
// the query rows of a request are (token, head) pairs, 64 per CTA (16 when a request has at most
// 16), causal by position kv_len - q_len + t. Work, all enqueued with no host synchronisation
// (graph-capturable):
//   1. the split-KV partition of kv_indptr on the device (planner.h's rule, the decode backend's
//      partition kernel and workspace buffers), target = batch * max(1, SMs / (batch * row
//      blocks per request)): about one wave of CTAs. Run once per step by plan() when the
//      metadata carries max_q_len (every layer's run_mla reuses it), else by each run_mla;
//   2. per run_mla, the MLA kernel over (row block, work item) CTAs; CTAs past the item count
//      exit. 16-row blocks may take a cluster of CTAs per item (mla_launch_shape,
//      mla_cluster_limit), which then replaces the split of a request;
//   3. the merge of split requests' f32 partials, [item, partial_rows, 512]: a merge kernel.
// Which kernel serves a step (the cache dtype, the row block, the device) is launch.cu's rule.
// partial_rows bounds q_len * H of every request: H * meta.max_q_len when the planner gave it, else
// H * T (q_len <= T always). If the partials of a split plan would not fit the workspace, the
// partition is run without splitting (one item per request: correct, less parallel).
#include "cuda/mla.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_fault.h"
#include "cuda/metadata_validate.h"
#include "cuda/mla/config.h"
#include "cuda/planner/planner_kernels.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda {
namespace {

void check_meta_i32(std::string_view name, const TensorView& view, int64_t min_elements,
                    Device device) {
  check_tensor(name, view, {kAnySize}, DType::kI32, device);
  PA_CHECK(view.strides[0] == 1 || view.shape[0] <= 1, "meta.{}: stride {}, expected 1", name,
           view.strides[0]);
  PA_CHECK(view.shape[0] >= min_elements, "meta.{}: {} entries, expected at least {}", name,
           view.shape[0], min_elements);
}

// 16-byte rows: the data pointer 16-byte aligned and every outer stride a multiple of 16 bytes.
void check_rows16(std::string_view name, const TensorView& view) {
  const int64_t vec = 16 / dtype_size(view.dtype);
  PA_CHECK(reinterpret_cast<uintptr_t>(view.data) % 16 == 0,
           "{}: data pointer {} is not 16-byte aligned", name, view.data);
  for (int d = 0; d + 1 < view.ndim; ++d) {
    PA_CHECK(view.strides[d] % vec == 0,
             "{}: stride[{}] = {} elements, expected a multiple of {} (16-byte rows)", name, d,
             view.strides[d], vec);
  }
}

// The launch shape of a step (mla_launch_shape, workspace.h) for query rows per request bounded by
// `max_q_len` (rows of the query tensor or the planner's hint), checked against the grid.
MlaShape mla_shape(const CudaWorkspace& workspace, const OpDesc& op, int32_t batch,
                   int64_t max_q_len) {
  const MlaCapacity capacity{workspace.num_sms(), workspace.max_items(),
                             workspace.partial_out_capacity(), workspace.partial_lse_capacity(),
                             mla::mla_cluster_limit(op.kv_dtype == DType::kFP8E4M3)};
  const MlaShape shape =
      mla_launch_shape(capacity, op.num_qo_heads, op.page_size, batch, max_q_len);
  PA_CHECK(shape.grid_items * shape.cluster <= 65535,
           "run_mla: {} work items x {} CTAs exceed the grid's 65535", shape.grid_items,
           shape.cluster);
  PA_CHECK(shape.grid_items <= workspace.max_items(),
           "run_mla: batch {} exceeds the workspace's {} work items", batch,
           workspace.max_items());
  return shape;
}

void launch_partition(CudaWorkspace& workspace, const StepMetadata& meta, const MlaShape& shape,
                      void* stream) {
  launch_split_kv(meta.kv_indptr.data_as<const int32_t>(), meta.batch_size, shape.config,
                  workspace.work_request(), workspace.work_chunk(), workspace.max_items(),
                  workspace.merge_indptr(), workspace.info(), stream);
}

}  // namespace

void plan_mla(CudaWorkspace& workspace, const OpDesc& op, const StepMetadata& meta) {
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0 && batch <= workspace.limits().max_batch,
           "plan: batch_size {} (expected 0 .. workspace max_batch {})", batch,
           workspace.limits().max_batch);
  PA_CHECK(meta.max_q_len >= 0, "meta.max_q_len: {} (expected >= 0; 0 = unknown)", meta.max_q_len);
  if (workspace.validating()) {  // WorkspaceLimits::validate_metadata (the pool's pages: at run)
    PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(workspace.stream)));
    workspace.check_device_errors();
    validate_on_host(meta, {.page_size = op.page_size}, /*with_qo=*/true,
                     Device::cuda(workspace.device()), workspace.stream);
  }
  workspace.planned = true;
  workspace.planned_op = op;
  workspace.planned_meta = meta;
  workspace.mla_partitioned = false;
  // Without max_q_len the bound on rows per request is the query tensor's, known at run_mla.
  if (batch == 0 || meta.max_q_len == 0 || op.num_qo_heads < 1 || op.page_size < 1) return;
  check_meta_i32("kv_indptr", meta.kv_indptr, int64_t{batch} + 1,
                 Device::cuda(workspace.device()));
  workspace.mla_shape = mla_shape(workspace, op, batch, meta.max_q_len);
  launch_partition(workspace, meta, workspace.mla_shape, workspace.stream);
  workspace.mla_partitioned = true;
}

Support supports_mla(const OpDesc& op) {
  const std::string_view name = op_name(op.op);
  if (!is_mla(op.op)) return Support::no(fmt::format("cuda mla: {} is not an MLA operation", name));
  if (op.device.type != DeviceType::kCUDA) {
    return Support::no(
        fmt::format("cuda {}: device {} is not a CUDA device", name, op.device.str()));
  }
  if (op.q_dtype != DType::kBF16 ||
      (op.kv_dtype != DType::kBF16 && op.kv_dtype != DType::kFP8E4M3)) {
    return Support::no(
        fmt::format("cuda {}: q dtype {} / kv dtype {} (supported: bf16 q with a bf16 or "
                    "fp8_e4m3 latent cache; f16 and f32 run on the CPU backend)",
                    name, dtype_name(op.q_dtype), dtype_name(op.kv_dtype)));
  }
  if (op.head_dim_vo != mla::kRank || op.head_dim_qk != mla::kDimQk) {
    return Support::no(
        fmt::format("cuda {}: kv_lora_rank {} + rope_dim {} (supported: 512 + 64, "
                    "DeepSeek V2/V3)",
                    name, op.head_dim_vo, op.head_dim_qk - op.head_dim_vo));
  }
  if (op.num_kv_heads != 1) {
    return Support::no(
        fmt::format("cuda {}: {} KV heads (the latent cache has 1)", name, op.num_kv_heads));
  }
  if (op.num_qo_heads < 1) {
    return Support::no(
        fmt::format("cuda {}: {} query heads (expected >= 1)", name, op.num_qo_heads));
  }
  if (op.page_size < 1) {
    return Support::no(fmt::format("cuda {}: page_size {} (expected >= 1)", name, op.page_size));
  }
  if (op.soft_cap || op.sliding_window) {
    return Support::no(fmt::format("cuda {}: soft-cap / sliding window (not part of MLA)", name));
  }
  return Support::yes();
}

void run_mla(CudaWorkspace& workspace, const MlaArgs& args) {
  const Device device = Device::cuda(workspace.device());
  PA_CHECK(workspace.planned && is_mla(workspace.planned_op.op),
           "run_mla: the workspace holds no MLA plan (call plan() with an MLA operation first)");
  const OpDesc op = describe_op(args, workspace.planned_op.op);
  const Support support = supports_mla(op);
  PA_CHECK(support.ok, "run_mla: {} ({})", support.reason, op.str());

  const int64_t rows = args.q_nope.shape[0];
  const int32_t heads = op.num_qo_heads;
  check_tensor("q_nope", args.q_nope, {rows, heads, mla::kRank}, DType::kBF16, device);
  check_tensor("q_pe", args.q_pe, {rows, heads, mla::kRope}, DType::kBF16, device);
  check_inner_contiguous("q_nope", args.q_nope);
  check_inner_contiguous("q_pe", args.q_pe);
  check_rows16("q_nope", args.q_nope);
  check_rows16("q_pe", args.q_pe);
  args.kv.validate(device);
  check_tensor("kv.ckv", args.kv.ckv, {kAnySize, kAnySize, mla::kRank}, op.kv_dtype, device);
  check_tensor("kv.kpe", args.kv.kpe, {kAnySize, kAnySize, mla::kRope}, op.kv_dtype, device);
  check_inner_contiguous("kv.ckv", args.kv.ckv);
  check_inner_contiguous("kv.kpe", args.kv.kpe);
  check_rows16("kv.ckv", args.kv.ckv);
  check_rows16("kv.kpe", args.kv.kpe);
  check_tensor("out", args.out, {rows, heads, mla::kRank}, DType::kBF16, device);
  check_inner_contiguous("out", args.out);
  check_rows16("out", args.out);
  if (args.lse.defined()) check_tensor("lse", args.lse, {rows, heads}, DType::kF32, device);
  PA_CHECK(args.sm_scale > 0.0f && std::isfinite(args.sm_scale),
           "sm_scale: {}, expected a finite value > 0", args.sm_scale);
  PA_CHECK(args.kv.scale > 0.0f && std::isfinite(args.kv.scale),
           "kv.scale: {}, expected a finite value > 0", args.kv.scale);

  const StepMetadata& meta = args.meta;
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0 && batch <= workspace.limits().max_batch,
           "meta.batch_size: {} (expected 0 .. workspace max_batch {})", batch,
           workspace.limits().max_batch);
  check_meta_i32("qo_indptr", meta.qo_indptr, int64_t{batch} + 1, device);
  check_meta_i32("kv_indptr", meta.kv_indptr, int64_t{batch} + 1, device);
  check_meta_i32("kv_last_page_len", meta.kv_last_page_len, batch, device);
  check_meta_i32("kv_indices", meta.kv_indices, 0, device);
  PA_CHECK(meta.max_q_len >= 0, "meta.max_q_len: {} (expected >= 0; 0 = unknown)", meta.max_q_len);
  PA_CHECK(rows * heads <= INT32_MAX, "q_nope: {} rows x {} heads exceed the int32 row index", rows,
           heads);
  if (workspace.validating()) {
    validate_on_host(meta,
                     {.page_size = args.kv.page_size,
                      .num_attention_pages = args.kv.num_attention_pages(),
                      .rows = rows,
                      .one_row_per_request = false},
                     /*with_qo=*/true, device, args.stream);
  }
  if (batch == 0 || rows == 0) return;

  // The plan's partition (run once per step by plan() when max_q_len is known), or one for this
  // call.
  const bool planned_here = workspace.mla_partitioned &&
                            workspace.planned_meta.kv_indptr.data == meta.kv_indptr.data &&
                            workspace.planned_meta.batch_size == batch &&
                            workspace.planned_meta.max_q_len == meta.max_q_len &&
                            workspace.planned_op.num_qo_heads == heads &&
                            workspace.planned_op.page_size == args.kv.page_size &&
                            workspace.planned_op.kv_dtype == op.kv_dtype;
  MlaShape shape;
  if (planned_here) {
    PA_CHECK(workspace.stream == args.stream,
             "run_mla: stream {} differs from the workspace's plan stream {}", args.stream,
             workspace.stream);
    shape = workspace.mla_shape;
  } else {
    const int64_t max_q_len =
        meta.max_q_len > 0 ? std::min<int64_t>(meta.max_q_len, rows) : rows;
    shape = mla_shape(workspace, op, batch, max_q_len);
    launch_partition(workspace, meta, shape, args.stream);
  }

  mla::MlaParams p;
  p.q_nope = args.q_nope.data;
  p.q_pe = args.q_pe.data;
  p.out = args.out.data;
  p.lse = args.lse.defined() && !kFaultLseNotWritten ? args.lse.data_as<float>() : nullptr;
  p.q_nope_stride_token = args.q_nope.strides[0];
  p.q_nope_stride_head = args.q_nope.strides[1];
  p.q_pe_stride_token = args.q_pe.strides[0];
  p.q_pe_stride_head = args.q_pe.strides[1];
  p.out_stride_token = args.out.strides[0];
  p.out_stride_head = args.out.strides[1];
  p.lse_stride_token = args.lse.defined() ? args.lse.strides[0] : 0;
  p.lse_stride_head = args.lse.defined() ? args.lse.strides[1] : 0;
  p.ckv = args.kv.ckv.data;
  p.kpe = args.kv.kpe.data;
  p.ckv_stride_page = args.kv.ckv.strides[0];
  p.ckv_stride_token = args.kv.ckv.strides[1];
  p.kpe_stride_page = args.kv.kpe.strides[0];
  p.kpe_stride_token = args.kv.kpe.strides[1];
  p.page_size = args.kv.page_size;
  p.page_shift = std::has_single_bit(static_cast<uint32_t>(p.page_size))
                     ? std::countr_zero(static_cast<uint32_t>(p.page_size))
                     : -1;
  p.pages_per_alloc = args.kv.alloc_page_size() / args.kv.page_size;
  p.qo_indptr = meta.qo_indptr.data_as<const int32_t>();
  p.kv_indptr = meta.kv_indptr.data_as<const int32_t>();
  p.kv_indices = meta.kv_indices.data_as<const int32_t>();
  p.kv_last_page_len = meta.kv_last_page_len.data_as<const int32_t>();
  p.batch_size = batch;
  p.num_heads = heads;
  constexpr float kLog2e = 1.4426950408889634f;
  p.scale_log2 = faulty_sm_scale(args.sm_scale) * args.kv.scale * kLog2e;
  p.out_scale = args.kv.scale;
  p.causal = args.causal;
  p.partition = workspace.partition();
  p.partial_out = workspace.partial_out();
  p.partial_lse = workspace.partial_lse();
  p.partial_rows = static_cast<int32_t>(shape.partial_rows);
  p.cluster = shape.cluster;
  p.guard = workspace.guard(workspace.planned_op.op);
  p.guard.pool_pages = pool_pages_bound(args.kv.num_attention_pages());
  p.guard.num_indices = meta.kv_indices.shape[0];
  p.guard.num_rows = rows;
  // The q_len bound the launch was sized by (partial_rows / H): the hint, else q's rows.
  p.guard.max_q_len = static_cast<int32_t>(shape.partial_rows / heads);

  const int merge_rows = static_cast<int>(std::min<int64_t>(shape.partial_rows, 65535));
  mla::launch_mla(p, op.kv_dtype == DType::kFP8E4M3, shape.block_rows,
                  static_cast<int>(shape.grid_items),
                  static_cast<int>(std::min<int64_t>(shape.row_blocks, INT32_MAX)),
                  shape.config.enable, merge_rows, args.stream);
}

}  // namespace pagedattn::cuda
