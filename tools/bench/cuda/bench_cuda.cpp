// The CUDA side of `pagedattn bench decode|prefill|mla --device cuda` (the hook of bench_cuda.h):
// the generated case is copied to the device, planned once, and run_* alone is timed with CUDA
// events, the L2 flushed before every sample (median). The device's streaming-read bandwidth is
// measured once per process, in the same run, for the driver's ratio column.
// This is `--device cuda --host-data`: small cases only. The issues' large rows (up to 34 GB of
// KV) are generated on the device instead (bench_cuda_device.h, the default of --device cuda).
// MLA is asked of cuda::supports_mla() directly, not of the backend's supports(), so that an
// opt-in gate on selecting CUDA MLA does not stop the benchmark.
#include "tools/bench/bench_cuda.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "common/cases.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/mla.h"
#include "cuda/workspace.h"
#include "tools/bench/cuda/bench_cuda_util.h"

namespace pagedattn::tools {
namespace {

// A host view's bytes mirrored on the device (same shape and strides).
struct Mirror {
  cuda::DeviceBuffer buffer;
  TensorView view;
  explicit Mirror(const TensorView& host) : view(host) {
    if (!host.defined()) return;
    int64_t last = 0;
    for (int d = 0; d < host.ndim; ++d) last += (host.shape[d] - 1) * host.strides[d];
    const size_t bytes = static_cast<size_t>((last + 1) * dtype_size(host.dtype));
    buffer = cuda::DeviceBuffer(bytes);
    PA_CUDA_CHECK(cudaMemcpy(buffer.data(), host.data, bytes, cudaMemcpyHostToDevice));
    view.data = buffer.data();
    view.device = Device::cuda(0);
  }
};

}  // namespace

CudaBenchResult bench_attention_cuda(const testing::CaseSpec& spec, uint64_t seed,
                                     const TimingOptions& timing) {
  CudaBenchResult result;
  const Support device = cuda::device_available();
  if (!device) {
    std::string_view reason = device.reason;
    if (reason.starts_with("no CUDA device: ")) reason.remove_prefix(16);
    result.note = fmt::format("no usable CUDA device: {}", reason);
    return result;
  }
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  const testing::AttentionCase c(spec, seed);
  OpDesc op = c.op_desc();
  op.device = Device::cuda(0);
  if (const Support support = is_mla(op.op) ? cuda::supports_mla(op) : backend->supports(op);
      !support) {
    result.note = support.reason;
    return result;
  }
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  static const CudaCeilings ceilings = measure_cuda_ceilings(int64_t{1} << 30, 0, stream);
  WorkspaceLimits limits;
  limits.max_batch = std::max(64, c.batch_size());
  limits.max_qo_rows = std::max<int64_t>(1024, c.num_rows());
  limits.max_qo_heads = spec.num_qo_heads;
  limits.max_head_dim = std::max(spec.head_dim_qk, spec.head_dim_vo);
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;
  const StepMetadata& host_meta = c.meta();
  Mirror qo_indptr(host_meta.qo_indptr), kv_indptr(host_meta.kv_indptr),
      kv_indices(host_meta.kv_indices), last_page_len(host_meta.kv_last_page_len);
  StepMetadata meta = host_meta;
  meta.qo_indptr = qo_indptr.view;
  meta.kv_indptr = kv_indptr.view;
  meta.kv_indices = kv_indices.view;
  meta.kv_last_page_len = last_page_len.view;
  const int32_t reps = std::max<int32_t>(timing.min_samples, 15);
  double ns = 0;
  // Decode and prefill take the same paged arguments: mirror them, plan, time `run`.
  auto time_paged = [&](auto args, auto run) {
    Mirror q(args.q), k(args.kv.k), v(args.kv.v), out(args.out), lse(args.lse);
    args.q = q.view;
    args.kv.k = k.view;
    args.kv.v = v.view;
    args.out = out.view;
    args.lse = lse.view;
    args.meta = meta;
    args.stream = stream;
    backend->plan(*workspace, op, meta);
    return median_device_ns([&] { run(args); }, 3, reps, true, stream);
  };
  if (spec.op == OpKind::kDecode) {
    ns = time_paged(c.decode_args(),
                    [&](const DecodeArgs& a) { backend->run_decode(*workspace, a); });
  } else if (spec.op == OpKind::kPrefill) {
    ns = time_paged(c.prefill_args(),
                    [&](const PrefillArgs& a) { backend->run_prefill(*workspace, a); });
  } else {
    MlaArgs args = c.mla_args();
    Mirror q_nope(args.q_nope), q_pe(args.q_pe), ckv(args.kv.ckv), kpe(args.kv.kpe), out(args.out),
        lse(args.lse);
    args.q_nope = q_nope.view;
    args.q_pe = q_pe.view;
    args.kv.ckv = ckv.view;
    args.kv.kpe = kpe.view;
    args.out = out.view;
    args.lse = lse.view;
    args.meta = meta;
    args.stream = stream;
    backend->plan(*workspace, op, meta);
    ns = median_device_ns([&] { backend->run_mla(*workspace, args); }, 3, reps, true, stream);
  }
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  result.available = true;
  result.note = ceilings.device_name;
  result.median_ns = ns;
  result.device_bandwidth_gbs = ceilings.read_gbs;
  return result;
}

}  // namespace pagedattn::tools
