// The CPU backend class: what it supports (with reasons), its workspace, plan and run entry
// points. The work is in cpu_validate.cpp (arguments -> Problem), cpu_plan.cpp (work partition)
// and cpu_attention.cpp (the kernel and the merge of split KV).
#include "cpu/cpu_backend.h"

#include <fmt/format.h>

#include "core/check.h"
#include "cpu/cpu_plan.h"
#include "cpu/cpu_problem.h"
#include "cpu/cpu_simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pagedattn::cpu {
namespace {

int32_t max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

bool is_query_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

Support check_dim(const char* what, int32_t dim, int32_t max_dim) {
  if (dim < kHeadDimMultiple || dim % kHeadDimMultiple != 0 || dim > max_dim) {
    return Support::no(fmt::format("{} {} is not supported (expected a multiple of {} in [{}, {}])",
                                   what, dim, kHeadDimMultiple, kHeadDimMultiple, max_dim));
  }
  return Support::yes();
}

CpuWorkspace& cpu_workspace(Workspace& workspace) {
  auto* ws = dynamic_cast<CpuWorkspace*>(&workspace);
  PA_CHECK(ws != nullptr,
           "workspace: not a cpu workspace (create it with the cpu backend's create_workspace())");
  return *ws;
}

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }

  Support supports(const OpDesc& op) const override {
    if (op.device.type != DeviceType::kCPU) {
      return Support::no(
          fmt::format("device {} (the cpu backend runs on the host: cpu)", op.device.str()));
    }
    if (!is_query_dtype(op.q_dtype)) {
      return Support::no(
          fmt::format("q dtype {} (expected f32, f16 or bf16)", dtype_name(op.q_dtype)));
    }
    if (!is_floating(op.kv_dtype)) {
      return Support::no(fmt::format("kv dtype {} (expected f32, f16, bf16 or fp8_e4m3)",
                                     dtype_name(op.kv_dtype)));
    }
    if (op.page_size < 1)
      return Support::no(fmt::format("page_size {} (expected >= 1)", op.page_size));
    if (op.num_qo_heads < 1 || op.num_kv_heads < 1 || op.num_qo_heads % op.num_kv_heads != 0) {
      return Support::no(fmt::format(
          "{} query heads with {} KV heads (the query heads must be a positive multiple of the KV "
          "heads)",
          op.num_qo_heads, op.num_kv_heads));
    }
    if (is_mla(op.op)) {
      if (op.num_kv_heads != 1) {
        return Support::no(
            fmt::format("MLA with {} KV heads (the latent cache has 1)", op.num_kv_heads));
      }
      if (op.soft_cap || op.sliding_window) {
        return Support::no("MLA with soft-cap or sliding window (not part of MLA's arguments)");
      }
      if (Support s = check_dim("kv_lora_rank (head_dim_vo)", op.head_dim_vo, kMaxHeadDimVo); !s) {
        return s;
      }
      const int32_t rope = op.head_dim_qk - op.head_dim_vo;
      if (rope < kHeadDimMultiple || rope % kHeadDimMultiple != 0 ||
          op.head_dim_qk > kMaxHeadDimQk) {
        return Support::no(fmt::format(
            "MLA rope_dim {} (head_dim_qk {} - kv_lora_rank {}): expected a multiple of {} with "
            "head_dim_qk <= {}",
            rope, op.head_dim_qk, op.head_dim_vo, kHeadDimMultiple, kMaxHeadDimQk));
      }
      return Support::yes();
    }
    if (Support s = check_dim("head_dim_qk", op.head_dim_qk, kMaxHeadDimQk); !s) return s;
    if (Support s = check_dim("head_dim_vo", op.head_dim_vo, kMaxHeadDimVo); !s) return s;
    if (op.op == OpKind::kDecode && op.head_dim_qk != op.head_dim_vo) {
      return Support::no(fmt::format("decode with head_dim_qk {} != head_dim_vo {}", op.head_dim_qk,
                                     op.head_dim_vo));
    }
    return Support::yes();
  }

  std::string describe() const override {
    return fmt::format(
        "decode, prefill, mla_decode, mla_extend; q f32/f16/bf16, kv f32/f16/bf16/fp8_e4m3; "
        "head_dim multiples of {} (qk <= {}, vo <= {}); any group size and page size; NHD/HND; "
        "soft-cap, sliding window; {} threads, simd {}",
        kHeadDimMultiple, kMaxHeadDimQk, kMaxHeadDimVo, max_threads(), simd::active_isa());
  }

  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits& limits) const override {
    return std::make_unique<CpuWorkspace>(limits, max_threads());
  }

  void plan(Workspace& workspace, const OpDesc& op, const StepMetadata& meta) const override {
    const Support support = supports(op);
    PA_CHECK(support.ok, "cpu backend cannot run {}: {}", op_name(op.op), support.reason);
    build_plan(cpu_workspace(workspace), op, meta);
  }

  void run_decode(Workspace& workspace, const DecodeArgs& args) const override {
    CpuWorkspace& ws = cpu_workspace(workspace);
    run_problem(ws, make_problem(args));
  }

  void run_prefill(Workspace& workspace, const PrefillArgs& args) const override {
    CpuWorkspace& ws = cpu_workspace(workspace);
    run_problem(ws, make_problem(args));
  }

  void run_mla(Workspace& workspace, const MlaArgs& args) const override {
    CpuWorkspace& ws = cpu_workspace(workspace);
    run_problem(ws, make_problem(args));
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace pagedattn::cpu
