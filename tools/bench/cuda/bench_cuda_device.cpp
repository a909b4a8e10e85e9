// The CUDA benchmarks on device-generated data (see bench_cuda_device.h): the shared helpers, the
// issue-4 decode rows and the CUDA-graph step timing. Prefill, MLA and the planner comparison are
// in bench_cuda_prefill.cpp, bench_cuda_mla.cpp and bench_cuda_plan.cpp.
//
// Decode rows: one K and one V buffer sized for the largest (row, P) are filled once; each
// (row, P) views them as [pages, P, 8, 128] (NHD, allocation page = attention page). Figures:
//   KV TB/s = K and V bytes read once (2 * B * kv_len * 8 * 128 * 2) / median time, beside the
//   streaming read and the device copy measured in the same run; P1/P16 = P 1's TB/s over the
//   first page size's (the issue asks >= 0.95).
#include "tools/bench/cuda/bench_cuda_device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "pagedattn/cuda_graph.h"
#include "tools/bench/decode_trace_summary.h"

namespace pagedattn::tools {
namespace {

constexpr int32_t kQoHeads = 32, kKvHeads = 8, kHeadDim = 128;

// The cache over the first pages * P tokens of the K/V buffers, as [pages, P, 8, 128].
PagedKv cache_view(void* k, void* v, int64_t pages, int32_t page_size) {
  PagedKv kv;
  kv.k = TensorView::contiguous(k, DType::kBF16, {pages, page_size, kKvHeads, kHeadDim},
                                Device::cuda(0));
  kv.v = TensorView::contiguous(v, DType::kBF16, {pages, page_size, kKvHeads, kHeadDim},
                                Device::cuda(0));
  kv.layout = KvLayout::kNHD;
  kv.page_size = page_size;
  return kv;
}

// The floor of a CUDA-graph decode step of `layers` layers: the same host-to-device copy of
// `table_bytes` and one graph of 1 + layers dependent kernels (the planner's and one a layer) that
// each only wait on their predecessor and make one global round trip (cuda::dependent_link, one
// CTA an SM), launched, copied and synchronised as DecodeGraphRunner::step is; wall us per step,
// mean of `steps`. What is left of a step above it is the attention kernels' own critical path.
double graph_step_floor_us(int32_t layers, int64_t table_bytes, int steps, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  int device = 0, sms = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto bytes = static_cast<size_t>(table_bytes);
  cuda::DeviceBuffer words(static_cast<size_t>(sms) * 4), tables(bytes);
  PA_CUDA_CHECK(cudaMemsetAsync(words.data(), 0, static_cast<size_t>(sms) * 4, s));
  void* pinned = nullptr;
  PA_CUDA_CHECK(cudaMallocHost(&pinned, bytes));
  const std::unique_ptr<void, cudaError_t (*)(void*)> staging(pinned, cudaFreeHost);
  std::memset(staging.get(), 0, bytes);
  auto* w = static_cast<uint32_t*>(words.data());
  auto enqueue = [&] {
    for (int i = 0; i <= layers; ++i) cuda::dependent_link(sms, w, stream);
  };
  enqueue();  // the kernel loaded before the capture
  PA_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  PA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue();
  PA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t instantiated = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&instantiated, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is all that is launched
  PA_CUDA_CHECK(status);
  const std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> exec(
      instantiated, cudaGraphExecDestroy);
  auto step = [&] {
    PA_CUDA_CHECK(cudaMemcpyAsync(tables.data(), staging.get(), bytes, cudaMemcpyHostToDevice, s));
    PA_CUDA_CHECK(cudaGraphLaunch(exec.get(), s));
    PA_CUDA_CHECK(cudaStreamSynchronize(s));
  };
  for (int i = 0; i < 5; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / steps;
}

}  // namespace

DeviceI32::DeviceI32(const std::vector<int32_t>& host)
    : buffer(std::max<size_t>(4, host.size() * sizeof(int32_t))) {
  PA_CUDA_CHECK(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
  view = TensorView::contiguous(buffer.data(), DType::kI32, {static_cast<int64_t>(host.size())},
                                Device::cuda(0));
}

DeviceStep make_device_step(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                            int32_t page_size, std::mt19937_64& rng) {
  const auto batch = static_cast<int32_t>(kv_lens.size());
  std::vector<int32_t> qo(batch + 1, 0), indptr(batch + 1, 0), last(batch, 0);
  int32_t max_q = 0;
  for (int32_t r = 0; r < batch; ++r) {
    const int32_t pages = (kv_lens[r] + page_size - 1) / page_size;
    indptr[r + 1] = indptr[r] + pages;
    qo[r + 1] = qo[r] + q_lens[r];
    max_q = std::max(max_q, q_lens[r]);
    last[r] = pages == 0 ? 0 : kv_lens[r] - (pages - 1) * page_size;
  }
  std::vector<int32_t> indices(indptr[batch]);
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), rng);
  DeviceStep step;
  step.qo_indptr = DeviceI32(qo);
  step.kv_indptr = DeviceI32(indptr);
  step.kv_indices = DeviceI32(indices);
  step.kv_last_page_len = DeviceI32(last);
  step.meta.batch_size = batch;
  step.meta.qo_indptr = step.qo_indptr.view;
  step.meta.kv_indptr = step.kv_indptr.view;
  step.meta.kv_indices = step.kv_indices.view;
  step.meta.kv_last_page_len = step.kv_last_page_len.view;
  step.meta.max_q_len = max_q;
  step.meta.num_pages_hint = indptr[batch];
  step.num_pages = indptr[batch];
  step.num_rows = qo[batch];
  return step;
}

cuda::DeviceBuffer random_bf16(int64_t elements, uint64_t seed, void* stream) {
  cuda::DeviceBuffer buffer(static_cast<size_t>(std::max<int64_t>(elements, 8)) * 2);
  cuda::fill_uniform_device(
      TensorView::contiguous(buffer.data(), DType::kBF16, {std::max<int64_t>(elements, 8)},
                             Device::cuda(0)),
      seed, -1, 1, stream);
  return buffer;
}

int64_t count_not_finite(const void* device_f32, int64_t count, void* stream) {
  std::vector<float> host(static_cast<size_t>(count));
  PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  PA_CUDA_CHECK(
      cudaMemcpy(host.data(), device_f32, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return std::count_if(host.begin(), host.end(), [](float x) { return !std::isfinite(x); });
}

nlohmann::json print_ceilings(const CudaCeilings& c) {
  fmt::print(
      "device: {} ({} SMs)\nceilings (this run): device copy {:.0f} GB/s (read + write of {} "
      "GiB), streaming read {:.0f} GB/s ({} GiB)",
      c.device_name, c.num_sms, c.copy_gbs, c.copy_bytes >> 30, c.read_gbs, c.read_bytes >> 30);
  if (c.matmul_size > 0) {
    fmt::print(", cuBLAS bf16 matmul {}^3 {:.0f} TFLOP/s", c.matmul_size, c.matmul_tflops);
  }
  fmt::print("\n");
  return {{"device", c.device_name},
          {"num_sms", c.num_sms},
          {"copy_gbs", c.copy_gbs},
          {"copy_bytes", c.copy_bytes},
          {"read_gbs", c.read_gbs},
          {"read_bytes", c.read_bytes},
          {"matmul_bf16_tflops", c.matmul_tflops},
          {"matmul_size", c.matmul_size}};
}

double issue_target(std::string_view bench, int32_t heads, const BatchLen& row) {
  struct Anchor {
    int32_t batch, kv_len;
    double target;
  };
  auto find = [&](std::initializer_list<Anchor> anchors) {
    for (const Anchor& a : anchors) {
      if (a.batch == row.batch && a.kv_len == row.kv_len) return a.target;
    }
    return 0.0;
  };
  if (row.ragged) return 0;
  // Issue 18's targets, as bench/targets.json holds them (the tables' source).
  if (bench == "decode" && heads == kQoHeads) {  // TB/s of KV
    return find({{1, 8192, 2.2},
                 {1, 32768, 3.3},
                 {16, 8192, 4.2},
                 {64, 1024, 3.8},
                 {64, 8192, 4.4},
                 {256, 32768, 4.45}});
  }
  if (bench == "mla" && heads == 128) {  // TFLOP/s
    return find({{64, 4096, 650}, {64, 8192, 650}, {128, 4096, 650}, {128, 8192, 650}});
  }
  if (bench == "mla" && heads == 16) {  // TB/s of latent
    return find({{16, 1024, 1.25}, {16, 4096, 2.6}, {128, 4096, 4.2}, {64, 16384, 4.3}});
  }
  if (bench == "prefill" && heads == kQoHeads && (row.q_len == 0 || row.q_len == row.kv_len)) {
    return find({{1, 8192, 620}, {1, 32768, 630}, {16, 2048, 580}});  // TFLOP/s
  }
  return 0;
}

DecodeRowsConfig default_decode_rows() {
  DecodeRowsConfig config;
  config.rows = parse_batch_lens("1x8192,1x32768,16x8192,64x1024,64x8192,256x32768", "--rows");
  config.page_sizes = {16, 1};
  return config;
}

nlohmann::json bench_decode_rows(const DecodeRowsConfig& config, const CudaCeilings& ceilings,
                                 void* stream) {
  PA_CHECK(!config.page_sizes.empty(), "--page-size: no page sizes");
  for (int32_t p : config.page_sizes) PA_CHECK(p >= 1, "--page-size {}: expected >= 1", p);
  int64_t max_tokens = 0;
  for (const BatchLen& row : config.rows) {
    PA_CHECK(!row.ragged && row.q_len == 0, "--rows {}: decode rows are BxL", row.name());
    for (int32_t p : config.page_sizes) {
      max_tokens =
          std::max<int64_t>(max_tokens, int64_t{row.batch} * ((row.kv_len + p - 1) / p) * p);
    }
  }
  const int64_t token_elems = int64_t{kKvHeads} * kHeadDim;
  fmt::print(stderr, "decode: filling {:.1f} GB of K and V on the device\n",
             2.0 * max_tokens * token_elems * 2 / 1e9);
  cuda::DeviceBuffer k = random_bf16(max_tokens * token_elems, 1, stream);
  cuda::DeviceBuffer v = random_bf16(max_tokens * token_elems, 2, stream);
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = 256;
  for (const BatchLen& row : config.rows) limits.max_batch = std::max(limits.max_batch, row.batch);
  limits.max_qo_heads = kQoHeads;
  limits.max_head_dim = kHeadDim;
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;

  std::mt19937_64 rng(20261202);
  fmt::print(
      "\ndecode: Hq 32 / Hkv 8, head_dim 128, bf16, NHD, pages in random order, L2 flushed, "
      "median of {}; KV TB/s = K+V bytes / time\n{:>12} {:>4} {:>10} {:>8} {:>7} {:>8} {:>8} "
      "{:>7} {:>7}\n",
      config.reps, "B x kv_len", "P", "time_us", "KV_GB", "TB/s", "vs_read", "vs_copy",
      fmt::format("P/P{}", config.page_sizes[0]), "target");
  nlohmann::json rows = nlohmann::json::array();
  for (const BatchLen& row : config.rows) {
    const int64_t q_elems = int64_t{row.batch} * kQoHeads * kHeadDim;
    cuda::DeviceBuffer q = random_bf16(q_elems, 3, stream);
    cuda::DeviceBuffer out(q_elems * 2), lse(int64_t{row.batch} * kQoHeads * 4);
    double first_tbs = 0;
    for (int32_t page : config.page_sizes) {
      DeviceStep step = make_device_step(std::vector<int32_t>(row.batch, 1),
                                         std::vector<int32_t>(row.batch, row.kv_len), page, rng);
      DecodeArgs args;
      args.meta = step.meta;
      args.kv = cache_view(k.data(), v.data(), step.num_pages, page);
      args.q = TensorView::contiguous(q.data(), DType::kBF16, {row.batch, kQoHeads, kHeadDim},
                                      Device::cuda(0));
      args.out = TensorView::contiguous(out.data(), DType::kBF16, {row.batch, kQoHeads, kHeadDim},
                                        Device::cuda(0));
      args.lse =
          TensorView::contiguous(lse.data(), DType::kF32, {row.batch, kQoHeads}, Device::cuda(0));
      args.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      args.stream = stream;
      backend->plan(*workspace, describe_op(args), args.meta);
      const double ns = median_device_ns([&] { backend->run_decode(*workspace, args); }, 3,
                                         config.reps, true, stream);
      const int64_t bad = count_not_finite(lse.data(), int64_t{row.batch} * kQoHeads, stream);
      const double bytes = 2.0 * row.batch * row.kv_len * token_elems * 2;
      const double tbs = bytes / ns / 1e3;
      if (page == config.page_sizes[0]) first_tbs = tbs;
      const double target = issue_target("decode", kQoHeads, row);
      fmt::print("{:>12} {:>4} {:>10.1f} {:>8.3f} {:>7.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>7}{}\n",
                 row.name(), page, ns / 1e3, bytes / 1e9, tbs, tbs * 1e3 / ceilings.read_gbs,
                 tbs * 1e3 / ceilings.copy_gbs, tbs / first_tbs,
                 target > 0 ? fmt::format("{:.2f}", target) : "-",
                 bad > 0 ? fmt::format("  ({} lse not finite!)", bad) : "");
      std::fflush(stdout);
      rows.push_back({{"batch", row.batch},
                      {"kv_len", row.kv_len},
                      {"page_size", page},
                      {"median_us", ns / 1e3},
                      {"kv_bytes", bytes},
                      {"kv_tbs", tbs},
                      {"ratio_to_read", tbs * 1e3 / ceilings.read_gbs},
                      {"ratio_to_copy", tbs * 1e3 / ceilings.copy_gbs},
                      {"ratio_to_first_page_size", tbs / first_tbs},
                      {"target_tbs", target},
                      {"lse_not_finite", bad}});
    }
  }
  return rows;
}

std::vector<GraphRow> default_graph_rows() { return {{1, 1024}, {1, 4096}, {8, 1024}, {64, 1024}}; }

nlohmann::json bench_decode_graphs(const std::vector<GraphRow>& graph_rows, void* stream) {
  constexpr int32_t kPage = 16, kLayers = 32, kSteps = 200;
  int64_t tokens = 0;
  for (const GraphRow& row : graph_rows) {
    tokens = std::max<int64_t>(tokens, int64_t{row.batch} * row.kv_len);
  }
  tokens = (tokens + kPage - 1) / kPage * kPage;
  // A cache per layer, as in a model: each layer's K / V come from memory, not from the L2 the
  // layer before filled (one shared cache fits the L2 at B 1 and 8 x 1024).
  const int64_t layer_elements = tokens * kKvHeads * kHeadDim;
  cuda::DeviceBuffer k = random_bf16(kLayers * layer_elements, 4, stream);
  cuda::DeviceBuffer v = random_bf16(kLayers * layer_elements, 5, stream);
  std::mt19937_64 rng(7);
  fmt::print(
      "\nCUDA graphs: time per decode step (tables copied in + launch), {} layers (a KV cache "
      "each), P {}, mean of {} steps; floor: the same copy and a graph of {} kernels that only "
      "wait on their predecessor and make one global round trip each\n{:>12} {:>14} {:>14} "
      "{:>14} {:>14} {:>14} {:>12}\n",
      kLayers, kPage, kSteps, kLayers + 1, "B x kv_len", "graph_host_us", "eager_host_us",
      "graph_wall_us", "eager_wall_us", "floor_wall_us", "graph/floor");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::pair<std::string, DecodeTraceSummary>> traces;
  for (const GraphRow& row : graph_rows) {
    const int32_t batch = row.batch, blocks = (row.kv_len + kPage - 1) / kPage;
    cuda::DecodeGraphConfig graph;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      graph.layer_kv.push_back(cache_view(k.as<uint16_t>() + layer * layer_elements,
                                          v.as<uint16_t>() + layer * layer_elements, tokens / kPage,
                                          kPage));
    }
    graph.kv = graph.layer_kv.front();  // the shape every layer's cache has
    graph.num_qo_heads = kQoHeads;
    graph.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    graph.batch_sizes = {batch};
    graph.max_blocks_per_request = blocks;
    graph.num_layers = kLayers;
    cuda::DecodeGraphRunner runner(graph, stream);
    std::vector<int32_t> table(int64_t{batch} * blocks), lens(batch, row.kv_len);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    double host_us[2] = {0, 0}, wall_us[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      const bool use_graph = mode == 0;
      for (int i = 0; i < 5; ++i) runner.step(table, lens, use_graph);
      PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
      double host = 0;
      const auto wall0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        runner.step(table, lens, use_graph);
        const auto t1 = std::chrono::steady_clock::now();
        host += std::chrono::duration<double, std::micro>(t1 - t0).count();
        PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
      }
      const auto wall1 = std::chrono::steady_clock::now();
      host_us[mode] = host / kSteps;
      wall_us[mode] = std::chrono::duration<double, std::micro>(wall1 - wall0).count() / kSteps;
    }
    runner.check_last_step();
    // The table and the lengths, as the runner copies them (int32 each).
    const int64_t table_bytes = (int64_t{batch} * blocks + batch) * 4;
    const double floor_us = graph_step_floor_us(kLayers, table_bytes, kSteps, stream);
    fmt::print("{:>12} {:>14.1f} {:>14.1f} {:>14.1f} {:>14.1f} {:>14.1f} {:>12.2f}\n",
               fmt::format("{}x{}", batch, row.kv_len), host_us[0], host_us[1], wall_us[0],
               wall_us[1], floor_us, wall_us[0] / floor_us);
    std::fflush(stdout);
    // The same step once more with the decode kernel's phase stamps (DecodeTrace): the last of
    // 20 graph steps, tabled after the rows.
    graph.trace = true;
    cuda::DecodeGraphRunner traced(graph, stream);
    for (int i = 0; i < 20; ++i) traced.step(table, lens, true);
    traced.check_last_step();
    traces.emplace_back(fmt::format("{}x{}", batch, row.kv_len),
                        summarize_decode_trace(traced.trace()));
    const DecodeTraceSummary& summary = traces.back().second;
    nlohmann::json phases = nlohmann::json::array();
    for (const DecodePhaseRow& phase : summary.phases) {
      phases.push_back({{"phase", phase.phase},
                        {"first_us", phase.first_us},
                        {"median_us", phase.median_us},
                        {"last_us", phase.last_us},
                        {"ctas", phase.ctas}});
    }
    rows.push_back({{"batch", batch},
                    {"layers", kLayers},
                    {"kv_len", row.kv_len},
                    {"page_size", kPage},
                    {"graph_host_us_per_step", host_us[0]},
                    {"eager_host_us_per_step", host_us[1]},
                    {"graph_step_wall_us", wall_us[0]},
                    {"eager_step_wall_us", wall_us[1]},
                    {"graph_floor_wall_us", floor_us},
                    {"traced_layer_us", summary.layer_us},
                    {"traced_working_ctas", summary.working_ctas},
                    {"traced_sm_clock_ghz", summary.sm_clock_ghz},
                    {"traced_phases", phases}});
  }
  for (const auto& [name, summary] : traces) {
    fmt::print(
        "\nDecode kernel phases, graph step {} (tensor-core kernel, thread 0 of each CTA; us after "
        "the previous layer's last CTA ended, medians over layers 2 .. {}): {} CTAs with work, {} "
        "without; a layer every {:.2f} us; SM clock {:.2f} GHz\n{:>10} {:>10} {:>10} {:>10} "
        "{:>6}\n",
        name, kLayers, summary.working_ctas, summary.idle_ctas, summary.layer_us,
        summary.sm_clock_ghz, "phase", "first CTA", "median", "last CTA", "CTAs");
    for (const DecodePhaseRow& phase : summary.phases) {
      fmt::print("{:>10} {:>10.2f} {:>10.2f} {:>10.2f} {:>6}\n", phase.phase, phase.first_us,
                 phase.median_us, phase.last_us, phase.ctas);
    }
  }
  std::fflush(stdout);
  return rows;
}

}  // namespace pagedattn::tools
