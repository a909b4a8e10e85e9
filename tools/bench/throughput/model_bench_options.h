// What `bench throughput` and `bench model` share: the model they run (a checkpoint, or a
// random-weight model of a named shape), the roofline's ceilings on the device it runs on, the KV
// dtype flag, the KEY=VALUE metadata recorded in their JSON, and the median of their samples.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/engine_runtime.h"
#include "tools/bench/cpu_ceiling.h"
#include "tools/bench/throughput/device_ceilings.h"
#include "tools/bench/throughput/workload.h"
#include "tools/cli/kv_dtype.h"

namespace pagedattn::tools {

// --model DIR and --shape NAME (exclusive) on `cmd`.
void add_model_source_options(CLI::App* cmd, std::string* model, std::string* shape);
// --workload FILE and the selection of its requests (--requests, --max-input-len,
// --max-output-len, --seed), shared by bench throughput and bench engine-host.
void add_workload_options(CLI::App* cmd, std::string* workload, WorkloadSelection* selection);

// The model of --model or --shape as a runtime (random shapes: seed 0, bf16) and its name (the
// directory's, or the shape's). Throws Error naming the command when neither or both are given.
std::unique_ptr<engine::ModelRuntime> open_model_source(const std::string& command,
                                                        const std::string& model,
                                                        const std::string& shape,
                                                        const engine::RuntimeOptions& options,
                                                        std::string* name);

// The roofline's two rates on `device`, measured now and printed (one line each): on a GPU its
// streaming read and a cuBLAS bf16 GEMM (device_ceilings.h); on the CPU the multi-threaded read
// (`when` names the moment in its line) and, with `cpu_gemm`, ops::Linear's f32 GEMM.
struct RunCeilings {
  double read_gbs = 0;
  double gemm_gflops = 0;  // 0 when not measured
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
  const char* gemm = "";     // what the GEMM ceiling ran
  std::string machine;       // the GPU's name, or the CPU's
  CpuReadCeiling cpu_read;   // the CPU's read in full (ceiling_footer)
  DeviceCeilings gpu;        // the GPU's in full
};
RunCeilings measure_run_ceilings(Device device, double ceiling_time, int64_t ceiling_mib,
                                 const char* when, bool cpu_gemm);

// KEY=VALUE items into a JSON object; Error naming --metadata and the item for a malformed one.
nlohmann::json parse_metadata(const std::vector<std::string>& items);
// The median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace pagedattn::tools
