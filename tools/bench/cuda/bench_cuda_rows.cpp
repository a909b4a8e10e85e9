// `pagedattn bench decode|prefill|mla|plan --device cuda` (the hook of bench_cuda_rows.h, CUDA
// builds only): checks for a usable device, measures the ceilings once (device copy, streaming
// read, cuBLAS bf16 matmul 8192^3, as each table needs), runs the rows of bench_cuda_device.h
// with the command line's choices or the issues' defaults, prints the tables and writes one JSON
// document (ceilings + rows) when asked.
#include "tools/bench/bench_cuda_rows.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "tools/bench/cuda/bench_cuda_device.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

// Owns the benchmark's stream (destroyed on every exit path, errors included).
struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream); }
};

const char* bench_name(CudaBench bench) {
  switch (bench) {
    case CudaBench::kDecode:
      return "cuda_decode";
    case CudaBench::kPrefill:
      return "cuda_prefill";
    case CudaBench::kMla:
      return "cuda_mla";
    case CudaBench::kPlan:
      return "cuda_plan";
  }
  return "cuda";
}

}  // namespace

CudaRowsStatus run_cuda_rows(const CudaRowsOptions& o) {
  if (const Support device = cuda::device_available(); !device) {
    std::string_view reason = device.reason;
    if (reason.starts_with("no CUDA device: ")) reason.remove_prefix(16);
    return {false, fmt::format("no usable CUDA device: {}", reason)};
  }
  PA_CHECK(o.reps >= 0, "--reps {}: expected >= 1", o.reps);
  set_l2_flush(parse_l2_flush(o.l2_flush));
  Stream s;
  void* stream = s.stream;
  nlohmann::json document = {{"benchmark", bench_name(o.bench)},
                             {"date", utc_timestamp()},
                             {"l2_flush", l2_flush_name(l2_flush())}};
  auto ceilings_for = [&](int64_t bytes, int32_t matmul) {
    fmt::print(stderr, "measuring the ceilings...\n");
    const CudaCeilings ceilings = measure_cuda_ceilings(bytes, matmul, stream);
    document["ceilings"] = print_ceilings(ceilings);
    fmt::print("L2 flush before each timed sample: {}\n", l2_flush_name(l2_flush()));
    return ceilings;
  };
  switch (o.bench) {
    case CudaBench::kDecode: {
      DecodeRowsConfig config = default_decode_rows();
      if (!o.rows.empty()) config.rows = o.rows;
      if (!o.page_sizes.empty()) config.page_sizes = o.page_sizes;
      if (o.reps > 0) config.reps = o.reps;
      const CudaCeilings ceilings = ceilings_for(int64_t{2} << 30, 8192);
      document["shape"] = {{"num_qo_heads", 32},
                           {"num_kv_heads", 8},
                           {"head_dim", 128},
                           {"dtype", "bf16"},
                           {"layout", "NHD"}};
      document["reps"] = config.reps;
      document["rows"] = bench_decode_rows(config, ceilings, stream);
      document["graphs"] =
          o.graphs ? bench_decode_graphs(default_graph_rows(), stream) : nlohmann::json::array();
      break;
    }
    case CudaBench::kPrefill: {
      PrefillRowsConfig config = default_prefill_rows();
      if (!o.rows.empty()) config.rows = o.rows;
      if (!o.page_sizes.empty()) config.page_sizes = o.page_sizes;
      if (o.reps > 0) config.reps = o.reps;
      config.causal = o.causal;
      config.fp8_kv = o.fp8_kv;
      if (o.qo_heads > 0) config.qo_heads = o.qo_heads;
      if (o.kv_heads > 0) config.kv_heads = o.kv_heads;
      if (o.head_dim > 0) config.head_dim = o.head_dim;
      const CudaCeilings ceilings = ceilings_for(int64_t{1} << 30, 8192);
      document["shape"] = {{"num_qo_heads", config.qo_heads},
                           {"num_kv_heads", config.kv_heads},
                           {"head_dim", config.head_dim},
                           {"dtype", "bf16"},
                           {"kv_dtypes", config.fp8_kv ? nlohmann::json::array({"bf16", "fp8_e4m3"})
                                                       : nlohmann::json::array({"bf16"})},
                           {"layout", "NHD"},
                           {"causal", config.causal}};
      document["reps"] = config.reps;
      document["rows"] = bench_prefill_rows(config, ceilings, stream);
      break;
    }
    case CudaBench::kMla: {
      MlaRowsConfig config;
      config.heads = o.heads.empty() ? std::vector<int32_t>{128, 16} : o.heads;
      config.rows = o.rows;
      config.page_sizes = o.page_sizes.empty() ? std::vector<int32_t>{64, 1} : o.page_sizes;
      if (o.reps > 0) config.reps = o.reps;
      const CudaCeilings ceilings = ceilings_for(int64_t{2} << 30, 8192);
      document["shape"] = {{"kv_lora_rank", 512},
                           {"rope_dim", 64},
                           {"q_len", 1},
                           {"dtype", "bf16"},
                           {"cache", "one [pages, P, 576] buffer"}};
      document["flop_count"] = "2 * H * kv_len * (576 + 512) per query token";
      document["byte_count"] = "kv_len * 576 * 2 per request";
      document["reps"] = config.reps;
      document["rows"] = bench_mla_rows(config, ceilings, stream);
      document["wgmma_rates"] = bench_wgmma_rates(stream);
      document["cluster_occupancy"] = bench_cluster_occupancy();
      break;
    }
    case CudaBench::kPlan: {
      PlannerBenchConfig config;
      if (!o.batches.empty()) config.batches = o.batches;
      if (!o.kv_lens.empty()) config.kv_lens = o.kv_lens;
      if (!o.page_sizes.empty()) config.page_sizes = o.page_sizes;
      if (!o.forms.empty()) config.forms = o.forms;
      config.alloc_page_size = o.alloc_page_size;
      if (o.reps > 0) config.reps = o.reps;
      const CudaCeilings ceilings = ceilings_for(int64_t{256} << 20, 0);
      document["reps"] = config.reps;
      document["rows"] = bench_planner(config, stream);
      break;
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    PA_CHECK(out.good(), "--json {}: cannot open for writing", o.json_path);
    out << document.dump(2) << "\n";
  }
  return {true, ""};
}

}  // namespace pagedattn::tools
