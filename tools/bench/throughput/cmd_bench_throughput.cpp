// `pagedattn bench throughput`: nano-vllm's offline throughput benchmark replayed exactly (the
// lengths of bench/workloads/nano-vllm-offline.json; prompts of random token ids in [0, 10000]
// from a fixed seed; temperature 0.6; ignore_eos; max_tokens = the output length) through the
// engine (engine::Engine over ModelRuntime), on a checkpoint (--model DIR) or a random-weight
// model of a named shape built in memory (--shape tiny|qwen3-0.6b|deepseek-v2-lite).
//
// This file: the options, the set-up (KV pool sized for every request at once unless told, the
// engine's limits), the ceilings, the report (a table, then the step split, the host time and the
// roofline spelled out) and the JSON that scripts/bench-tables turns into bench/RESULTS.md's
// throughput table. The run itself (all requests queued, Engine::step until done, each step and
// its forward timed, every output checked for its length) is run.cpp; the roofline (each step's
// floor max(bytes / read ceiling, FLOPs / GEMM ceiling), summed over the run's own steps, both
// ceilings measured in this command on the same threads) is roofline.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/check.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/error.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_random.h"
#include "tools/bench/cpu_ceiling.h"
#include "tools/bench/throughput/device_ceilings.h"
#include "tools/bench/throughput/model_bench_options.h"
#include "tools/bench/throughput/roofline.h"
#include "tools/bench/throughput/run.h"
#include "tools/bench/throughput/workload.h"
#include "tools/cli/command.h"
#include "tools/cli/gpu_step_options.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ThroughputOptions {
  std::string model;
  std::string shape;
  std::string workload;
  WorkloadSelection selection;
  double temperature = 0.6;
  int32_t page_size = 16;
  int32_t max_running = 256;
  int64_t max_tokens_per_step = 2048;
  bool no_prefix_cache = false;
  bool host_sampling = false;
  int64_t num_pages = 0;
  double kv_gib = 0;
  std::string kv_dtype = "bf16";
  std::string backend = "auto";
  std::string device = "auto";
  GpuStepOptions gpu;
  int threads = 0;
  double ceiling_time = 1.0;
  int64_t ceiling_mib = 0;
  std::string json_path;
  std::vector<std::string> metadata;
};

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

void run_bench_throughput(const ThroughputOptions& options) {
  if (options.model.empty() == options.shape.empty()) {
    open_model_source("bench throughput", options.model, options.shape, {}, nullptr);  // throws
  }
  if (!options.shape.empty()) model::model_shape(options.shape);  // names the shapes if unknown
  if (options.temperature < 0) {
    throw Error(fmt::format("--temperature {} (expected >= 0)", options.temperature));
  }
  if (options.page_size < 1)
    throw Error(fmt::format("--page-size {} (expected >= 1)", options.page_size));
  if (options.max_running < 1) {
    throw Error(fmt::format("--max-running {} (expected >= 1)", options.max_running));
  }
  if (options.num_pages < 0)
    throw Error(fmt::format("--num-pages {} (expected >= 1)", options.num_pages));
  if (!(options.kv_gib >= 0)) {
    throw Error(fmt::format("--kv-gib {} (expected > 0, or 0 for the default)", options.kv_gib));
  }
  if (options.ceiling_mib < 0) {
    throw Error(fmt::format("--ceiling-mib {} (expected >= 0)", options.ceiling_mib));
  }
  const nlohmann::json metadata = parse_metadata(options.metadata);
  const DType kv_dtype = parse_kv_dtype(options.kv_dtype);
  const fs::path path = resolve_workload(options.workload);
  const Workload workload = load_workload(path);
  WorkloadRequests requests = select_requests(workload, options.selection);
  const int64_t num_requests = static_cast<int64_t>(requests.prompts.size());

  // The KV pool: every request at once unless --num-pages, within --kv-gib (default: on a GPU, 90%
  // of the device memory the model leaves free, as vLLM's gpu_memory_utilization 0.9 and
  // nano-vllm do; on the CPU 16 GiB).
  const model::ModelConfig config = options.model.empty() ? model::model_shape(options.shape)
                                                          : model::load_model_config(options.model);
  PA_CHECK(options.selection.max_token_id < config.vocab_size,
           "bench throughput: the workload's token ids go up to {}, the model's vocabulary has {} "
           "(--max-token-id {} draws them from the model's ids)",
           options.selection.max_token_id, config.vocab_size, config.vocab_size - 1);
  const int64_t page_bytes = model::KvPool::bytes_per_page(config, options.page_size, kv_dtype);
  engine::RuntimeOptions runtime_options;
  runtime_options.model.backend = options.backend;
  runtime_options.model.device = options.device;
  int64_t pages = options.num_pages;
  if (pages == 0) {
    int64_t needed = 0;
    for (int64_t r = 0; r < num_requests; ++r) {
      const int64_t tokens = static_cast<int64_t>(requests.prompts[static_cast<size_t>(r)].size()) +
                             requests.output_lens[static_cast<size_t>(r)];
      needed += (tokens + options.page_size - 1) / options.page_size;
    }
    needed = std::max<int64_t>(needed, 1);
    const bool gpu =
        model::resolve_model_device(runtime_options.model).type == DeviceType::kCUDA;
    if (gpu && options.kv_gib == 0) {
      runtime_options.kv_memory_fraction = 0.9;  // sized once the model is on the device
      runtime_options.max_pages = needed;
    } else {
      const double gib = options.kv_gib > 0 ? options.kv_gib : 16.0;
      pages = std::max<int64_t>(
          1, std::min<int64_t>(needed, static_cast<int64_t>(gib * (1ll << 30)) / page_bytes));
    }
  }
  options.gpu.apply(runtime_options);
  runtime_options.model.threads = options.threads;
  runtime_options.page_size = options.page_size;
  runtime_options.kv_dtype = kv_dtype;
  runtime_options.num_pages = pages;

  const auto load_start = Clock::now();
  std::string model_name;
  auto runtime = open_model_source("bench throughput", options.model, options.shape,
                                   runtime_options, &model_name);
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  const model::ModelConfig& model_config = runtime->config();
  // Every tensor has the checkpoint's one dtype (random shapes: bf16).
  const double bytes_per_weight =
      static_cast<double>(runtime->weight_bytes()) / parameter_count(model_config);
  const ModelCost cost = model_cost(model_config, bytes_per_weight, kv_dtype);

  engine::EngineConfig engine_config = runtime->engine_config();
  engine_config.max_running = options.max_running;
  engine_config.max_tokens_per_step = options.max_tokens_per_step;
  engine_config.prefix_cache = !options.no_prefix_cache;
  if (options.host_sampling) engine_config.model_sampling = false;
  options.gpu.apply(engine_config);
  engine_config.seed = options.selection.seed;
  TimedRunner runner(*runtime, &runtime->model());
  const bool model_sampling =
      engine_config.model_sampling.value_or(runner.prefers_model_sampling());
  const Device device = runtime->model().device();
  const bool on_gpu = device.type == DeviceType::kCUDA;
  engine::Engine engine(engine_config, runner);

  const std::string subset =
      num_requests == static_cast<int64_t>(workload.input_lens.size())
          ? fmt::format("all {} requests", num_requests)
          : fmt::format("the first {} of {} requests", num_requests, workload.input_lens.size());
  const std::string caps =
      (options.selection.max_input_len > 0
           ? fmt::format(", prompts cut to {}", options.selection.max_input_len)
           : "") +
      (options.selection.max_output_len > 0
           ? fmt::format(", outputs cut to {}", options.selection.max_output_len)
           : "");
  fmt::print(
      "bench throughput: {} ({}{}), temperature {}, ignore_eos, max_tokens = output length\n",
      path.string(), subset, caps, options.temperature);
  const PdlMode pdl = pdl_mode(device);
  fmt::print(
      "model: {} ({}, {} layers, {} of weights as stored) on {}{}; {} {}, loaded in {:.1f} s\n",
      model_name, model::architecture_name(model_config.architecture),
      model_config.num_hidden_layers, gb(static_cast<double>(runtime->weight_bytes())),
      device.str(), pdl.words.empty() ? "" : " (" + pdl.words + ")",
      on_gpu ? "device memory of the model (weights, buffers):"
             : "the runtime "
               "holds more (f32 copies, RoPE tables):",
      gb(static_cast<double>(runtime->model().owned_bytes())), load_s);
  fmt::print(
      "KV pool: {} pages of {} tokens ({}, {}); engine: max running {}, max tokens per "
      "step {}, prefix cache {}, sampling {}; {} threads\n",
      runtime->pool().num_pages(), options.page_size,
      gb(static_cast<double>(runtime->pool().bytes())), dtype_name(kv_dtype), options.max_running,
      options.max_tokens_per_step, options.no_prefix_cache ? "off" : "on",
      model_sampling ? "by the model" : "on the host", ops::num_threads());
  fmt::print("{}\n", machine_description());
  // The ceilings of the device the model runs on, measured in this command: on the CPU a
  // streaming read and the library's f32 GEMM path on the same threads; on a GPU a streaming
  // read of device memory and a cuBLAS bf16 GEMM (device_ceilings.h).
  const RunCeilings before = measure_run_ceilings(device, options.ceiling_time, options.ceiling_mib,
                                                  "before the run", true);
  const double read_gbs = before.read_gbs;

  std::fflush(stdout);  // the set-up lines before a long run, also into a log
  const RunResult run = run_requests(engine, runner, std::move(requests), options.temperature);
  const RunCeilings after = measure_run_ceilings(device, options.ceiling_time, options.ceiling_mib,
                                                 "after the run", false);

  // Medians per step, and the roofline over the same steps.
  const engine::EngineStats& stats = run.stats;
  std::vector<double> host_ms, forward_ms, decode_ms, prefill_ms;
  std::vector<StepShape> shapes;
  int64_t decode_steps = 0;
  for (const StepRecord& record : run.steps) {
    host_ms.push_back((record.step_s - record.forward_s) * 1e3);
    forward_ms.push_back(record.forward_s * 1e3);
    (record.shape.decode_only() ? decode_ms : prefill_ms).push_back(record.forward_s * 1e3);
    decode_steps += record.shape.decode_only() ? 1 : 0;
    shapes.push_back(record.shape);
  }
  const RooflineTotal roofline =
      roofline_total(cost, shapes, read_gbs * 1e9, before.gemm_gflops * 1e9);
  const GpuIdle idle = gpu_idle(run.steps, run.wall_s);
  const int64_t steps = static_cast<int64_t>(run.steps.size());
  const int64_t prompt_tokens = run.prompt_tokens, output_tokens = run.output_tokens;
  const double wall_s = run.wall_s;
  const double output_tps = static_cast<double>(output_tokens) / wall_s;
  const double total_tps = static_cast<double>(prompt_tokens + output_tokens) / wall_s;
  const double roofline_tps = static_cast<double>(output_tokens) / roofline.seconds;
  const double ratio = output_tps / roofline_tps;
  const double host_total_s = wall_s - stats.forward_seconds;

  Table table({"model", "requests", "prompt tok", "output tok", "wall s", "output tok/s",
               "total tok/s", "steps", "host ms/step", "forward ms/step", "roofline tok/s",
               "ratio"});
  table.add_row({model_name, std::to_string(num_requests), std::to_string(prompt_tokens),
                 std::to_string(output_tokens), fmt::format("{:.2f}", wall_s),
                 fmt::format("{:.1f}", output_tps), fmt::format("{:.1f}", total_tps),
                 std::to_string(steps), fmt::format("{:.3f}", median(host_ms)),
                 fmt::format("{:.3f}", median(forward_ms)), fmt::format("{:.1f}", roofline_tps),
                 fmt::format("{:.2f}", ratio)});
  fmt::print("\n{}", table.str());
  fmt::print(
      "steps: {} decode-only (forward median {:.3f} ms), {} with prefill chunks (median {:.3f} "
      "ms); {} preemptions; prefix cache hits {} of {} prompt tokens\n",
      decode_steps, median(decode_ms), steps - decode_steps, median(prefill_ms),
      stats.num_preemptions, stats.prefix_hit_tokens, stats.prefix_query_tokens);
  fmt::print(
      "host time outside the forward: {:.2f} s of {:.2f} s ({:.1f}%): engine scheduling {:.2f} s, "
      "sampling + stop checks + events {:.2f} s; host ms/step and forward ms/step are medians\n",
      host_total_s, wall_s, 100 * host_total_s / wall_s, stats.schedule_seconds,
      stats.sample_seconds);
  // On a shared host other processes take cores from the run: then the figures understate the
  // code, and the report says so.
  fmt::print("CPU time over the run: this process {:.1f} s ({:.2f} of {} threads on average)",
             run.cpu_s, run.cpu_s / wall_s, ops::num_threads());
  if (run.other_cores >= 0) {
    fmt::print(", other processes {:.2f} cores{}", run.other_cores,
               run.other_cores > 0.1
                   ? " (WARNING: a shared machine: the figures understate the code by up to as "
                     "much; OpenMP threads that spin while another process holds their core "
                     "cost most: OMP_WAIT_POLICY=passive)"
                   : "");
  }
  fmt::print("\n");
  fmt::print(
      "roofline: sum over the run's {} steps of max(bytes / {:.1f} GB/s, FLOPs / {:.1f} GFLOP/s) "
      "= {:.2f} s -> {:.1f} output tok/s; {} steps memory-bound ({:.2f} s), {} compute-bound "
      "({:.2f} s). Bytes per step: every layer weight once as stored ({}; MoE: the experts the "
      "step's tokens touch in expectation), the lm_head when a row wants logits, the KV of every "
      "scheduled sequence and its new KV; FLOPs: 2 x parameters per token, 2 x vocab x hidden per "
      "logits row, attention over each token's causal context. ratio = measured / roofline "
      "output tok/s.\n",
      steps, read_gbs, before.gemm_gflops, roofline.seconds, roofline_tps,
      roofline.memory_bound_steps, roofline.memory_s, steps - roofline.memory_bound_steps,
      roofline.compute_s, gb(cost.all_weight_bytes));
  if (on_gpu) {
    fmt::print(
        "GPU idle: {:.1f}% of the run between forwards (the device had nothing of the model to "
        "run: the engine's host work between steps), {:.1f}% in steady decode ({} decode-only "
        "steps after a decode-only step: gap / (gap + span), median gap {:.3f} ms); idle time "
        "inside a forward (host planning, MoE routing's round trip) is not separated out.\n",
        100 * idle.between_steps, 100 * idle.steady_decode, idle.steady_decode_steps,
        idle.steady_decode_gap_ms);
    fmt::print("CUDA graphs: {} of {} decode-only steps replayed one{}\n", idle.graph_steps,
               idle.decode_steps, options.gpu.enforce_eager ? " (--enforce-eager)" : "");
    fmt::print("overlap scheduling: {} of {} steps launched before the previous one was taken "
               "in{}\n",
               stats.num_overlapped_steps, stats.num_steps,
               options.gpu.no_overlap ? " (--disable-overlap-schedule)" : "");
    fmt::print(
        "ceilings after the run: read {:.1f} GB/s, GEMM {:.1f} TFLOP/s (before: {:.1f}, "
        "{:.1f})\n",
        after.gpu.read_gbs, after.gpu.matmul_tflops, before.gpu.read_gbs, before.gpu.matmul_tflops);
  } else {
    fmt::print("{}", ceiling_footer(before.cpu_read, after.cpu_read, 0.0));
  }

  if (!options.json_path.empty()) {
    nlohmann::json row = {{"device", on_gpu ? "cuda" : "cpu"},
                          {"model", model_name},
                          {"requests", num_requests},
                          {"workload_requests", workload.input_lens.size()},
                          {"max_input_len", options.selection.max_input_len},
                          {"max_output_len", options.selection.max_output_len},
                          {"prompt_tokens", prompt_tokens},
                          {"output_tokens", output_tokens},
                          {"wall_s", wall_s},
                          {"output_tok_s", output_tps},
                          {"total_tok_s", total_tps},
                          {"steps", steps},
                          {"decode_steps", decode_steps},
                          {"host_ms_median", median(host_ms)},
                          {"forward_ms_median", median(forward_ms)},
                          {"decode_forward_ms_median", median(decode_ms)},
                          {"prefill_forward_ms_median", median(prefill_ms)},
                          {"host_s", host_total_s},
                          {"cpu_s", run.cpu_s},
                          {"other_cores", run.other_cores},
                          {"schedule_s", stats.schedule_seconds},
                          {"sample_s", stats.sample_seconds},
                          {"forward_s", stats.forward_seconds},
                          {"preemptions", stats.num_preemptions},
                          {"prefix_hit_tokens", stats.prefix_hit_tokens},
                          {"roofline_s", roofline.seconds},
                          {"roofline_memory_s", roofline.memory_s},
                          {"roofline_compute_s", roofline.compute_s},
                          {"memory_bound_steps", roofline.memory_bound_steps},
                          {"roofline_output_tok_s", roofline_tps},
                          {"ratio", ratio}};
    if (on_gpu) {
      row["gpu_idle_between_steps"] = idle.between_steps;
      row["gpu_idle_steady_decode"] = idle.steady_decode;
      row["gpu_gap_ms_median"] = idle.steady_decode_gap_ms;
      row["graph_steps"] = idle.graph_steps;
      row["overlapped_steps"] = stats.num_overlapped_steps;
      row["decode_steps"] = idle.decode_steps;
    }
    const nlohmann::json document = {
        {"benchmark", "throughput"},
        {"date", utc_timestamp()},
        {"machine", before.machine},
        {"workload",
         {{"file", path.filename().string()},
          {"temperature", options.temperature},
          {"seed", options.selection.seed},
          {"max_token_id", options.selection.max_token_id}}},
        {"model",
         {{"name", model_name},
          {"source", options.model.empty() ? "random bf16 weights" : options.model},
          {"architecture", model::architecture_name(model_config.architecture)},
          {"weight_bytes", runtime->weight_bytes()}}},
        {"engine",
         {{"page_size", options.page_size},
          {"num_pages", runtime->pool().num_pages()},
          {"kv_dtype", dtype_name(kv_dtype)},
          {"max_running", options.max_running},
          {"max_tokens_per_step", options.max_tokens_per_step},
          {"prefix_cache", !options.no_prefix_cache},
          {"model_sampling", model_sampling},
          {"threads", ops::num_threads()},
          {"pdl", pdl.on}}},
        {"ceilings",
         {{"read_gbs", read_gbs},
          {"read_gbs_after", after.read_gbs},
          {"gemm_gflops", before.gemm_gflops},
          {"gemm", before.gemm},
          {"gemm_shape", fmt::format("{}x{}x{}", before.gemm_m, before.gemm_k, before.gemm_n)}}},
        {"metadata", metadata},
        {"rows", nlohmann::json::array({row})}};
    std::ofstream out(options.json_path);
    PA_CHECK(out.good(), "bench throughput: --json {}: cannot open for writing", options.json_path);
    out << document.dump(2) << '\n';
  }
}

void add_bench_throughput_command(CLI::App& bench) {
  auto options = std::make_shared<ThroughputOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "throughput",
      "nano-vllm's offline workload through the engine: tokens/s beside the roofline of the run");
  add_model_source_options(cmd, &options->model, &options->shape);
  add_workload_options(cmd, &options->workload, &options->selection);
  cmd->add_option("--temperature", options->temperature, "sampling temperature")
      ->capture_default_str();
  cmd->add_option("--page-size", options->page_size, "KV page size in tokens")
      ->capture_default_str();
  cmd->add_option("--max-running", options->max_running, "requests running at once at most")
      ->capture_default_str();
  cmd->add_option("--max-tokens-per-step", options->max_tokens_per_step,
                  "token budget of a step (<= 0: unbounded)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", options->no_prefix_cache, "turn the prefix cache off");
  cmd->add_flag("--host-sampling", options->host_sampling,
                "sample every row on the host from copied logits (default on a GPU: the model "
                "samples the rows it can and copies back only their tokens)");
  cmd->add_option("--num-pages", options->num_pages,
                  "KV pool pages (0: every request at once, within --kv-gib)")
      ->capture_default_str();
  cmd->add_option("--kv-gib", options->kv_gib,
                  "the default pool's size limit in GiB (0: on a GPU, 90% of the device memory "
                  "the model leaves free; on the CPU 16)")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", options->kv_dtype, kKvDtypeHelp)
      ->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "attention backend: auto, cpu, or prefill=X,decode=Y")
      ->capture_default_str();
  cmd->add_option("--device", options->device,
                  "where the model runs: auto (cuda:0 when usable, else cpu), cpu, cuda, cuda:N")
      ->capture_default_str();
  add_gpu_step_options(*cmd, options->gpu);
  cmd->add_option("--threads", options->threads, "CPU threads (0: all cores)");
  cmd->add_option("--ceiling-time", options->ceiling_time,
                  "seconds of samples for each ceiling (memory read, GEMM)")
      ->capture_default_str();
  cmd->add_option("--ceiling-mib", options->ceiling_mib,
                  "the read ceiling's buffer in MiB (0: max(2 GiB, 8 x L3); smaller is quicker "
                  "but may be served partly from cache)")
      ->capture_default_str();
  cmd->add_option("--json", options->json_path, "also write the results as JSON to FILE");
  cmd->add_option("--metadata", options->metadata,
                  "KEY=VALUE recorded in the JSON (e.g. commit=abc1234, read by "
                  "scripts/bench-tables)");
  cmd->callback([options] { run_bench_throughput(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("bench throughput", add_bench_throughput_command);

}  // namespace pagedattn::tools
