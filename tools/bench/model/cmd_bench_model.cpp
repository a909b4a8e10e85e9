// `pagedattn bench model`: one model step at a time, timed beside the roofline of that step
// (issue 14's "Fast" rows). On a random-weight model of a named shape (no download) or a
// checkpoint, on the CPU or a GPU:
//   prefill  B sequences of L new tokens each over an empty cache (default 1 x 2048 and 16 x 512
//            on a GPU): tokens/s and the FLOP rate it implies, beside the GEMM ceiling measured in
//            the same run (cuBLAS bf16 on a GPU, the library's f32 GEMM on the CPU);
//   decode   B sequences of one new token over a context of C tokens (default B 1, 16, 64, 256 at
//            C 1024 on a GPU): the step time beside its floor, max(weight + KV bytes / streaming
//            read ceiling, FLOPs / GEMM ceiling), both measured in the same run.
// A step is ModelRuntime::forward on a hand-built StepPlan (the engine's form): pages of each
// sequence in a fixed shuffled order (as a pool looks after some churn), and each sequence's
// next token as the engine gets it: on a GPU drawn on the device (ModelRuntime::forward_sampled,
// temperature 0.6: only token ids come back; decode steps replay CUDA graphs unless
// --enforce-eager), on the CPU from the logits copied back. The time is the median over --reps
// calls after --warmup, wall clock around the whole call (host planning and the copies back
// included: what an engine waits for). The KV the decode rows read was never written (zeros):
// the time does not depend on its values. Bytes and FLOPs per step are the throughput
// benchmark's (tools/bench/throughput/roofline.h).
//
// --timeline (GPU): after a row's timed calls, the same row again with Model::set_timeline on
// (a probe stamping the device clock after each stretch of the step: each layer's linear layers,
// head transform, attention, ...), and a table of where the step's device time goes: per stretch,
// the median over the calls of its time summed over the step's layers, beside the step's time
// with the probes (their cost: compare with the row's median above).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/error.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_random.h"
#include "tools/bench/cpu_ceiling.h"
#include "tools/bench/model/timeline_summary.h"
#include "tools/bench/throughput/device_ceilings.h"
#include "tools/bench/throughput/model_bench_options.h"
#include "tools/bench/throughput/roofline.h"
#include "tools/bench/throughput/run.h"
#include "tools/cli/command.h"
#include "tools/cli/gpu_step_options.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct ModelBenchOptions {
  std::string model;
  std::string shape;
  std::string device = "auto";
  GpuStepOptions gpu;                // --enforce-eager (one model step: no engine to overlap)
  std::vector<std::string> prefill;  // "BxL"
  std::vector<int32_t> batch;        // decode batch sizes
  int32_t context = 1024;            // decode: tokens per sequence after the step
  int32_t page_size = 16;
  std::string kv_dtype = "bf16";
  std::string backend = "auto";
  int32_t warmup = 2;
  int32_t reps = 0;  // 0: 10 on a GPU, 3 on the CPU
  int threads = 0;
  std::string cpu_weights = "auto";  // ops::WeightMode: auto, stored (kConvertTiles), f32
  double ceiling_time = 1.0;
  int64_t ceiling_mib = 0;
  std::string json_path;
  std::vector<std::string> metadata;
  bool timeline = false;
};

struct Row {
  bool decode = false;
  int32_t batch = 0;
  int32_t length = 0;  // prefill: new tokens per sequence; decode: context after the step
  engine::StepPlan plan;
};

// Runs `call` `reps` times after `warmup` with the model's timeline on and prints where the
// device time goes (summarize_timeline). Returns the rows for the JSON.
template <class Call>
nlohmann::json run_timeline(model::Model& model, int32_t warmup, int32_t reps, Call&& call) {
  model.set_timeline(true);
  std::vector<std::vector<model::Model::TimelineSpan>> steps;
  std::vector<double> walls;
  for (int32_t r = 0; r < warmup + reps; ++r) {
    const auto start = Clock::now();
    call();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<model::Model::TimelineSpan> spans = model.last_timeline();
    if (r < warmup) continue;
    walls.push_back(wall);
    steps.push_back(std::move(spans));
  }
  model.set_timeline(false);
  const TimelineSummary summary = summarize_timeline(steps);
  if (summary.stretches.empty()) {
    fmt::print("  timeline: none (the model records none on this device)\n");
    return nlohmann::json::array();
  }
  const double total = summary.step_seconds;
  Table table({"stretch", "per step", "us each", "us per step", "share"});
  nlohmann::json json = nlohmann::json::array();
  for (const TimelineStretch& row : summary.stretches) {
    table.add_row(
        {row.label, std::to_string(row.per_step),
         fmt::format("{:.2f}",
                     row.seconds * 1e6 / static_cast<double>(std::max<int64_t>(1, row.per_step))),
         fmt::format("{:.1f}", row.seconds * 1e6),
         fmt::format("{:.1f}%", total > 0 ? 100.0 * row.seconds / total : 0.0)});
    json.push_back({{"stretch", row.label}, {"per_step", row.per_step}, {"us", row.seconds * 1e6}});
  }
  fmt::print("{}", table.str());
  fmt::print(
      "  each stretch: from the end of the one before it to its own end (a probe kernel stamps "
      "the device clock between them); the stretches add up to {:.1f} us of device time per "
      "step (median); the whole call took {:.3f} ms with the probes in (median of {})\n",
      total * 1e6, median(walls) * 1e3, walls.size());
  return json;
}

struct PrefillShape {
  int32_t batch = 0, length = 0;
};

PrefillShape parse_prefill(const std::string& text) {
  const size_t x = text.find('x');
  PrefillShape shape;
  try {
    if (x == std::string::npos) throw std::invalid_argument("no x");
    size_t used = 0;
    shape.batch = std::stoi(text.substr(0, x), &used);
    if (used != x) throw std::invalid_argument("trailing");
    shape.length = std::stoi(text.substr(x + 1), &used);
    if (used != text.size() - x - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw Error(fmt::format("--prefill {} (expected BATCHxLENGTH, e.g. 16x512)", text));
  }
  if (shape.batch < 1 || shape.length < 1) {
    throw Error(fmt::format("--prefill {} (batch and length must be >= 1)", text));
  }
  return shape;
}

// A plan of `lengths.size()` sequences, each with `new_tokens` new tokens after `cached` ones,
// pages taken in order from `pages` (shuffled once), logits of each last token.
engine::StepPlan make_plan(int32_t batch, int32_t cached, int32_t new_tokens, int32_t page_size,
                           const std::vector<int32_t>& pages, int32_t vocab, std::mt19937& rng) {
  engine::StepPlan plan;
  plan.page_size = page_size;
  const int32_t per_sequence = (cached + new_tokens + page_size - 1) / page_size;
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 10001) - 1);
  size_t next = 0;
  for (int32_t b = 0; b < batch; ++b) {
    engine::ScheduledSequence s;
    s.sequence = b;
    s.first_position = cached;
    s.token_ids.resize(static_cast<size_t>(new_tokens));
    for (int32_t& id : s.token_ids) id = token(rng);
    s.block_table.assign(pages.begin() + static_cast<std::ptrdiff_t>(next),
                         pages.begin() + static_cast<std::ptrdiff_t>(next + per_sequence));
    next += static_cast<size_t>(per_sequence);
    s.num_logit_rows = 1;
    plan.sequences.push_back(std::move(s));
    plan.num_tokens += new_tokens;
    plan.num_logit_rows += 1;
  }
  plan.num_decodes = new_tokens == 1 ? batch : 0;
  return plan;
}

void run_bench_model(ModelBenchOptions options) {
  if (options.model.empty() == options.shape.empty()) {
    open_model_source("bench model", options.model, options.shape, {}, nullptr);  // throws
  }
  const model::ModelConfig config = options.model.empty() ? model::model_shape(options.shape)
                                                          : model::load_model_config(options.model);
  if (options.page_size < 1)
    throw Error(fmt::format("--page-size {} (expected >= 1)", options.page_size));
  if (options.context < 1)
    throw Error(fmt::format("--context {} (expected >= 1)", options.context));
  for (const int32_t b : options.batch) {
    if (b < 1) throw Error(fmt::format("--batch {} (expected >= 1)", b));
  }
  if (options.warmup < 0) throw Error(fmt::format("--warmup {} (expected >= 0)", options.warmup));
  if (options.reps < 0) throw Error(fmt::format("--reps {} (expected >= 1)", options.reps));
  const nlohmann::json metadata = parse_metadata(options.metadata);
  std::vector<PrefillShape> prefills;
  for (const std::string& text : options.prefill) prefills.push_back(parse_prefill(text));
  const DType kv_dtype = parse_kv_dtype(options.kv_dtype);
  const Device device = model::resolve_model_device([&] {
    model::ModelOptions m;
    m.device = options.device;
    m.backend = options.backend;
    return m;
  }());
  const bool on_gpu = device.type == DeviceType::kCUDA;
  // Defaults by device: the rows on a GPU; rows a CPU finishes in a minute or so.
  const bool default_rows = options.prefill.empty() && options.batch.empty();
  if (default_rows) {
    prefills = on_gpu ? std::vector<PrefillShape>{{1, 2048}, {16, 512}}
                      : std::vector<PrefillShape>{{1, 128}};
    options.batch = on_gpu ? std::vector<int32_t>{1, 16, 64, 256} : std::vector<int32_t>{1, 16};
  }
  if (options.reps == 0) options.reps = on_gpu ? 10 : 3;
  for (const PrefillShape& p : prefills) {
    PA_CHECK(p.length <= config.max_position_embeddings,
             "--prefill {}x{}: longer than the model's max_position_embeddings {}", p.batch,
             p.length, config.max_position_embeddings);
  }
  PA_CHECK(options.batch.empty() || options.context <= config.max_position_embeddings,
           "--context {}: longer than the model's max_position_embeddings {}", options.context,
           config.max_position_embeddings);

  // The pool holds the largest row at once; the model's buffers the largest step.
  int64_t pages = 1, max_tokens = 1;
  for (const PrefillShape& p : prefills) {
    pages = std::max<int64_t>(
        pages, int64_t{p.batch} * ((p.length + options.page_size - 1) / options.page_size));
    max_tokens = std::max<int64_t>(max_tokens, int64_t{p.batch} * p.length);
  }
  for (const int32_t b : options.batch) {
    pages = std::max<int64_t>(
        pages, int64_t{b} * ((options.context + options.page_size - 1) / options.page_size));
    max_tokens = std::max<int64_t>(max_tokens, b);
  }
  engine::RuntimeOptions runtime_options;
  runtime_options.model.backend = options.backend;
  runtime_options.model.device = options.device;
  options.gpu.apply(runtime_options);
  runtime_options.model.threads = options.threads;
  runtime_options.model.weight_mode = options.cpu_weights == "stored"
                                          ? ops::WeightMode::kConvertTiles
                                      : options.cpu_weights == "f32" ? ops::WeightMode::kCachedF32
                                                                     : ops::WeightMode::kAuto;
  runtime_options.model.max_step_tokens = max_tokens;
  runtime_options.page_size = options.page_size;
  runtime_options.kv_dtype = kv_dtype;
  runtime_options.num_pages = pages;
  const auto load_start = Clock::now();
  std::string model_name;
  const std::unique_ptr<engine::ModelRuntime> runtime =
      open_model_source("bench model", options.model, options.shape, runtime_options, &model_name);
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  const model::ModelConfig& model_config = runtime->config();
  const double bytes_per_weight =
      static_cast<double>(runtime->weight_bytes()) / parameter_count(model_config);
  const ModelCost cost = model_cost(model_config, bytes_per_weight, kv_dtype);
  const PdlMode pdl = pdl_mode(device);
  fmt::print(
      "bench model: {} ({}, {} layers, {} GB of weights as stored) on {}{}, loaded in {:.1f} s; "
      "KV pool {} pages of {} tokens ({:.2f} GB, {}); median of {} calls after {} warm-up{}\n",
      model_name, model::architecture_name(model_config.architecture),
      model_config.num_hidden_layers, static_cast<double>(runtime->weight_bytes()) / 1e9,
      device.str(), pdl.words.empty() ? "" : " (" + pdl.words + ")", load_s,
      runtime->pool().num_pages(), options.page_size,
      static_cast<double>(runtime->pool().bytes()) / 1e9, dtype_name(kv_dtype), options.reps,
      options.warmup, on_gpu ? "" : "; CPU weights " + options.cpu_weights);

  // Ceilings measured in this run.
  if (!on_gpu) fmt::print("{}\n", machine_description());
  const RunCeilings ceilings = measure_run_ceilings(device, options.ceiling_time,
                                                    options.ceiling_mib, "before the rows", true);
  const double read_gbs = ceilings.read_gbs, gemm_gflops = ceilings.gemm_gflops;
  const std::string gemm_name =
      fmt::format("{} {}x{}x{}", ceilings.gemm, ceilings.gemm_m, ceilings.gemm_k, ceilings.gemm_n);
  const std::string& machine = ceilings.machine;

  // The rows, each plan built once (pages shuffled once for the whole run).
  std::vector<int32_t> page_order(static_cast<size_t>(runtime->pool().num_pages()));
  std::iota(page_order.begin(), page_order.end(), 0);
  std::mt19937 rng(12345);
  std::shuffle(page_order.begin(), page_order.end(), rng);
  std::vector<Row> rows;
  for (const PrefillShape& p : prefills) {
    rows.push_back({false, p.batch, p.length,
                    make_plan(p.batch, 0, p.length, options.page_size, page_order,
                              model_config.vocab_size, rng)});
  }
  for (const int32_t b : options.batch) {
    rows.push_back({true, b, options.context,
                    make_plan(b, options.context - 1, 1, options.page_size, page_order,
                              model_config.vocab_size, rng)});
  }

  Table table({"step", "tokens", "median ms", "tok/s", "TFLOP/s", "GB/s", "floor ms", "bound",
               "x floor", "of GEMM ceiling"});
  nlohmann::json json_rows = nlohmann::json::array();
  std::vector<float> logits;
  std::vector<ops::RowSampling> sampling;
  std::vector<ops::SampledToken> sampled;
  const bool model_sampling = runtime->prefers_model_sampling();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const std::string name = row.decode ? fmt::format("decode {} x {}", row.batch, row.length)
                                        : fmt::format("prefill {} x {}", row.batch, row.length);
    fmt::print(stderr, "[{}/{}] {}\n", i + 1, rows.size(), name);
    const auto logit_rows = static_cast<size_t>(row.plan.num_logit_rows);
    logits.resize(logit_rows * runtime->vocab_size());
    ops::RowSampling drawn;
    drawn.sample = true;
    drawn.temperature = 0.6;
    drawn.seed = 1;
    sampling.assign(model_sampling ? logit_rows : 0, drawn);
    sampled.assign(sampling.size(), ops::SampledToken{});
    std::vector<double> samples;
    for (int32_t r = 0; r < options.warmup + options.reps; ++r) {
      const auto start = Clock::now();
      if (model_sampling) {
        runtime->forward_sampled(row.plan, sampling, logits, sampled);
      } else {
        runtime->forward(row.plan, logits);
      }
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      if (r >= options.warmup) samples.push_back(s);
    }
    const double seconds = median(samples);
    nlohmann::json timeline;
    if (options.timeline && on_gpu) {
      fmt::print("{} (--timeline; {:.3f} ms without the probes):\n", name, seconds * 1e3);
      timeline = run_timeline(runtime->model(), 2, options.reps, [&] {
        if (model_sampling) {
          runtime->forward_sampled(row.plan, sampling, logits, sampled);
        } else {
          runtime->forward(row.plan, logits);
        }
      });
    }
    const StepShape shape = shape_of(row.plan);
    const StepCost step = step_cost(cost, shape);
    const double memory_s = step.bytes / (read_gbs * 1e9),
                 compute_s = step.flops / (gemm_gflops * 1e9);
    const double floor_s = std::max(memory_s, compute_s);
    const bool memory_bound = memory_s >= compute_s;
    const double tflops = step.flops / seconds / 1e12, gbs = step.bytes / seconds / 1e9;
    const double of_gemm = step.flops / seconds / (gemm_gflops * 1e9);
    table.add_row({name, std::to_string(shape.tokens), fmt::format("{:.3f}", seconds * 1e3),
                   fmt::format("{:.0f}", static_cast<double>(shape.tokens) / seconds),
                   fmt::format("{:.2f}", tflops), fmt::format("{:.1f}", gbs),
                   fmt::format("{:.3f}", floor_s * 1e3), memory_bound ? "memory" : "compute",
                   fmt::format("{:.2f}", seconds / floor_s), fmt::format("{:.2f}", of_gemm)});
    json_rows.push_back({{"kind", row.decode ? "decode" : "prefill"},
                         {"batch", row.batch},
                         {row.decode ? "context" : "length", row.length},
                         {"tokens", shape.tokens},
                         {"ms_median", seconds * 1e3},
                         {"ms_samples", samples.size()},
                         {"tok_s", static_cast<double>(shape.tokens) / seconds},
                         {"flops", step.flops},
                         {"bytes", step.bytes},
                         {"tflops", tflops},
                         {"gbs", gbs},
                         {"floor_ms", floor_s * 1e3},
                         {"memory_bound", memory_bound},
                         {"x_floor", seconds / floor_s},
                         {"of_gemm_ceiling", of_gemm}});
    if (!timeline.is_null()) json_rows.back()["timeline"] = timeline;
  }
  fmt::print("\n{}", table.str());
  fmt::print(
      "floor = max(bytes / {:.1f} GB/s, FLOPs / {:.1f} GFLOP/s): bytes = every layer weight once "
      "as stored (MoE: the experts the step's tokens touch in expectation) + lm_head + the KV of "
      "every sequence + its new KV; FLOPs = 2 x parameters per token + lm_head rows + attention "
      "over each token's causal context. x floor = median / floor (1.00 is the roofline); of "
      "GEMM ceiling = the step's FLOP rate / the GEMM ceiling ({}). Times are whole calls "
      "(planning and the copy back included: {}).\n",
      read_gbs, gemm_gflops, gemm_name,
      !on_gpu ? "the logits"
      : options.gpu.enforce_eager
          ? "the sampled tokens; every step launched eagerly, --enforce-eager"
          : "the sampled tokens; decode steps replay CUDA graphs, dense models");

  if (!options.json_path.empty()) {
    const nlohmann::json document = {
        {"benchmark", "model"},
        {"date", utc_timestamp()},
        {"machine", machine},
        {"device", on_gpu ? "cuda" : "cpu"},
        {"model",
         {{"name", model_name},
          {"source", options.model.empty() ? "random bf16 weights" : options.model},
          {"architecture", model::architecture_name(model_config.architecture)},
          {"weight_bytes", runtime->weight_bytes()}}},
        {"engine",
         {{"page_size", options.page_size},
          {"kv_dtype", dtype_name(kv_dtype)},
          {"reps", options.reps},
          {"warmup", options.warmup},
          {"threads", ops::num_threads()},
          {"cpu_weights", options.cpu_weights},
          {"pdl", pdl.on}}},
        {"ceilings", {{"read_gbs", read_gbs}, {"gemm_gflops", gemm_gflops}, {"gemm", gemm_name}}},
        {"metadata", metadata},
        {"rows", json_rows}};
    std::ofstream out(options.json_path);
    PA_CHECK(out.good(), "bench model: --json {}: cannot open for writing", options.json_path);
    out << document.dump(2) << '\n';
  }
}

void add_bench_model_command(CLI::App& bench) {
  auto options = std::make_shared<ModelBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "model", "one model step (prefill, decode) at a time, beside the roofline of that step");
  add_model_source_options(cmd, &options->model, &options->shape);
  cmd->add_option("--device", options->device,
                  "where the model runs: auto (cuda:0 when usable, else cpu), cpu, cuda, cuda:N")
      ->capture_default_str();
  add_gpu_step_options(*cmd, options->gpu, /*engine=*/false);
  cmd->add_option("--prefill", options->prefill,
                  "prefill rows BATCHxLENGTH (default: 1x2048 16x512 on a GPU, 1x128 on the CPU; "
                  "with --batch only: none)");
  cmd->add_option("--batch", options->batch,
                  "decode batch sizes (default: 1 16 64 256 on a GPU, 1 16 on the CPU; with "
                  "--prefill only: none)");
  cmd->add_option("--context", options->context, "decode: tokens per sequence after the step")
      ->capture_default_str();
  cmd->add_option("--page-size", options->page_size, "KV page size in tokens")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", options->kv_dtype, kKvDtypeHelp)
      ->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "attention backend: auto, cpu, or prefill=X,decode=Y")
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "untimed calls per row")->capture_default_str();
  cmd->add_option("--reps", options->reps, "timed calls per row (0: 10 on a GPU, 3 on the CPU)")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "CPU threads (0: all cores)");
  cmd->add_option("--cpu-weights", options->cpu_weights,
                  "CPU: how linear layers hold bf16 weights: auto, stored (read as stored; "
                  "converted in tiles at prefill), f32 (an f32 copy made at load)")
      ->check(CLI::IsMember({"auto", "stored", "f32"}))
      ->capture_default_str();
  cmd->add_option("--ceiling-time", options->ceiling_time,
                  "CPU: seconds of samples for each ceiling (memory read, GEMM)")
      ->capture_default_str();
  cmd->add_option("--ceiling-mib", options->ceiling_mib,
                  "CPU: the read ceiling's buffer in MiB (0: max(2 GiB, 8 x L3))")
      ->capture_default_str();
  cmd->add_option("--json", options->json_path, "also write the results as JSON to FILE");
  cmd->add_flag("--timeline", options->timeline,
                "On a GPU: after each row, where its step's device time goes (a probe between "
                "the step's stretches of kernels; see Model::set_timeline)");
  cmd->add_option("--metadata", options->metadata,
                  "KEY=VALUE pairs recorded in the JSON (e.g. commit=abc1234)");
  cmd->callback([options] { run_bench_model(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("bench model", add_bench_model_command);

}  // namespace pagedattn::tools
