// model_bench_options.h.
#include "tools/bench/throughput/model_bench_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "pagedattn/error.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_random.h"
#include "tools/bench/throughput/run.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {

void add_workload_options(CLI::App* cmd, std::string* workload, WorkloadSelection* selection) {
  cmd->add_option("--workload", *workload,
                  "workload JSON (input_lens, output_lens); default bench/workloads/"
                  "nano-vllm-offline.json");
  cmd->add_option("--requests", selection->requests,
                  "the first N requests of the workload (0: all)")
      ->capture_default_str();
  cmd->add_option("--max-input-len", selection->max_input_len,
                  "cut the workload's prompts to this many tokens (0: no cap)");
  cmd->add_option("--max-output-len", selection->max_output_len,
                  "cut the workload's outputs to this many tokens (0: no cap)");
  cmd->add_option("--seed", selection->seed, "seed of the prompts' token ids and of sampling")
      ->capture_default_str();
  cmd->add_option("--max-token-id", selection->max_token_id,
                  "prompts' token ids in [0, N] (nano-vllm's randint(0, 10000); lower it for a "
                  "model with fewer ids)")
      ->capture_default_str();
}

void add_model_source_options(CLI::App* cmd, std::string* model, std::string* shape) {
  cmd->add_option("--model", *model, "Hugging Face model directory");
  cmd->add_option("--shape", *shape,
                  "a random-weight model of a named shape: " +
                      fmt::format("{}", fmt::join(model::model_shape_names(), ", ")))
      ->excludes("--model");
}

std::unique_ptr<engine::ModelRuntime> open_model_source(const std::string& command,
                                                        const std::string& model,
                                                        const std::string& shape,
                                                        const engine::RuntimeOptions& options,
                                                        std::string* name) {
  if (model.empty() == shape.empty()) {
    throw Error(fmt::format("{}: give --model DIR or --shape NAME (one of {})", command,
                            fmt::join(model::model_shape_names(), ", ")));
  }
  if (!model.empty()) {
    *name = std::filesystem::path(model).filename().string();
    if (name->empty()) *name = model;
    return engine::ModelRuntime::open(model, options);
  }
  *name = shape;
  return engine::ModelRuntime::random(model::model_shape(shape), /*seed=*/0, options);
}

RunCeilings measure_run_ceilings(Device device, double ceiling_time, int64_t ceiling_mib,
                                 const char* when, bool cpu_gemm) {
  RunCeilings c;
  if (device.type == DeviceType::kCUDA) {
    c.gpu = measure_device_ceilings(device);
    fmt::print("{}\n", describe_device_ceilings(c.gpu));
    c.read_gbs = c.gpu.read_gbs;
    c.gemm_gflops = c.gpu.matmul_tflops * 1e3;
    c.gemm_m = c.gemm_n = c.gemm_k = c.gpu.matmul_size;
    c.gemm = "cuBLAS bf16, f32 accumulate";
    c.machine = c.gpu.device_name;
    return c;
  }
  c.cpu_read = measure_cpu_read_ceiling(ceiling_time, ceiling_mib << 20);
  fmt::print("{}\n", describe_ceiling(when, c.cpu_read));
  c.read_gbs = c.cpu_read.median_gbs;
  c.machine = machine_description();
  if (cpu_gemm) {
    const GemmCeiling gemm = measure_gemm_ceiling(ceiling_time);
    fmt::print(
        "GEMM ceiling: {:.1f} GFLOP/s (ops::Linear, f32 weights, {} x {} x {}, median, {} "
        "threads)\n",
        gemm.gflops, gemm.m, gemm.k, gemm.n, ops::num_threads());
    c.gemm_gflops = gemm.gflops;
    c.gemm_m = gemm.m, c.gemm_n = gemm.n, c.gemm_k = gemm.k;
    c.gemm = "ops::Linear f32";
  }
  return c;
}

nlohmann::json parse_metadata(const std::vector<std::string>& items) {
  nlohmann::json metadata = nlohmann::json::object();
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(fmt::format("--metadata {} (expected KEY=VALUE)", item));
    }
    metadata[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return metadata;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace pagedattn::tools
