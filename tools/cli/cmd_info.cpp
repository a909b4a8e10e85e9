// `pagedattn info`: the backends in priority order, the devices, what each backend supports
// (Backend::describe()), whether it can serve each operation here (supports() on a typical
// operation of its device), and what `auto` and PAGEDATTN_BACKEND would choose.
#include <fmt/format.h>

#include <cstdlib>

#include "pagedattn/registry.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"
#ifdef PAGEDATTN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace pagedattn::tools {
namespace {

constexpr OpKind kAllOps[] = {OpKind::kDecode, OpKind::kPrefill, OpKind::kMlaDecode,
                              OpKind::kMlaExtend};

// A typical operation of each kind (Llama-style GQA; DeepSeek-style MLA) on `device`.
OpDesc typical_op(OpKind kind, Device device) {
  OpDesc op;
  op.op = kind;
  op.device = device;
  if (is_mla(kind)) {
    op.num_qo_heads = 128;
    op.num_kv_heads = 1;
    op.head_dim_qk = 576;
    op.head_dim_vo = 512;
    op.page_size = 64;
  }
  return op;
}

Device device_of(const Backend& backend) {
  return backend.device_type() == DeviceType::kCUDA ? Device::cuda(0) : Device::cpu();
}

void run_info() {
  const Registry& registry = Registry::builtin();
  fmt::print("pagedattn 0.1.0\n\ndevices\n");
  fmt::print("  cpu     {}\n", machine_description());
#ifdef PAGEDATTN_WITH_CUDA
  const Support gpu = cuda::device_available();
  fmt::print("  cuda:0  {}\n", gpu ? "available" : "not usable: " + gpu.reason);
#else
  fmt::print("  cuda    not built (configure with -DPAGEDATTN_CUDA=ON)\n");
#endif

  fmt::print("\nbackends, in priority order\n");
  Table table({"#", "backend", "device", "decode", "prefill", "mla_decode", "mla_extend"});
  std::vector<std::string> reasons;
  int index = 0;
  for (const auto& backend : registry.backends()) {
    std::vector<std::string> row{std::to_string(++index), std::string(backend->name()),
                                 device_of(*backend).str()};
    for (OpKind kind : kAllOps) {
      const Support support = backend->supports(typical_op(kind, device_of(*backend)));
      row.push_back(support ? "yes" : "no");
      if (!support) {
        reasons.push_back(
            fmt::format("  {} {}: {}", backend->name(), op_name(kind), support.reason));
      }
    }
    table.add_row(std::move(row));
  }
  fmt::print("{}", table.str());
  fmt::print(
      "(for a typical operation: GQA 32/8 heads, head_dim 128, bf16, page 16; MLA 128 "
      "heads, 512+64, page 64)\n");
  if (!reasons.empty()) {
    fmt::print("\nwhy not\n");
    for (const std::string& reason : reasons) fmt::print("{}\n", reason);
  }

  fmt::print("\nwhat each supports\n");
  for (const auto& backend : registry.backends()) {
    fmt::print("  {}: {}\n", backend->name(), backend->describe());
  }

  const char* env = std::getenv("PAGEDATTN_BACKEND");
  fmt::print("\nselection (PAGEDATTN_BACKEND={})\n", env != nullptr && *env ? env : "<unset>");
  Selection selection;
  try {
    selection = Selection::from_env();
  } catch (const Error& error) {
    fmt::print("  {}\n", error.what());
    return;
  }
  for (Device device : {Device::cpu(), Device::cuda(0)}) {
    for (OpKind kind : kAllOps) {
      std::string chosen;
      try {
        chosen = std::string(select_backend(registry, selection, typical_op(kind, device)).name());
      } catch (const Error& error) {
        // The first line names the operation; the reasons are listed under "why not".
        const std::string message = error.what();
        chosen = "none: " + message.substr(0, message.find('\n'));
      }
      fmt::print("  {:<10} on {:<6} -> {}\n", op_name(kind), device.str(), chosen);
    }
  }
}

void add_info_command(CLI::App& app) {
  app.add_subcommand("info", "Backends, devices, what each supports and what would be chosen")
      ->callback(run_info);
}

PAGEDATTN_CLI_COMMAND("info", add_info_command);

}  // namespace

}  // namespace pagedattn::tools
