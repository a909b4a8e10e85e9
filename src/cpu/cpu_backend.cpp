// The CPU backend (placeholder while the kernels land): reports every op as not ready yet so that
// the registry and tools can link against pagedattn::cpu::make_backend().
#include "cpu/cpu_backend.h"

#include "core/check.h"

namespace pagedattn::cpu {
namespace {

class CpuWorkspace final : public Workspace {};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Support supports(const OpDesc&) const override {
    return Support::no("cpu backend: not ready yet (kernels landing)");
  }
  std::string describe() const override { return "cpu: not ready yet"; }
  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits&) const override {
    return std::make_unique<CpuWorkspace>();
  }
  void plan(Workspace&, const OpDesc&, const StepMetadata&) const override {
    PA_FAIL("cpu backend: not ready yet");
  }
  void run_decode(Workspace&, const DecodeArgs&) const override {
    PA_FAIL("cpu backend: not ready yet");
  }
  void run_prefill(Workspace&, const PrefillArgs&) const override {
    PA_FAIL("cpu backend: not ready yet");
  }
  void run_mla(Workspace&, const MlaArgs&) const override { PA_FAIL("cpu backend: not ready yet"); }
};

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace pagedattn::cpu
