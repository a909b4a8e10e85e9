// Helpers of the CUDA tests (see cuda_test_util.h).
#include "cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_check.h"
#include "reference/reference.h"

namespace pagedattn::testing {

int64_t extent_bytes(const TensorView& view) {
  if (view.ndim == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < view.ndim; ++d) {
    if (view.shape[d] == 0) return 0;
    last += (view.shape[d] - 1) * view.strides[d];
  }
  return (last + 1) * dtype_size(view.dtype);
}

DeviceTensor::DeviceTensor(const TensorView& host)
    : buffer_(static_cast<size_t>(extent_bytes(host))), view_(host), bytes_(extent_bytes(host)) {
  view_.data = buffer_.data();
  view_.device = Device::cuda(0);
  if (bytes_ > 0) {
    PA_CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data, bytes_, cudaMemcpyHostToDevice));
  }
}

DeviceTensor DeviceTensor::poisoned_like(const TensorView& host) {
  DeviceTensor tensor;
  tensor.bytes_ = extent_bytes(host);
  tensor.buffer_ = cuda::DeviceBuffer(static_cast<size_t>(tensor.bytes_));
  tensor.view_ = host;
  tensor.view_.data = tensor.buffer_.data();
  tensor.view_.device = Device::cuda(0);
  if (tensor.bytes_ > 0) {
    PA_CUDA_CHECK(cudaMemset(tensor.buffer_.data(), 0xff, tensor.bytes_));
    // Poisoned before any stream's later work, non-blocking streams included (cudaMemset is
    // ordered on the legacy stream only).
    PA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return tensor;
}

DeviceTensor DeviceTensor::from_vector(const std::vector<int32_t>& values) {
  std::vector<int32_t> copy = values;
  const TensorView host =
      TensorView::contiguous(copy.data(), DType::kI32, {static_cast<int64_t>(copy.size())});
  return DeviceTensor(host);
}

void DeviceTensor::copy_to(const TensorView& host) const {
  if (bytes_ > 0)
    PA_CUDA_CHECK(cudaMemcpy(host.data, buffer_.data(), bytes_, cudaMemcpyDeviceToHost));
}

void DeviceTensor::copy_from(const TensorView& host) {
  if (bytes_ > 0)
    PA_CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data, bytes_, cudaMemcpyHostToDevice));
}

DeviceDecodeCase::DeviceDecodeCase(const AttentionCase& c) : host(&c) {
  const DecodeArgs h = c.decode_args();
  q = DeviceTensor(h.q);
  k = DeviceTensor(h.kv.k);
  v = DeviceTensor(h.kv.v);
  out = DeviceTensor::poisoned_like(h.out);
  if (h.lse.defined()) lse = DeviceTensor::poisoned_like(h.lse);
  qo_indptr = DeviceTensor(c.meta().qo_indptr);
  kv_indptr = DeviceTensor(c.meta().kv_indptr);
  kv_indices = DeviceTensor(c.meta().kv_indices);
  kv_last_page_len = DeviceTensor(c.meta().kv_last_page_len);
}

StepMetadata DeviceDecodeCase::meta() const {
  StepMetadata m = host->meta();
  m.qo_indptr = qo_indptr.view();
  m.kv_indptr = kv_indptr.view();
  m.kv_indices = kv_indices.view();
  m.kv_last_page_len = kv_last_page_len.view();
  return m;
}

DecodeArgs DeviceDecodeCase::args(void* stream) const {
  DecodeArgs a = host->decode_args();
  a.q = q.view();
  a.kv.k = k.view();
  a.kv.v = v.view();
  a.out = out.view();
  a.lse = a.lse.defined() ? lse.view() : TensorView{};
  a.meta = meta();
  a.stream = stream;
  return a;
}

void run_cuda_decode(const DeviceDecodeCase& device_case, void* stream) {
  static const std::unique_ptr<Backend> backend = cuda::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = std::max<int32_t>(64, device_case.host->batch_size());
  limits.max_qo_heads = 128;
  limits.max_head_dim = 256;
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;
  const DecodeArgs args = device_case.args(stream);
  backend->plan(*workspace, describe_op(args), args.meta);
  backend->run_decode(*workspace, args);
  PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void run_cpu_case(const AttentionCase& c) {
  static const std::unique_ptr<Backend> backend = cpu::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = std::max<int32_t>(64, c.batch_size());
  limits.max_qo_rows = std::max<int64_t>(1024, c.num_rows());
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  backend->plan(*workspace, c.op_desc(), c.meta());
  backend->run_decode(*workspace, c.decode_args());
}

std::string check_cuda_decode(const CaseSpec& spec, uint64_t seed) {
  const AttentionCase c(spec, seed);
  DeviceDecodeCase device_case(c);
  run_cuda_decode(device_case);
  // GPU results into the case's host buffers (poisoned first, so a short copy shows).
  poison(c.out());
  device_case.out.copy_to(c.out());
  const std::vector<double> got = to_doubles(c.out());
  std::vector<double> got_lse;
  if (c.lse().defined()) {
    poison(c.lse());
    device_case.lse.copy_to(c.lse());
    got_lse = to_doubles(c.lse());
  }
  std::vector<double> expected_lse;
  const std::vector<double> expected = reference_decode(c.decode_args(), &expected_lse);
  const Tolerance tolerance = tolerance_for(spec.q_dtype);
  std::string report = compare(got, expected, tolerance, "out vs reference");
  if (report.empty()) {
    report = compare_rows(got, expected, spec.head_dim_vo, gpu_row_tolerance(spec.q_dtype),
                          "out vs reference (relative to the row)");
  }
  if (c.lse().defined()) {
    const std::string r = compare(got_lse, expected_lse, kGpuLseTolerance, "lse vs reference");
    if (!r.empty()) report += (report.empty() ? "" : "\n") + r;
  }
  // The CPU backend on the same inputs: out at the row-relative tolerance of the output dtype
  // (both err by about one rounding of the output from float64), lse too.
  poison(c.out());
  if (c.lse().defined()) poison(c.lse());
  run_cpu_case(c);
  const std::vector<double> cpu = to_doubles(c.out());
  std::string r = compare(got, cpu, {2 * tolerance.abs, 2 * tolerance.rel}, "out vs cpu");
  if (r.empty()) {
    r = compare_rows(got, cpu, spec.head_dim_vo, gpu_row_tolerance(spec.q_dtype),
                     "out vs cpu (relative to the row)");
  }
  if (!r.empty()) report += (report.empty() ? "" : "\n") + r;
  if (c.lse().defined()) {
    const std::string lse_report =
        compare(got_lse, to_doubles(c.lse()), kGpuLseTolerance, "lse vs cpu");
    if (!lse_report.empty()) report += (report.empty() ? "" : "\n") + lse_report;
  }
  if (report.empty()) return report;
  return fmt::format("{} (seed {}; PAGEDATTN_TEST_SEED={} reproduces)\n{}", spec.name(), seed, seed,
                     report);
}

}  // namespace pagedattn::testing
