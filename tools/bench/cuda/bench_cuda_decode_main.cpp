// pagedattn_bench_cuda_decode: issue 4's CUDA decode rows, CUDA-graph step timing and host vs GPU
// planner, on device-generated data. A thin main over tools/bench/cuda/bench_cuda_device.h, which
// `pagedattn bench decode --device cuda` and `pagedattn bench plan --device cuda` run too (kept
// as its own binary for scripts/gpu-check and quick runs without the CLI's other commands).
//
// Rows: Llama-3-8B shape (32 query heads, 8 KV heads, head_dim 128, bf16, NHD), B x kv_len from
// --rows, at each of --page-sizes, pages in random order; median of --reps event-timed samples,
// the L2 flushed before each; KV TB/s beside the streaming read / device copy / cuBLAS matmul
// measured in the same run. Then (unless skipped) the CUDA-graph host time per step at batch 1
// and 64, and the planner table (B 1 / 64 / 256 / 1024 x kv_len 1024 / 32768 x P 1 / 16 / 64).
// Prints tables, and JSON with --json.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "tools/bench/cuda/bench_cuda_device.h"

namespace pagedattn::tools {
namespace {

void run(const std::string& rows, const std::vector<int32_t>& page_sizes, int32_t reps, bool graphs,
         const std::string& graph_rows, bool planner, const std::string& json_path) {
  std::vector<GraphRow> steps = default_graph_rows();
  if (!graph_rows.empty()) {
    steps.clear();
    for (const BatchLen& row : parse_batch_lens(graph_rows, "--graph-rows")) {
      PA_CHECK(!row.ragged && row.q_len == 0, "--graph-rows {}: decode steps are BxL", row.name());
      steps.push_back({row.batch, row.kv_len});
    }
  }
  const Support device = cuda::device_available();
  PA_CHECK(device.ok, "no usable CUDA device ({})", device.reason);
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DecodeRowsConfig config = default_decode_rows();
  config.rows = parse_batch_lens(rows, "--rows");
  config.page_sizes = page_sizes;
  config.reps = reps;
  const CudaCeilings ceilings = measure_cuda_ceilings(int64_t{2} << 30, 8192, stream);
  nlohmann::json document = {{"benchmark", "cuda_decode"}, {"ceilings", print_ceilings(ceilings)}};
  document["shape"] = {{"num_qo_heads", 32},
                       {"num_kv_heads", 8},
                       {"head_dim", 128},
                       {"dtype", "bf16"},
                       {"layout", "NHD"}};
  document["reps"] = reps;
  document["rows"] = bench_decode_rows(config, ceilings, stream);
  document["graphs"] = graphs ? bench_decode_graphs(steps, stream) : nlohmann::json::array();
  PlannerBenchConfig plan;
  plan.batches = {1, 64, 256, 1024};
  plan.kv_lens = {1024, 32768};
  document["planner"] = planner ? bench_planner(plan, stream) : nlohmann::json::array();
  if (!json_path.empty()) {
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
  std::string graph_rows;
  std::string json;
  app.add_option("--rows", rows, "B x kv_len, comma separated")->capture_default_str();
  app.add_option("--page-sizes", page_sizes, "Attention page sizes")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--reps", reps, "Timed samples per row (median)")->capture_default_str();
  app.add_flag("--no-graphs", no_graphs, "Skip the CUDA-graph step timing");
  app.add_option("--graph-rows", graph_rows,
                 "CUDA-graph steps B x kv_len, comma separated (default: the issue's four)");
  app.add_flag("--no-planner", no_planner, "Skip the host vs GPU planner timing");
  app.add_option("--json", json, "Write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    pagedattn::tools::run(rows, page_sizes, reps, !no_graphs, graph_rows, !no_planner, json);
  } catch (const pagedattn::Error& error) {
    std::fprintf(stderr, "pagedattn_bench_cuda_decode: %s\n", error.what());
    return 1;
  }
  return 0;
}
