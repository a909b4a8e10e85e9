// Issue 5's MLA decode rows on the CUDA backend (see bench_cuda_device.h for the method): DeepSeek
// shape (kv_lora_rank 512 + rope 64), bf16, decode q_len 1, the latent cache ONE buffer
// [pages, P, 576] (ckv = its first 512 columns, kpe the last 64, as engines store it), generated
// on the device and sized for the largest (row, P); attention pages in random order, L2 flushed
// before each sample, median.
//
// Figures per row (B requests of kv_len tokens, H heads):
//   FLOPs  = B * 2 * H * kv_len * (576 + 512)  (QK^T over 576 columns, PV over 512, per query
//            token; the absorbed form);
//   bytes  = B * kv_len * 576 * 2             (the latent read once);
//   H >= 64 is compute-bound: TFLOP/s beside the cuBLAS bf16 matmul rate of the same run;
//   H < 64 is memory-bound: TB/s beside the streaming read of the same run.
// Both figures are printed for every row; "bound" names the ceiling the ratio is taken against.
// The library is called through the backend interface (cuda::make_backend(), plan, run_mla)
// without asking supports() first, so an opt-in gate on selecting CUDA MLA does not matter here
// (run_mla validates everything itself).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/mla/config.h"
#include "cuda/mla/wgmma_probe.h"
#include "tools/bench/cuda/bench_cuda_device.h"

namespace pagedattn::tools {
namespace {

constexpr int32_t kRank = 512, kRope = 64, kLatent = kRank + kRope;

}  // namespace

std::vector<BatchLen> default_mla_rows(int32_t heads) {
  if (heads >= 64) return parse_batch_lens("64x4096,64x8192,128x4096,128x8192", "--rows");
  return parse_batch_lens("16x1024,16x4096,128x4096,64x16384", "--rows");
}

nlohmann::json bench_mla_rows(const MlaRowsConfig& config, const CudaCeilings& ceilings,
                              void* stream) {
  PA_CHECK(!config.page_sizes.empty(), "--page-size: no page sizes");
  PA_CHECK(!config.heads.empty(), "--qo-heads: no head counts");
  for (int32_t p : config.page_sizes) PA_CHECK(p >= 1, "--page-size {}: expected >= 1", p);
  struct Set {
    int32_t heads;
    std::vector<BatchLen> rows;
  };
  std::vector<Set> sets;
  int64_t max_tokens = 0;
  int32_t max_batch = 1, max_heads = 1;
  for (int32_t heads : config.heads) {
    PA_CHECK(heads >= 1 && heads <= 128, "--qo-heads {}: expected 1 .. 128", heads);
    Set set{heads, config.rows.empty() ? default_mla_rows(heads) : config.rows};
    for (const BatchLen& row : set.rows) {
      PA_CHECK(!row.ragged && row.q_len == 0, "--rows {}: MLA decode rows are BxL", row.name());
      max_batch = std::max(max_batch, row.batch);
      for (int32_t p : config.page_sizes) {
        max_tokens =
            std::max<int64_t>(max_tokens, int64_t{row.batch} * ((row.kv_len + p - 1) / p) * p);
      }
    }
    max_heads = std::max(max_heads, heads);
    sets.push_back(std::move(set));
  }
  fmt::print(stderr, "mla: filling {:.2f} GB of latent cache on the device\n",
             max_tokens * kLatent * 2 / 1e9);
  cuda::DeviceBuffer latent = random_bf16(max_tokens * kLatent, 21, stream);
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = max_batch;
  limits.max_qo_rows = max_batch;
  limits.max_qo_heads = max_heads;
  limits.max_head_dim = kLatent;
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;
  const float sm_scale = 1.0f / std::sqrt(192.0f);  // DeepSeek: 1/sqrt(qk_nope 128 + rope 64)

  fmt::print(
      "\nMLA decode (q_len 1): rank 512 + rope 64, bf16 latent [pages, P, 576] in one buffer, "
      "pages in random order, L2 flushed, median of {}\n"
      "  FLOPs = 2 * H * kv_len * (576 + 512) per query token; bytes = kv_len * 576 * 2 per "
      "request\n  ratio: H >= 64 to the cuBLAS bf16 matmul ({:.0f} TFLOP/s), H < 64 to the "
      "streaming read ({:.0f} GB/s), both measured in this run\n"
      "{:>4} {:>12} {:>4} {:>10} {:>9} {:>7} {:>8} {:>6} {:>7} {:>7}\n",
      config.reps, ceilings.matmul_tflops, ceilings.read_gbs, "H", "B x kv_len", "P", "time_us",
      "TFLOP/s", "TB/s", "bound", "ratio", fmt::format("P/P{}", config.page_sizes[0]), "target");
  std::mt19937_64 rng(20261205);
  nlohmann::json rows = nlohmann::json::array();
  for (const Set& set : sets) {
    const int32_t heads = set.heads;
    const bool compute_bound = heads >= 64;
    for (const BatchLen& row : set.rows) {
      const int64_t q_rows = int64_t{row.batch} * heads;
      cuda::DeviceBuffer q_nope = random_bf16(q_rows * kRank, 22, stream);
      cuda::DeviceBuffer q_pe = random_bf16(q_rows * kRope, 23, stream);
      cuda::DeviceBuffer out(q_rows * kRank * 2), lse(q_rows * 4);
      double first = 0;
      for (int32_t page : config.page_sizes) {
        DeviceStep step = make_device_step(std::vector<int32_t>(row.batch, 1),
                                           std::vector<int32_t>(row.batch, row.kv_len), page, rng);
        MlaArgs args;
        args.meta = step.meta;
        TensorView ckv = TensorView::contiguous(latent.data(), DType::kBF16,
                                                {step.num_pages, page, kLatent}, Device::cuda(0));
        ckv.shape[2] = kRank;
        TensorView kpe = ckv;
        kpe.data = static_cast<char*>(latent.data()) + kRank * 2;
        kpe.shape[2] = kRope;
        args.kv.ckv = ckv;
        args.kv.kpe = kpe;
        args.kv.page_size = page;
        args.q_nope = TensorView::contiguous(q_nope.data(), DType::kBF16, {row.batch, heads, kRank},
                                             Device::cuda(0));
        args.q_pe = TensorView::contiguous(q_pe.data(), DType::kBF16, {row.batch, heads, kRope},
                                           Device::cuda(0));
        args.out = TensorView::contiguous(out.data(), DType::kBF16, {row.batch, heads, kRank},
                                          Device::cuda(0));
        args.lse =
            TensorView::contiguous(lse.data(), DType::kF32, {row.batch, heads}, Device::cuda(0));
        args.sm_scale = sm_scale;
        args.causal = true;
        args.stream = stream;
        backend->plan(*workspace, describe_op(args, OpKind::kMlaDecode), args.meta);
        const double ns = median_device_ns([&] { backend->run_mla(*workspace, args); }, 3,
                                           config.reps, true, stream);
        const int64_t bad = count_not_finite(lse.data(), q_rows, stream);
        const double flops = 2.0 * heads * row.kv_len * (kLatent + kRank) * row.batch;
        const double bytes = 2.0 * row.kv_len * kLatent * row.batch;
        const double tflops = flops / ns / 1e3, tbs = bytes / ns / 1e3;
        const double figure = compute_bound ? tflops : tbs;
        const double ratio =
            compute_bound ? tflops / ceilings.matmul_tflops : tbs * 1e3 / ceilings.read_gbs;
        if (page == config.page_sizes[0]) first = figure;
        const double target = issue_target("mla", heads, row);
        fmt::print(
            "{:>4} {:>12} {:>4} {:>10.1f} {:>9.1f} {:>7.2f} {:>8} {:>6.2f} {:>7.2f} {:>7}{}\n",
            heads, row.name(), page, ns / 1e3, tflops, tbs, compute_bound ? "matmul" : "read",
            ratio, figure / first, target > 0 ? fmt::format("{:g}", target) : "-",
            bad > 0 ? fmt::format("  ({} lse not finite!)", bad) : "");
        std::fflush(stdout);
        rows.push_back({{"heads", heads},
                        {"batch", row.batch},
                        {"kv_len", row.kv_len},
                        {"page_size", page},
                        {"median_us", ns / 1e3},
                        {"flops", flops},
                        {"latent_bytes", bytes},
                        {"tflops", tflops},
                        {"latent_tbs", tbs},
                        {"bound", compute_bound ? "matmul" : "read"},
                        {"ratio_to_ceiling", ratio},
                        {"ratio_to_first_page_size", figure / first},
                        {"target", target},
                        {"target_unit", compute_bound ? "TFLOP/s" : "TB/s"},
                        {"lse_not_finite", bad}});
      }
    }
  }
  return rows;
}

nlohmann::json bench_wgmma_rates(void* stream) {
  const std::vector<cuda::mla::WgmmaRate> rates = cuda::mla::probe_wgmma_rates(stream);
  nlohmann::json out = nlohmann::json::array();
  if (rates.empty()) {
    fmt::print(
        "\ntensor-core rates: not measured (needs a compute capability 9.x device and the "
        "binary's sm_90a code)\n");
    return out;
  }
  fmt::print(
      "\ntensor-core rates of the MLA kernels' wgmma sequences on this device: one CTA per SM,\n"
      "  each warpgroup issuing groups of the sequence back to back (fence, wgmmas, commit, "
      "wait);\n  cycles per group (SM clocks, median over the SMs of the slowest warpgroup) "
      "against\n  the FLOPs at 4096 dense bf16 FLOP per SM clock\n"
      "{:<26} {:<44} {:>6} {:>9} {:>9} {:>6}\n",
      "sequence", "as", "wgmma", "cycles", "ideal", "ideal/");
  for (const cuda::mla::WgmmaRate& r : rates) {
    fmt::print("{:<26} {:<44} {:>6} {:>9.0f} {:>9.0f} {:>6.2f}\n", r.name, r.role, r.wgmmas,
               r.cycles, r.ideal_cycles, r.ideal_cycles / r.cycles);
    out.push_back({{"sequence", r.name},
                   {"role", r.role},
                   {"wgmmas", r.wgmmas},
                   {"flops", r.flops},
                   {"cycles", r.cycles},
                   {"ideal_cycles", r.ideal_cycles}});
  }
  std::fflush(stdout);
  return out;
}

nlohmann::json bench_cluster_occupancy() {
  const std::vector<std::pair<int, int>> occupancy = cuda::mla::small_cluster_occupancy();
  nlohmann::json out = nlohmann::json::array();
  if (occupancy.empty()) return out;
  fmt::print("\nclusters of the H <= 16 kernel (one CTA per SM) that run at once on this device:");
  for (const auto& [cluster, clusters] : occupancy) {
    fmt::print(" {} of {} ({} CTAs);", clusters, cluster, clusters * cluster);
    out.push_back({{"cluster", cluster}, {"max_active_clusters", clusters}});
  }
  fmt::print("\n");
  std::fflush(stdout);
  return out;
}

}  // namespace pagedattn::tools
