// Issue 4's prefill rows on the CUDA backend (see bench_cuda_device.h for the method): Llama-3-8B
// shape (32 query heads, 8 KV heads, head_dim 128, bf16, NHD; --qo-heads / --kv-heads / --head-dim
// pick another, which has no target), causal (aligned to the end of the
// KV) unless asked otherwise, K/V and queries generated on the device, pages in random order, L2
// flushed before each sample, median.
//
// Rows: "BxL" = B requests of L new tokens (no cached prefix); "BxQ/L" = Q new tokens over L
// tokens of KV (a cached prefix of L - Q); "raggedB/L" = the ragged batch: B requests, request i
// with kv_len uniform in [L/4, L] and q_len uniform in [L/16, L/4] (capped at kv_len) from a fixed
// seed, so the rows are the same in every run. Extend rows (BxQ/L with Q < L: chunked prefill,
// new tokens over a cached prefix) get a table of their own after the others, and "section":
// "extend" in their JSON ("prefill" for the rest); the defaults add issue 18's extend rows.
// FLOPs count the visible (query, key) pairs only: 2 * pairs * Hq * (D + D), pairs = q * L
// (non-causal) or q * (L - q) + q * (q + 1) / 2 (causal). TFLOP/s is printed beside the cuBLAS
// bf16 matmul rate measured in the same run. With --kv-dtype fp8_e4m3 each (row, P) is also run
// over an fp8 e4m3 cache (values of the same distribution, k_scale = v_scale = 0.5), timed right
// after the bf16 cache on the same metadata: its TFLOP/s and its speed over bf16's in extra
// columns (and fields of the row's JSON, so the tables built from it keep one row per row).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/fill.h"
#include "tools/bench/cuda/bench_cuda_device.h"

namespace pagedattn::tools {
namespace {

constexpr float kFp8Scale = 0.5f;  // the fp8 cache's k_scale and v_scale

// A device buffer of `elements` fp8 e4m3 values, uniform in [-1, 1) / kFp8Scale, made on the
// device.
cuda::DeviceBuffer random_fp8(int64_t elements, uint64_t seed, void* stream) {
  const int64_t n = std::max<int64_t>(elements, 16);
  cuda::DeviceBuffer buffer(static_cast<size_t>(n));
  cuda::fill_uniform_device(
      TensorView::contiguous(buffer.data(), DType::kFP8E4M3, {n}, Device::cuda(0)), seed, -1, 1,
      stream, kFp8Scale);
  return buffer;
}

struct Requests {
  std::vector<int32_t> q_lens, kv_lens;
};

Requests expand(const BatchLen& row) {
  Requests r;
  if (!row.ragged) {
    r.q_lens.assign(row.batch, row.q_len > 0 ? row.q_len : row.kv_len);
    r.kv_lens.assign(row.batch, row.kv_len);
    return r;
  }
  std::mt19937_64 rng(11);
  const int32_t max_len = row.kv_len;
  std::uniform_int_distribution<int32_t> kv(std::max(1, max_len / 4), max_len);
  std::uniform_int_distribution<int32_t> q(std::max(1, max_len / 16), std::max(1, max_len / 4));
  for (int32_t i = 0; i < row.batch; ++i) {
    r.kv_lens.push_back(kv(rng));
    r.q_lens.push_back(std::min(q(rng), r.kv_lens.back()));
  }
  return r;
}

double visible_pairs(const Requests& r, bool causal) {
  double pairs = 0;
  for (size_t i = 0; i < r.q_lens.size(); ++i) {
    const double q = r.q_lens[i], l = r.kv_lens[i];
    pairs += causal ? q * (l - q) + q * (q + 1) / 2 : q * l;
  }
  return pairs;
}

// New tokens over a cached prefix, the same length for every request (a ragged row is not).
bool is_extend(const BatchLen& row) {
  return !row.ragged && row.q_len > 0 && row.q_len < row.kv_len;
}

}  // namespace

PrefillRowsConfig default_prefill_rows() {
  PrefillRowsConfig config;
  // Issue 4's rows with issue 18's 16 x 2048, then issue 18's extend rows: a 512-token chunk over
  // 8k and 32k of prefix, and 8 chunks of 256 (the engine's default 2048-token step budget) over
  // 8k.
  config.rows = parse_batch_lens(
      "1x8192,1x32768,16x2048,ragged16/4096,1x512/8192,1x512/32768,8x256/8192", "--rows");
  config.page_sizes = {16, 1};
  return config;
}

nlohmann::json bench_prefill_rows(const PrefillRowsConfig& config, const CudaCeilings& ceilings,
                                  void* stream) {
  PA_CHECK(!config.page_sizes.empty(), "--page-size: no page sizes");
  for (int32_t p : config.page_sizes) PA_CHECK(p >= 1, "--page-size {}: expected >= 1", p);
  const int32_t qo_heads = config.qo_heads, kv_heads = config.kv_heads, head_dim = config.head_dim;
  // The issue's targets belong to its shape.
  const bool issue_shape = qo_heads == 32 && kv_heads == 8 && head_dim == 128;
  std::vector<Requests> requests;
  int64_t max_tokens = 0, max_rows = 0;
  int32_t max_batch = 1;
  for (const BatchLen& row : config.rows) {
    requests.push_back(expand(row));
    const Requests& r = requests.back();
    int64_t rows = 0;
    for (int32_t q : r.q_lens) rows += q;
    max_rows = std::max(max_rows, rows);
    max_batch = std::max(max_batch, row.batch);
    for (int32_t p : config.page_sizes) {
      int64_t tokens = 0;
      for (int32_t l : r.kv_lens) tokens += int64_t{(l + p - 1) / p} * p;
      max_tokens = std::max(max_tokens, tokens);
    }
  }
  const int64_t token_elems = int64_t{kv_heads} * head_dim;
  cuda::DeviceBuffer k = random_bf16(max_tokens * token_elems, 31, stream);
  cuda::DeviceBuffer v = random_bf16(max_tokens * token_elems, 32, stream);
  cuda::DeviceBuffer q = random_bf16(max_rows * qo_heads * head_dim, 33, stream);
  const int64_t fp8_elems = config.fp8_kv ? max_tokens * token_elems : 0;
  cuda::DeviceBuffer k8 = random_fp8(fp8_elems, 34, stream), v8 = random_fp8(fp8_elems, 35, stream);
  cuda::DeviceBuffer out(max_rows * qo_heads * head_dim * 2), lse(max_rows * qo_heads * 4);
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = max_batch;
  limits.max_qo_rows = std::max<int64_t>(max_rows, 1);
  limits.max_qo_heads = qo_heads;
  limits.max_head_dim = head_dim;
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;

  fmt::print(
      "\nprefill: Hq {} / Hkv {}, head_dim {}, bf16, NHD, {}, pages in random order, L2 flushed, "
      "median of {}\n  FLOPs = 2 * visible (query, key) pairs * {} * ({} + {}); ratio to the "
      "cuBLAS bf16 matmul ({:.0f} TFLOP/s, this run){}\n",
      qo_heads, kv_heads, head_dim, config.causal ? "causal" : "non-causal", config.reps, qo_heads,
      head_dim, head_dim, ceilings.matmul_tflops,
      config.fp8_kv ? "\n  fp8: the same row over an fp8 e4m3 cache (k/v scale 0.5); fp8/bf16 = "
                      "its speed over the bf16 cache's, same run"
                    : "");
  auto print_columns = [&] {
    fmt::print(
        "{:>16} {:>4} {:>8} {:>10} {:>9} {:>8} {:>7} {:>7}{}\n", "rows", "P", "q_rows", "time_us",
        "TFLOP/s", "vs_mm", fmt::format("P/P{}", config.page_sizes[0]), "target",
        config.fp8_kv ? fmt::format(" {:>10} {:>9} {:>8}", "fp8_us", "fp8_TF/s", "fp8/bf16") : "");
  };
  // The rows in two tables: new tokens over an empty cache (and ragged), then extend rows.
  std::vector<size_t> order;
  for (bool extend : {false, true}) {
    for (size_t i = 0; i < config.rows.size(); ++i) {
      if (is_extend(config.rows[i]) == extend) order.push_back(i);
    }
  }
  std::mt19937_64 rng(20261203);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t i = order[n];
    const BatchLen& row = config.rows[i];
    const Requests& r = requests[i];
    const bool extend = is_extend(row);
    if (n == 0 || extend != is_extend(config.rows[order[n - 1]])) {
      if (extend) {
        fmt::print(
            "\nextend (chunked prefill): BxQ/L = B requests of Q new tokens over a cached prefix "
            "of "
            "L - Q, causal aligned to the end of the KV\n");
      }
      print_columns();
    }
    const double flops = 2.0 * visible_pairs(r, config.causal) * qo_heads * (2 * head_dim);
    double first = 0;
    for (int32_t page : config.page_sizes) {
      DeviceStep step = make_device_step(r.q_lens, r.kv_lens, page, rng);
      // Median time of the row over the bf16 cache or the fp8 one; the lse's non-finite count.
      auto time_cache = [&](DType kv_dtype, int64_t& bad) {
        const bool fp8 = kv_dtype == DType::kFP8E4M3;
        PrefillArgs args;
        args.meta = step.meta;
        args.kv.k =
            TensorView::contiguous(fp8 ? k8.data() : k.data(), kv_dtype,
                                   {step.num_pages, page, kv_heads, head_dim}, Device::cuda(0));
        args.kv.v =
            TensorView::contiguous(fp8 ? v8.data() : v.data(), kv_dtype,
                                   {step.num_pages, page, kv_heads, head_dim}, Device::cuda(0));
        args.kv.layout = KvLayout::kNHD;
        args.kv.page_size = page;
        args.kv.k_scale = args.kv.v_scale = fp8 ? kFp8Scale : 1.0f;
        args.q = TensorView::contiguous(q.data(), DType::kBF16, {step.num_rows, qo_heads, head_dim},
                                        Device::cuda(0));
        args.out = TensorView::contiguous(out.data(), DType::kBF16,
                                          {step.num_rows, qo_heads, head_dim}, Device::cuda(0));
        args.lse = TensorView::contiguous(lse.data(), DType::kF32, {step.num_rows, qo_heads},
                                          Device::cuda(0));
        args.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        args.options.causal = config.causal;
        args.stream = stream;
        backend->plan(*workspace, describe_op(args), args.meta);
        const double ns = median_device_ns([&] { backend->run_prefill(*workspace, args); }, 2,
                                           config.reps, true, stream);
        bad += count_not_finite(lse.data(), step.num_rows * qo_heads, stream);
        return ns;
      };
      int64_t bad = 0;
      const double ns = time_cache(DType::kBF16, bad);
      const double ns_fp8 = config.fp8_kv ? time_cache(DType::kFP8E4M3, bad) : 0.0;
      const double tflops = flops / ns / 1e3;
      if (page == config.page_sizes[0]) first = tflops;
      const double target =
          config.causal && issue_shape ? issue_target("prefill", qo_heads, row) : 0.0;
      fmt::print("{:>16} {:>4} {:>8} {:>10.1f} {:>9.1f} {:>8.3f} {:>7.2f} {:>7}{}{}\n", row.name(),
                 page, step.num_rows, ns / 1e3, tflops, tflops / ceilings.matmul_tflops,
                 tflops / first, target > 0 ? fmt::format("{:g}", target) : "-",
                 config.fp8_kv ? fmt::format(" {:>10.1f} {:>9.1f} {:>8.2f}", ns_fp8 / 1e3,
                                             flops / ns_fp8 / 1e3, ns / ns_fp8)
                               : "",
                 bad > 0 ? fmt::format("  ({} lse not finite!)", bad) : "");
      std::fflush(stdout);
      rows.push_back({{"row", row.name()},
                      {"section", extend ? "extend" : "prefill"},
                      {"batch", row.batch},
                      {"q_lens", r.q_lens},
                      {"kv_lens", r.kv_lens},
                      {"page_size", page},
                      {"causal", config.causal},
                      {"median_us", ns / 1e3},
                      {"flops", flops},
                      {"tflops", tflops},
                      {"ratio_to_matmul", tflops / ceilings.matmul_tflops},
                      {"ratio_to_first_page_size", tflops / first},
                      {"target_tflops", target},
                      {"lse_not_finite", bad}});
      if (config.fp8_kv) {  // the same row over the fp8 cache
        rows.back()["fp8_median_us"] = ns_fp8 / 1e3;
        rows.back()["fp8_tflops"] = flops / ns_fp8 / 1e3;
        rows.back()["fp8_speed_over_bf16"] = ns / ns_fp8;
      }
    }
  }
  return rows;
}

}  // namespace pagedattn::tools
