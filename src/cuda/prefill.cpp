// Host side of the CUDA prefill / extend: what is supported, validation of the arguments (every
// check before any launch, each error naming the argument, its value and what was expected), and
// the translation of the views into the kernel's PrefillParams (src/cuda/prefill/params.h).
//
// The metadata lives on the device and is never read here (no host sync, graph-capturable); the
// launcher bounds the grid from host-known sizes (T, B, max_q_len; params.h) and CTAs past the
// last tile exit at once.
//
// Split-KV: when the (query tile, KV head) grid covers less than one wave of the SMs (a chunked
// prefill or speculative step of a few short requests over long KV), the keys are cut into chunks
// of >= kMinChunkTokens so that about two waves run, sized from the same host-known bounds
// (max_q_len, and num_pages_hint x P >= every request's kv_len); partials go to the workspace's
// f32 buffers and a merge kernel combines them. Without both hints, no split. (The rule is
// choose_kv_split's; 15.8x at 1 x 1 / 32768 against no split: bench/RESULTS.md.)
#include "cuda/prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/check.h"
#include "cuda/cuda_fault.h"
#include "cuda/metadata_validate.h"
#include "cuda/prefill/params.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda {

namespace {

bool supported_head_dims(int32_t qk, int32_t vo) {
  return (qk == vo && (qk == 64 || qk == 128 || qk == 256)) || (qk == 192 && vo == 128);
}

constexpr const char* kHeadDimsText = "64/64, 128/128, 256/256 or 192/128";

constexpr int64_t kMinChunkTokens = 256;  // below this a chunk's setup outweighs its keys
constexpr int64_t kMaxChunks = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Fills p's split-KV fields (params.h) when splitting pays and the partials fit the workspace:
// the query tiles x KV heads cover less than the SMs, and the hints bound every request's keys.
void choose_kv_split(const CudaWorkspace& ws, int64_t num_pages_hint, int32_t head_dim_vo,
                     prefill::PrefillParams& p) {
  if (p.max_q_len <= 0 || num_pages_hint <= 0 || p.batch_size == 0 || p.num_qo_rows == 0) return;
  const int64_t ctas = prefill::tile_bound(p, 64) * p.num_kv_heads;  // 64: the smaller tile
  const int64_t sms = ws.num_sms();
  if (ctas == 0 || ctas >= sms) return;
  const int64_t kv_bound = num_pages_hint * p.page_size;  // >= the longest request's kv_len
  if (kv_bound > (int64_t{1} << 30)) return;
  // Chunks sized from the mean length (kv_bound / B) so that a request of that length takes about
  // `wanted` of them; longer requests take more (up to kMaxChunks, the last one runs to kv_len),
  // shorter ones leave their extra chunks' CTAs to exit at once.
  const int64_t wanted = ceil_div(2 * sms, ctas);
  const int64_t chunk_tokens = std::max(
      kMinChunkTokens,
      round_up(ceil_div(kv_bound, int64_t{p.batch_size} * wanted), int64_t{prefill::kChunkAlign}));
  const int64_t per_chunk = p.num_qo_rows * p.num_qo_heads;
  const int64_t fits = std::min(ws.partial_out_capacity() / (per_chunk * head_dim_vo),
                                ws.partial_lse_capacity() / per_chunk);
  const int64_t chunks = std::min({ceil_div(kv_bound, chunk_tokens), fits, kMaxChunks});
  if (chunks < 2) return;
  p.num_kv_chunks = static_cast<int32_t>(chunks);
  // With fewer chunks than wanted (the buffers) the last one runs to kv_len anyway (kernel.cuh).
  p.kv_chunk_tokens = static_cast<int32_t>(chunk_tokens);
  p.partial_out = ws.partial_out();
  p.partial_lse = ws.partial_lse();
}

void check_metadata(const TensorView& view, std::string_view name, int64_t min_size,
                    Device device) {
  check_tensor(name, view, {kAnySize}, DType::kI32, device);
  PA_CHECK(view.shape[0] >= min_size, "{}: {} entries, expected at least {}", name, view.shape[0],
           min_size);
  PA_CHECK(view.strides[0] == 1, "{}: stride {}, expected a contiguous array (stride 1)", name,
           view.strides[0]);
}

// cp.async moves 16 bytes: the pointer and every outer stride must keep 16-byte alignment.
void check_vector_aligned(std::string_view name, const TensorView& view, int64_t bytes) {
  PA_CHECK(reinterpret_cast<uintptr_t>(view.data) % bytes == 0,
           "{}: data pointer {} is not {}-byte aligned (expected for vector loads)", name,
           view.data, bytes);
  const int64_t elements = bytes / dtype_size(view.dtype);
  for (int d = 0; d + 1 < view.ndim; ++d) {
    PA_CHECK(view.strides[d] % elements == 0,
             "{}: stride {} of dimension {} is not a multiple of {} elements (expected {}-byte "
             "aligned rows)",
             name, view.strides[d], d, elements, bytes);
  }
}

// An fp8 cache's dequantisation scale: finite > 0; any other cache's: 1 (as the CPU backend).
void check_scale(std::string_view name, float scale, DType kv_dtype) {
  if (kv_dtype == DType::kFP8E4M3) {
    PA_CHECK(std::isfinite(scale) && scale > 0.0f, "{}: {} (expected finite > 0)", name, scale);
  } else {
    PA_CHECK(scale == 1.0f,
             "{}: {} with a {} cache (expected 1; dequantisation scales apply to fp8_e4m3 caches)",
             name, scale, dtype_name(kv_dtype));
  }
}

}  // namespace

Support supports_prefill(const OpDesc& op) {
  if (op.op != OpKind::kPrefill) {
    return Support::no(
        fmt::format("prefill kernel: operation {} (expected prefill)", op_name(op.op)));
  }
  if (op.device.type != DeviceType::kCUDA) {
    return Support::no(fmt::format("prefill kernel: device {} (expected cuda)", op.device.str()));
  }
  if (op.q_dtype != DType::kBF16 && op.q_dtype != DType::kF16) {
    return Support::no(
        fmt::format("prefill kernel: q dtype {} (expected bf16 or f16)", dtype_name(op.q_dtype)));
  }
  if (op.kv_dtype != op.q_dtype && op.kv_dtype != DType::kFP8E4M3) {
    return Support::no(fmt::format(
        "prefill kernel: kv dtype {} with q dtype {} (expected the q dtype or fp8_e4m3)",
        dtype_name(op.kv_dtype), dtype_name(op.q_dtype)));
  }
  if (!supported_head_dims(op.head_dim_qk, op.head_dim_vo)) {
    return Support::no(fmt::format("prefill kernel: head_dim_qk/vo {}/{} (expected {})",
                                   op.head_dim_qk, op.head_dim_vo, kHeadDimsText));
  }
  if (op.num_kv_heads < 1 || op.num_qo_heads < 1 || op.num_qo_heads % op.num_kv_heads != 0) {
    return Support::no(fmt::format(
        "prefill kernel: {} query heads over {} KV heads (expected a positive multiple)",
        op.num_qo_heads, op.num_kv_heads));
  }
  if (op.page_size < 1) {
    return Support::no(fmt::format("prefill kernel: page_size {} (expected >= 1)", op.page_size));
  }
  return Support::yes();
}

void run_prefill(CudaWorkspace& workspace, const PrefillArgs& args) {
  const OpDesc op = describe_op(args);
  const Device device = args.q.device;
  PA_CHECK(device.type == DeviceType::kCUDA, "q: on {}, expected a cuda device", device.str());
  const Support support = supports_prefill(op);
  PA_CHECK(support.ok, "{}", support.reason);

  const PagedKv& kv = args.kv;
  kv.validate(device);
  const int64_t rows = args.q.shape[0];
  const int32_t hq = op.num_qo_heads, hkv = op.num_kv_heads;
  check_tensor("q", args.q, {kAnySize, hq, op.head_dim_qk}, op.q_dtype, device);
  check_inner_contiguous("q", args.q);
  check_vector_aligned("q", args.q, 16);
  check_tensor("kv.k", kv.k, {kAnySize, kAnySize, kAnySize, op.head_dim_qk}, op.kv_dtype, device);
  check_tensor("kv.v", kv.v, {kAnySize, kAnySize, kAnySize, op.head_dim_vo}, op.kv_dtype, device);
  check_vector_aligned("kv.k", kv.k, 16);
  check_vector_aligned("kv.v", kv.v, 16);
  check_tensor("out", args.out, {rows, hq, op.head_dim_vo}, op.q_dtype, device);
  check_inner_contiguous("out", args.out);
  check_vector_aligned("out", args.out, 4);
  if (args.lse.defined()) check_tensor("lse", args.lse, {rows, hq}, DType::kF32, device);

  const StepMetadata& meta = args.meta;
  const int32_t batch = meta.batch_size;
  PA_CHECK(batch >= 0, "meta.batch_size: {} (expected >= 0)", batch);
  check_metadata(meta.qo_indptr, "meta.qo_indptr", int64_t{batch} + 1, device);
  check_metadata(meta.kv_indptr, "meta.kv_indptr", int64_t{batch} + 1, device);
  check_metadata(meta.kv_indices, "meta.kv_indices", 0, device);
  check_metadata(meta.kv_last_page_len, "meta.kv_last_page_len", batch, device);
  PA_CHECK(meta.max_q_len >= 0, "meta.max_q_len: {} (expected >= 0; 0 = unknown)", meta.max_q_len);

  const AttentionOptions& options = args.options;
  PA_CHECK(std::isfinite(options.sm_scale) && options.sm_scale > 0.0f,
           "options.sm_scale: {} (expected finite > 0)", options.sm_scale);
  PA_CHECK(std::isfinite(options.logits_soft_cap) && options.logits_soft_cap >= 0.0f,
           "options.logits_soft_cap: {} (expected >= 0; 0 = off)", options.logits_soft_cap);
  PA_CHECK(options.window_left >= -1, "options.window_left: {} (expected >= 0, or -1 = off)",
           options.window_left);
  check_scale("kv.k_scale", kv.k_scale, op.kv_dtype);
  check_scale("kv.v_scale", kv.v_scale, op.kv_dtype);

  if (workspace.validating()) {
    validate_on_host(meta,
                     {.page_size = kv.page_size,
                      .num_attention_pages = kv.num_attention_pages(),
                      .rows = rows,
                      .one_row_per_request = false},
                     /*with_qo=*/true, device, args.stream);
  }

  const int group = hq / hkv;
  // Grid bound (see params.h tile_bound) with the smallest tile of either kernel: 64 rows.
  const int64_t max_blocks = (rows * group / 64 + batch) * static_cast<int64_t>(hkv);
  PA_CHECK(max_blocks < (int64_t{1} << 31),
           "q: {} rows x {} query heads over {} requests need {} thread blocks (expected < 2^31)",
           rows, hq, batch, max_blocks);
  PA_CHECK(int64_t{hq} * rows < (int64_t{1} << 31) / 2 && rows < (int64_t{1} << 30),
           "q: {} rows x {} heads is too large for 32-bit row indices", rows, hq);

  prefill::PrefillParams p;
  p.q = args.q.data;
  p.out = args.out.data;
  p.lse = args.lse.defined() && !kFaultLseNotWritten ? args.lse.data_as<float>() : nullptr;
  p.q_stride_token = args.q.strides[0];
  p.q_stride_head = args.q.strides[1];
  p.out_stride_token = args.out.strides[0];
  p.out_stride_head = args.out.strides[1];
  if (args.lse.defined()) {
    p.lse_stride_token = args.lse.strides[0];
    p.lse_stride_head = args.lse.strides[1];
  }
  const bool nhd = kv.layout == KvLayout::kNHD;
  p.k = kv.k.data;
  p.v = kv.v.data;
  p.k_stride_page = kv.k.strides[0];
  p.k_stride_token = nhd ? kv.k.strides[1] : kv.k.strides[2];
  p.k_stride_head = nhd ? kv.k.strides[2] : kv.k.strides[1];
  p.v_stride_page = kv.v.strides[0];
  p.v_stride_token = nhd ? kv.v.strides[1] : kv.v.strides[2];
  p.v_stride_head = nhd ? kv.v.strides[2] : kv.v.strides[1];
  p.qo_indptr = meta.qo_indptr.data_as<const int32_t>();
  p.kv_indptr = meta.kv_indptr.data_as<const int32_t>();
  p.kv_indices = meta.kv_indices.data_as<const int32_t>();
  p.kv_last_page_len = meta.kv_last_page_len.data_as<const int32_t>();
  p.batch_size = batch;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.group_size = group;
  p.page_size = kv.page_size;
  p.pages_per_alloc = kv.alloc_page_size() / kv.page_size;
  // K's dequantisation scale folds into the logits' (soft-cap included): logits =
  // sm_scale * k_scale * q.k, as decode and the CPU backend compute them; V's scales the output.
  p.sm_scale = faulty_sm_scale(options.sm_scale) * kv.k_scale;
  p.v_scale = kv.v_scale;
  p.logits_soft_cap = options.logits_soft_cap;
  p.window_left = faulty_window(options.window_left);
  p.causal = options.causal;
  p.num_qo_rows = rows;
  p.max_q_len = meta.max_q_len;
  p.kv_tokens_hint = meta.num_pages_hint * kv.page_size;
  p.unit_counters = workspace.prefill_unit_counters();
  p.num_sms = workspace.num_sms();
  p.guard = workspace.guard(OpKind::kPrefill);
  p.guard.pool_pages = pool_pages_bound(kv.num_attention_pages());
  p.guard.num_indices = meta.kv_indices.shape[0];
  p.guard.num_rows = rows;
  p.guard.max_q_len = meta.max_q_len;
  choose_kv_split(workspace, meta.num_pages_hint, op.head_dim_vo, p);

  const bool bf16 = op.q_dtype == DType::kBF16, fp8 = op.kv_dtype == DType::kFP8E4M3;
  auto* launch = fp8 ? (bf16 ? prefill::launch_prefill_bf16_fp8 : prefill::launch_prefill_f16_fp8)
                     : (bf16 ? prefill::launch_prefill_bf16 : prefill::launch_prefill_f16);
  launch(p, op.head_dim_qk, op.head_dim_vo, args.stream);
}

int32_t prefill_kv_chunks(const CudaWorkspace& workspace, const PrefillArgs& args) {
  const OpDesc op = describe_op(args);
  prefill::PrefillParams p;
  p.batch_size = args.meta.batch_size;
  p.num_qo_heads = op.num_qo_heads;
  p.num_kv_heads = op.num_kv_heads;
  p.group_size = op.num_kv_heads > 0 ? op.num_qo_heads / op.num_kv_heads : 0;
  p.page_size = args.kv.page_size;
  p.num_qo_rows = args.q.shape[0];
  p.max_q_len = args.meta.max_q_len;
  choose_kv_split(workspace, args.meta.num_pages_hint, op.head_dim_vo, p);
  return p.num_kv_chunks;
}

}  // namespace pagedattn::cuda
