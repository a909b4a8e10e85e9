// The "cuda" backend: supports() / describe() / workspace / plan / run for decode (this
// directory's decode/), prefill and MLA (prefill.h, mla.h).
//
// supports() first asks whether a device is usable at all (cudaGetDeviceCount, once per process)
// and says why not, e.g. "no CUDA device: cudaGetDeviceCount failed: CUDA driver version is
// insufficient for CUDA runtime version", so that `--backend cuda` fails with a reason on a machine
// without a GPU and `auto` silently falls back to the CPU.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <string_view>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode.h"
#include "cuda/metadata_validate.h"
#include "cuda/mla.h"
#include "cuda/prefill.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda {
namespace {

Support probe_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return Support::no(fmt::format("no CUDA device: cudaGetDeviceCount failed: {} ({})",
                                   cudaGetErrorString(status), cudaGetErrorName(status)));
  }
  if (count == 0) return Support::no("no CUDA device: cudaGetDeviceCount found 0 devices");
  return Support::yes();
}

CudaWorkspace& as_cuda(Workspace& workspace) {
  auto* cuda = dynamic_cast<CudaWorkspace*>(&workspace);
  PA_CHECK(cuda != nullptr, "backend 'cuda': the workspace was not created by the cuda backend");
  return *cuda;
}

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }

  Support supports(const OpDesc& op) const override {
    if (Support device = device_available(); !device) return device;
    if (op.device.type != DeviceType::kCUDA) {
      return Support::no(fmt::format("device {} is not a CUDA device", op.device.str()));
    }
    switch (op.op) {
      case OpKind::kDecode:
        return supports_decode(op);
      case OpKind::kPrefill:
        return supports_prefill(op);
      case OpKind::kMlaDecode:
      case OpKind::kMlaExtend:
        return supports_mla(op);
    }
    return Support::no("unknown operation");
  }

  std::string describe() const override {
    const Support device = device_available();
    std::string text =
        "CUDA (sm_90a): decode bf16/f16 q, KV same or fp8_e4m3, head_dim 64/128/256, any group "
        "size, any page size, NHD/HND, soft-cap, sliding window, split-KV; prefill/extend "
        "bf16/f16 q, KV same or fp8_e4m3 (see prefill.h); MLA decode/speculative/extend bf16 q, "
        "bf16/fp8 latent, any page size, split-KV";
    if (!device) text += fmt::format(" [unavailable: {}]", device.reason);
    return text;
  }

  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits& limits) const override {
    if (Support device = device_available(); !device) PA_FAIL("backend 'cuda': {}", device.reason);
    return std::make_unique<CudaWorkspace>(limits);
  }

  void plan(Workspace& workspace, const OpDesc& op, const StepMetadata& meta) const override {
    CudaWorkspace& ws = as_cuda(workspace);
    if (op.op == OpKind::kDecode) {
      plan_decode(ws, op, meta);
    } else if (is_mla(op.op)) {
      plan_mla(ws, op, meta);
    } else {
      // Prefill schedules its own tiles in run_prefill(); remember the step for checks.
      if (ws.validating()) {  // WorkspaceLimits::validate_metadata (the pool's pages: at run)
        PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ws.stream)));
        ws.check_device_errors();
        validate_on_host(meta, {.page_size = op.page_size}, /*with_qo=*/true,
                         Device::cuda(ws.device()), ws.stream);
      }
      ws.planned = true;
      ws.planned_op = op;
      ws.planned_meta = meta;
    }
  }

  void run_decode(Workspace& workspace, const DecodeArgs& args) const override {
    cuda::run_decode(as_cuda(workspace), args);
  }

  void run_prefill(Workspace& workspace, const PrefillArgs& args) const override {
    cuda::run_prefill(as_cuda(workspace), args);
  }

  void run_mla(Workspace& workspace, const MlaArgs& args) const override {
    cuda::run_mla(as_cuda(workspace), args);
  }
};

}  // namespace

Support device_available() {
  static const Support answer = probe_device();
  return answer;
}

std::unique_ptr<Backend> make_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace pagedattn::cuda
