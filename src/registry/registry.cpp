// The backend registry, and the one place the built-in backends are listed
// (register_builtin_backends), in priority order: CUDA first when compiled in (the tuned "cuda"
// kernels, then "cuda_generic" for the shapes they do not cover), then CPU.
//
// A build without CUDA still registers a "cuda" entry: it can serve nothing, and its supports()
// says why, so that an explicit `--backend cuda` gets an actionable reason instead of "unknown
// backend".
#include "pagedattn/registry.h"

#include "core/check.h"
#include "cpu/cpu_backend.h"
#ifdef PAGEDATTN_WITH_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/generic/generic.h"
#endif

namespace pagedattn {
namespace {

#ifndef PAGEDATTN_WITH_CUDA
// Stands in for the CUDA backend in a build without it.
class UnbuiltCudaBackend final : public Backend {
 public:
  static constexpr const char* kReason =
      "pagedattn was built without CUDA (configure with -DPAGEDATTN_CUDA=ON)";

  std::string_view name() const override { return "cuda"; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  Support supports(const OpDesc&) const override { return Support::no(kReason); }
  std::string describe() const override { return std::string("not available: ") + kReason; }
  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits&) const override {
    PA_FAIL("backend 'cuda': {}", kReason);
  }
  void plan(Workspace&, const OpDesc&, const StepMetadata&) const override {
    PA_FAIL("backend 'cuda': {}", kReason);
  }
  void run_decode(Workspace&, const DecodeArgs&) const override {
    PA_FAIL("backend 'cuda': {}", kReason);
  }
  void run_prefill(Workspace&, const PrefillArgs&) const override {
    PA_FAIL("backend 'cuda': {}", kReason);
  }
  void run_mla(Workspace&, const MlaArgs&) const override {
    PA_FAIL("backend 'cuda': {}", kReason);
  }
};
#endif

}  // namespace

void Registry::add(std::unique_ptr<Backend> backend) {
  PA_CHECK(backend != nullptr, "Registry::add: backend is null, expected a backend");
  PA_CHECK(find(backend->name()) == nullptr,
           "Registry::add: a backend named '{}' is already registered", backend->name());
  PA_CHECK(backend->name() != "auto", "Registry::add: 'auto' is reserved for automatic choice");
  backends_.push_back(std::move(backend));
}

const Backend* Registry::find(std::string_view name) const {
  for (const auto& backend : backends_) {
    if (backend->name() == name) return backend.get();
  }
  return nullptr;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> names;
  names.reserve(backends_.size());
  for (const auto& backend : backends_) names.emplace_back(backend->name());
  return names;
}

const Registry& Registry::builtin() {
  // Built on first use (thread-safe static initialisation), never destroyed before exit.
  static const Registry* registry = [] {
    auto* built = new Registry();
    register_builtin_backends(*built);
    return built;
  }();
  return *registry;
}

// The one place backends are listed. Order is priority within a device type.
void register_builtin_backends(Registry& registry) {
#ifdef PAGEDATTN_WITH_CUDA
  registry.add(cuda::make_backend());
  registry.add(cuda::make_generic_backend());
#else
  registry.add(std::make_unique<UnbuiltCudaBackend>());
#endif
  registry.add(cpu::make_backend());
}

}  // namespace pagedattn
