// pagedattn_bench_cuda_decode: the CUDA decode benchmark of issue 4, on KV generated on the device
// (the large rows hold up to 34 GB of KV, too much for a host-generated case).
//
// Rows: Llama-3-8B shape (32 query heads, 8 KV heads, head_dim 128, bf16, NHD), B x kv_len from
// --rows, each at the page sizes of --page-sizes, pages in random order (a random permutation of
// the pool per row). One K and one V buffer sized for the largest row are filled once; each
// (row, P) views them as [pages, P, 8, 128]. Decode is planned once per row, then run_decode alone
// is timed with CUDA events, the L2 flushed (256 MiB memset) before every sample; median of --reps.
//   KV TB/s = K and V bytes read once / median time; ratios against the streaming read and the
//   device copy measured in the same run (and the cuBLAS bf16 matmul, for reference).
// The GPU planner beside the host planner (--plan): block table -> CSR metadata + split-KV
// partition, B up to 1024, kv_len up to 32k, P 1 / 16 / 64 (allocation pages of 64 tokens).
// Then CUDA graphs: host time per decode step (new block table + lengths copied in, then the
// replay) vs the same work launched eagerly, at batch 1 and 64, 32 layers per step.
// Prints a table, and JSON with --json.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/fill.h"
#include "cuda/workspace.h"
#include "pagedattn/cuda_graph.h"
#include "pagedattn/cuda_planner.h"
#include "pagedattn/planner.h"
#include "tools/bench_cuda_util.h"

namespace pagedattn::tools {
namespace {

constexpr int32_t kQoHeads = 32, kKvHeads = 8, kHeadDim = 128;

struct Row {
  int32_t batch;
  int32_t kv_len;
};

std::vector<Row> parse_rows(const std::string& text) {
  std::vector<Row> rows;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t x = item.find('x');
    PA_CHECK(x != std::string::npos, "--rows: '{}' is not BxL", item);
    rows.push_back({std::stoi(item.substr(0, x)), std::stoi(item.substr(x + 1))});
    start = end + 1;
  }
  return rows;
}

TensorView i32_device(cuda::DeviceBuffer& buffer, const std::vector<int32_t>& host) {
  buffer = cuda::DeviceBuffer(std::max<size_t>(4, host.size() * 4));
  PA_CUDA_CHECK(cudaMemcpy(buffer.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  return TensorView::contiguous(buffer.data(), DType::kI32, {static_cast<int64_t>(host.size())},
                                Device::cuda(0));
}

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

// Host planner vs GPU planner on the same block table (allocation pages of 64 tokens).
nlohmann::json bench_planner(cudaStream_t stream) {
  fmt::print(
      "\nplanner: host plan() + split_kv_partition() vs GPU plan_on_device() + "
      "split_kv_on_device() (device time, events), block table, A 64, median of 10\n"
      "{:>6} {:>8} {:>4} {:>12} {:>12} {:>8}\n",
      "B", "kv_len", "P", "host_us", "gpu_us", "host/gpu");
  nlohmann::json rows = nlohmann::json::array();
  constexpr int32_t kAlloc = 64;
  std::mt19937_64 rng(7);
  for (int32_t batch : {1, 64, 256, 1024}) {
    for (int32_t kv_len : {1024, 32768}) {
      const int32_t blocks = kv_len / kAlloc;
      const int64_t alloc_pages = int64_t{batch} * blocks;
      std::vector<int32_t> table(alloc_pages);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      std::vector<int32_t> lens(batch, kv_len);
      cuda::DeviceBuffer d_table, d_lens;
      const TensorView table_flat = i32_device(d_table, table);
      const TensorView lens_view = i32_device(d_lens, lens);
      for (int32_t page : {1, 16, 64}) {
        const int64_t pages = alloc_pages * (kAlloc / page);
        PlanStorage host(batch, pages);
        PlanInput input;
        input.table = BlockTableInput{table, blocks};
        input.num_reqs = batch;
        input.seq_lens = lens;
        input.alloc_page_size = kAlloc;
        input.page_size = page;
        input.num_alloc_pages = alloc_pages;
        SplitKvConfig split{true, 33, std::max(1, 256 / page)};
        const int64_t capacity = split_kv_capacity(batch, pages, split);
        std::vector<int32_t> work_request(capacity), work_chunk(capacity), merge(batch + 1);
        std::vector<double> host_ns;
        for (int rep = 0; rep < 10; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          plan(input, host.buffers());
          split_kv_partition(std::span<const int32_t>(host.kv_indptr.data(), batch + 1), batch,
                             split, {work_request, work_chunk, merge});
          const auto t1 = std::chrono::steady_clock::now();
          host_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
        }
        std::sort(host_ns.begin(), host_ns.end());
        cuda::DeviceBuffer qo(4 * (batch + 1)), indptr(4 * (batch + 1)), indices(4 * pages),
            last(4 * batch), kv_lens(4 * batch), status(16), request(4 * capacity),
            chunk(4 * capacity), merge_d(4 * (batch + 1)), info(16);
        auto view = [](cuda::DeviceBuffer& b, int64_t n) {
          return TensorView::contiguous(b.data(), DType::kI32, {n}, Device::cuda(0));
        };
        cuda::DevicePlanInput device_input;
        device_input.table = table_flat;
        device_input.table.ndim = 2;
        device_input.table.shape = {batch, blocks};
        device_input.table.strides = {blocks, 1};
        device_input.seq_lens = lens_view;
        device_input.num_reqs = batch;
        device_input.alloc_page_size = kAlloc;
        device_input.page_size = page;
        device_input.num_alloc_pages = alloc_pages;
        const cuda::DevicePlanBuffers buffers{view(qo, batch + 1),  view(indptr, batch + 1),
                                              view(indices, pages), view(last, batch),
                                              view(kv_lens, batch), view(status, 4)};
        const cuda::DeviceSplitKvBuffers split_buffers{view(request, capacity),
                                                       view(chunk, capacity),
                                                       view(merge_d, batch + 1), view(info, 4)};
        const double gpu_ns = median_device_ns(
            [&] {
              cuda::plan_on_device(device_input, buffers, stream);
              cuda::split_kv_on_device(view(indptr, batch + 1), batch, split, split_buffers,
                                       stream);
            },
            2, 10, false, stream);
        cuda::read_plan_status(view(status, 4), stream);
        const double host_us = host_ns[host_ns.size() / 2] / 1e3;
        fmt::print("{:>6} {:>8} {:>4} {:>12.1f} {:>12.1f} {:>8.2f}\n", batch, kv_len, page, host_us,
                   gpu_ns / 1e3, host_us * 1e3 / gpu_ns);
        rows.push_back({{"batch", batch},
                        {"kv_len", kv_len},
                        {"page_size", page},
                        {"host_us", host_us},
                        {"gpu_us", gpu_ns / 1e3}});
      }
    }
  }
  return rows;
}

struct Result {
  Row row;
  int32_t page_size;
  double median_us;
  double kv_bytes;
  double tbs;
};

void run(const std::string& rows_text, const std::vector<int32_t>& page_sizes, int32_t reps,
         bool graphs, bool planner, const std::string& json_path) {
  const Support device = cuda::device_available();
  PA_CHECK(device.ok, "no GPU: {}", device.reason);
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<Row> rows = parse_rows(rows_text);

  const CudaCeilings ceilings = measure_cuda_ceilings(int64_t{2} << 30, 8192, stream);
  fmt::print(
      "device: {} ({} SMs)\nceilings (this run): device copy {:.0f} GB/s (read + write of "
      "{} GiB), streaming read {:.0f} GB/s ({} GiB), cuBLAS bf16 matmul {}^3 {:.0f} "
      "TFLOP/s\n",
      ceilings.device_name, ceilings.num_sms, ceilings.copy_gbs, ceilings.copy_bytes >> 30,
      ceilings.read_gbs, ceilings.read_bytes >> 30, ceilings.matmul_size, ceilings.matmul_tflops);

  int64_t max_tokens = 0;
  for (const Row& row : rows)
    max_tokens = std::max<int64_t>(max_tokens, int64_t{row.batch} * row.kv_len);
  const int64_t token_elems = int64_t{kKvHeads} * kHeadDim;
  cuda::DeviceBuffer k(static_cast<size_t>(max_tokens * token_elems * 2));
  cuda::DeviceBuffer v(static_cast<size_t>(max_tokens * token_elems * 2));
  for (auto* buffer : {&k, &v}) {
    cuda::fill_uniform_device(TensorView::contiguous(buffer->data(), DType::kBF16,
                                                     {max_tokens * token_elems}, Device::cuda(0)),
                              buffer == &k ? 1 : 2, -1, 1, stream);
  }
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = 256;
  for (const Row& row : rows) limits.max_batch = std::max(limits.max_batch, row.batch);
  limits.max_qo_heads = kQoHeads;
  limits.max_head_dim = kHeadDim;
  std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;

  std::mt19937_64 rng(20261202);
  std::vector<Result> results;
  for (const Row& row : rows) {
    const int64_t q_elems = int64_t{row.batch} * kQoHeads * kHeadDim;
    cuda::DeviceBuffer q(q_elems * 2), out(q_elems * 2), lse(int64_t{row.batch} * kQoHeads * 4);
    cuda::fill_uniform_device(
        TensorView::contiguous(q.data(), DType::kBF16, {q_elems}, Device::cuda(0)), 3, -1, 1,
        stream);
    for (int32_t page : page_sizes) {
      const int32_t pages_per_req = (row.kv_len + page - 1) / page;
      const int64_t pages = int64_t{row.batch} * pages_per_req;
      std::vector<int32_t> indices(pages);
      std::iota(indices.begin(), indices.end(), 0);
      std::shuffle(indices.begin(), indices.end(), rng);
      std::vector<int32_t> indptr(row.batch + 1), last(row.batch), qo(row.batch + 1);
      for (int32_t r = 0; r <= row.batch; ++r) {
        indptr[r] = r * pages_per_req;
        qo[r] = r;
      }
      for (int32_t r = 0; r < row.batch; ++r) last[r] = row.kv_len - (pages_per_req - 1) * page;
      cuda::DeviceBuffer d_indices, d_indptr, d_last, d_qo;
      DecodeArgs args;
      args.meta.batch_size = row.batch;
      args.meta.kv_indices = i32_device(d_indices, indices);
      args.meta.kv_indptr = i32_device(d_indptr, indptr);
      args.meta.kv_last_page_len = i32_device(d_last, last);
      args.meta.qo_indptr = i32_device(d_qo, qo);
      args.meta.max_q_len = 1;
      args.kv = cache_view(k.data(), v.data(), pages, page);
      args.q = TensorView::contiguous(q.data(), DType::kBF16, {row.batch, kQoHeads, kHeadDim},
                                      Device::cuda(0));
      args.out = TensorView::contiguous(out.data(), DType::kBF16, {row.batch, kQoHeads, kHeadDim},
                                        Device::cuda(0));
      args.lse =
          TensorView::contiguous(lse.data(), DType::kF32, {row.batch, kQoHeads}, Device::cuda(0));
      args.options.sm_scale = 0.08838835f;
      args.stream = stream;
      backend->plan(*workspace, describe_op(args), args.meta);
      const double ns =
          median_device_ns([&] { backend->run_decode(*workspace, args); }, 3, reps, true, stream);
      const double bytes = 2.0 * row.batch * row.kv_len * token_elems * 2;
      results.push_back({row, page, ns / 1e3, bytes, bytes / ns / 1e3});
      fmt::print(stderr, "  {}x{} P={}: {:.1f} us, {:.2f} TB/s\n", row.batch, row.kv_len, page,
                 ns / 1e3, bytes / ns / 1e3);
    }
  }

  fmt::print(
      "\ndecode, Hq 32 / Hkv 8, head_dim 128, bf16, NHD, shuffled pages, L2 flushed, median "
      "of {}\n",
      reps);
  fmt::print("{:>12} {:>4} {:>10} {:>9} {:>8} {:>10} {:>10}\n", "B x kv_len", "P", "time_us",
             "KV_GB", "TB/s", "vs_read", "vs_copy");
  for (const Result& r : results) {
    fmt::print("{:>12} {:>4} {:>10.1f} {:>9.3f} {:>8.2f} {:>10.2f} {:>10.2f}\n",
               fmt::format("{}x{}", r.row.batch, r.row.kv_len), r.page_size, r.median_us,
               r.kv_bytes / 1e9, r.tbs, r.tbs * 1e3 / ceilings.read_gbs,
               r.tbs * 1e3 / ceilings.copy_gbs);
  }

  nlohmann::json graph_json = nlohmann::json::array();
  if (graphs) {
    fmt::print(
        "\nCUDA graphs: host time per decode step (tables copied in + launch), 32 layers, "
        "kv_len 1024, P 16, mean of 200 steps\n{:>6} {:>14} {:>14} {:>14} {:>14}\n",
        "batch", "graph_host_us", "eager_host_us", "graph_gpu_us", "eager_gpu_us");
    for (int32_t batch : {1, 64}) {
      constexpr int32_t kLen = 1024, kPage = 16, kLayers = 32;
      const int32_t blocks = kLen / kPage;
      cuda::DecodeGraphConfig config;
      config.kv = cache_view(k.data(), v.data(), max_tokens / kPage, kPage);
      config.num_qo_heads = kQoHeads;
      config.options.sm_scale = 0.08838835f;
      config.batch_sizes = {batch};
      config.max_blocks_per_request = blocks;
      config.num_layers = kLayers;
      cuda::DecodeGraphRunner runner(config, stream);
      std::vector<int32_t> table(int64_t{batch} * blocks), lens(batch, kLen);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      double host_us[2] = {0, 0}, gpu_us[2] = {0, 0};
      for (int mode = 0; mode < 2; ++mode) {
        const bool use_graph = mode == 0;
        for (int i = 0; i < 5; ++i) runner.step(table, lens, use_graph);
        PA_CUDA_CHECK(cudaStreamSynchronize(stream));
        constexpr int kSteps = 200;
        double host = 0;
        const auto wall0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kSteps; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          runner.step(table, lens, use_graph);
          const auto t1 = std::chrono::steady_clock::now();
          host += std::chrono::duration<double, std::micro>(t1 - t0).count();
          PA_CUDA_CHECK(cudaStreamSynchronize(stream));
        }
        const auto wall1 = std::chrono::steady_clock::now();
        host_us[mode] = host / kSteps;
        gpu_us[mode] = std::chrono::duration<double, std::micro>(wall1 - wall0).count() / kSteps;
      }
      runner.check_last_step();
      fmt::print("{:>6} {:>14.1f} {:>14.1f} {:>14.1f} {:>14.1f}\n", batch, host_us[0], host_us[1],
                 gpu_us[0], gpu_us[1]);
      graph_json.push_back({{"batch", batch},
                            {"layers", kLayers},
                            {"kv_len", kLen},
                            {"graph_host_us_per_step", host_us[0]},
                            {"eager_host_us_per_step", host_us[1]},
                            {"graph_step_wall_us", gpu_us[0]},
                            {"eager_step_wall_us", gpu_us[1]}});
    }
  }

  const nlohmann::json planner_json = planner ? bench_planner(stream) : nlohmann::json::array();

  if (!json_path.empty()) {
    nlohmann::json rows_json = nlohmann::json::array();
    for (const Result& r : results) {
      rows_json.push_back({{"batch", r.row.batch},
                           {"kv_len", r.row.kv_len},
                           {"page_size", r.page_size},
                           {"median_us", r.median_us},
                           {"kv_bytes", r.kv_bytes},
                           {"kv_tbs", r.tbs},
                           {"ratio_to_read", r.tbs * 1e3 / ceilings.read_gbs},
                           {"ratio_to_copy", r.tbs * 1e3 / ceilings.copy_gbs}});
    }
    const nlohmann::json document = {{"benchmark", "cuda_decode"},
                                     {"device", ceilings.device_name},
                                     {"shape",
                                      {{"num_qo_heads", kQoHeads},
                                       {"num_kv_heads", kKvHeads},
                                       {"head_dim", kHeadDim},
                                       {"dtype", "bf16"},
                                       {"layout", "NHD"}}},
                                     {"reps", reps},
                                     {"ceilings",
                                      {{"copy_gbs", ceilings.copy_gbs},
                                       {"read_gbs", ceilings.read_gbs},
                                       {"matmul_bf16_tflops", ceilings.matmul_tflops},
                                       {"matmul_size", ceilings.matmul_size}}},
                                     {"rows", rows_json},
                                     {"graphs", graph_json},
                                     {"planner", planner_json}};
    std::ofstream out(json_path);
    PA_CHECK(out.good(), "--json {}: cannot open for writing", json_path);
    out << document.dump(2) << "\n";
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace pagedattn::tools

int main(int argc, char** argv) {
  CLI::App app{"pagedattn_bench_cuda_decode: CUDA paged decode on the issue's rows"};
  std::string rows = "1x8192,1x32768,16x8192,64x1024,64x8192,256x32768";
  std::vector<int32_t> page_sizes = {16, 1};
  int32_t reps = 20;
  bool no_graphs = false;
  bool no_planner = false;
  std::string json;
  app.add_option("--rows", rows, "B x kv_len, comma separated")->capture_default_str();
  app.add_option("--page-sizes", page_sizes, "Attention page sizes")->capture_default_str();
  app.add_option("--reps", reps, "Timed samples per row (median)")->capture_default_str();
  app.add_flag("--no-graphs", no_graphs, "Skip the CUDA-graph step timing");
  app.add_flag("--no-planner", no_planner, "Skip the host vs GPU planner timing");
  app.add_option("--json", json, "Write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    pagedattn::tools::run(rows, page_sizes, reps, !no_graphs, !no_planner, json);
  } catch (const pagedattn::Error& error) {
    std::fprintf(stderr, "pagedattn_bench_cuda_decode: %s\n", error.what());
    return 1;
  }
  return 0;
}
