// `pagedattn bench engine-host`: what the engine does on the host per step, measured with no model
// under it (NullRunner: no compute; tokens drawn as a function of each row's seed, choice and
// position), so that every microsecond is the engine's. On a GPU that time is device idle time
// between two forwards unless something overlaps it (issue 16: idle < 5% of a decode step).
//
// Scenarios, each run on a fresh Engine:
//  - nano-vllm: the offline workload of `bench throughput` (bench/workloads/nano-vllm-offline.json:
//    256 requests, temperature 0.6, ignore_eos, max_tokens = the output length), all queued at
//    once and run to the end; every request must come back with exactly its output length.
//  - decode B: B requests of short prompts (--prompt-len + i % page size tokens, so the requests
//    fill their pages on different steps, as a real batch does) and long outputs; once all B
//    decode, --warmup steps, then --steps measured steps, each a decode of all B.
// Each step's host time is split by the engine's own phase timers (EngineStats: schedule, plan,
// forward = the runner's call, sample = post-processing and events), read after every step, and
// the whole Engine::step call is timed around it; the events are drained from the streams after
// each step, outside the timing (a server's handler threads do that). Medians and 90th
// percentiles per step; the GPU idle fraction is step / (step + --device-step-ms). With
// --tokenizer DIR every token is also detokenized (and --stop strings matched), as in a server.
//
// Then the model's own host planning, which the engine does not see: StepPlanner::prepare on the
// CPU for each decode batch at the context the decode scenario reached (prepare_timing.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_detokenizer.h"
#include "pagedattn/error.h"
#include "pagedattn/model_random.h"
#include "pagedattn/tokenizer.h"
#include "tools/bench/engine_host/host_steps.h"
#include "tools/bench/engine_host/null_runner.h"
#include "tools/bench/engine_host/prepare_timing.h"
#include "tools/bench/throughput/model_bench_options.h"
#include "tools/bench/throughput/workload.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kShape = "qwen3-0.6b";

struct EngineHostOptions {
  double device_step_ms = 4.0;
  std::vector<int32_t> batches = {1, 16, 64, 256};
  int32_t steps = 200;
  int32_t warmup = 16;
  int32_t prompt_len = 128;
  std::string workload;
  WorkloadSelection selection;
  std::vector<std::string> scenarios = {"workload", "decode", "prepare"};
  double temperature = 0.6;
  int32_t vocab = 0;  // 0: the shape's
  int32_t page_size = 16;
  int32_t max_running = 256;
  int64_t max_tokens_per_step = 2048;
  bool no_prefix_cache = false;
  bool host_sampling = false;
  std::string tokenizer;           // a directory with tokenizer.json: detokenize every token
  std::vector<std::string> stops;  // stop strings on every request (need --tokenizer)
  double prepare_time = 0.2;
  std::string json_path;
  std::vector<std::string> metadata;
};

bool wants(const EngineHostOptions& options, const std::string& scenario) {
  return std::find(options.scenarios.begin(), options.scenarios.end(), scenario) !=
         options.scenarios.end();
}

// An engine over a NullRunner, its requests, and the timed step.
class Bench {
 public:
  Bench(const EngineHostOptions& options, int32_t vocab, std::vector<int32_t> eos,
        int32_t max_running, int64_t num_pages, engine::DetokenizerFactory detokenizer)
      : runner_(vocab, eos) {
    engine::EngineConfig config;
    config.num_pages = static_cast<int32_t>(num_pages);
    config.page_size = options.page_size;
    config.max_tokens_per_step = options.max_tokens_per_step;
    config.max_running = max_running;
    config.max_model_length = int64_t{1} << 20;
    config.prefix_cache = !options.no_prefix_cache;
    config.eos_token_ids = std::move(eos);
    config.seed = options.selection.seed;
    if (options.host_sampling) config.model_sampling = false;
    engine_ = std::make_unique<engine::Engine>(config, runner_, std::move(detokenizer));
    last_ = engine_->stats();
  }

  void add(std::vector<int32_t> prompt, const engine::SamplingParams& params) {
    handles_.push_back(engine_->add_request(std::move(prompt), params));
    tokens_.push_back(0);
    reasons_.push_back(engine::FinishReason::kNone);
    errors_.emplace_back();
  }

  // One Engine::step, timed; then the streams drained (untimed).
  HostStep step() {
    const int64_t calls = runner_.calls();
    const auto start = Clock::now();
    engine_->step();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const engine::EngineStats now = engine_->stats();
    HostStep step = host_step_between(last_, now, seconds);
    last_ = now;
    if (runner_.calls() > calls) {
      step.sequences = runner_.last_sequences();
      step.decodes = runner_.last_decodes();
    }
    for (size_t r = 0; r < handles_.size(); ++r) {
      if (reasons_[r] != engine::FinishReason::kNone) continue;
      while (auto event = handles_[r].stream->try_pop()) {
        tokens_[r] += static_cast<int64_t>(event->token_ids.size());
        if (event->finished()) {
          reasons_[r] = event->finish_reason;
          errors_[r] = event->error;
        }
      }
    }
    return step;
  }

  engine::Engine& engine() { return *engine_; }
  const NullRunner& runner() const { return runner_; }
  int64_t tokens(size_t r) const { return tokens_[r]; }
  engine::FinishReason reason(size_t r) const { return reasons_[r]; }
  const std::string& error(size_t r) const { return errors_[r]; }

 private:
  NullRunner runner_;
  std::unique_ptr<engine::Engine> engine_;
  engine::EngineStats last_;
  std::vector<engine::Engine::Handle> handles_;
  std::vector<int64_t> tokens_;
  std::vector<engine::FinishReason> reasons_;
  std::vector<std::string> errors_;
};

// What every scenario's engine shares.
struct Setup {
  int32_t vocab = 0;
  std::vector<int32_t> eos;                // never drawn by the runner
  engine::DetokenizerFactory detokenizer;  // empty: none (--tokenizer)
};

int64_t pages_for(int64_t tokens, int32_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

struct ScenarioResult {
  std::string name;
  std::string kind;  // "workload" | "decode"
  int32_t batch = 0;
  double context_start = 0, context_end = 0;  // decode: mean context over the measured steps
  int64_t output_tokens = 0;
  double wall_s = 0;  // the measured steps, stream draining included
  HostSummary summary;
};

// CPU use over a stretch of the command, to tell a quiet machine from a shared one: the cores
// other processes kept busy (/proc/stat's busy time less this process's), < 0 if unknown.
struct CpuWatch {
  double cpu_start = process_cpu_seconds();
  double busy_start = machine_busy_seconds();
  Clock::time_point start = Clock::now();
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  double other_cores() const {
    const double wall = seconds();
    const double cpu = process_cpu_seconds() - cpu_start;
    const double busy = machine_busy_seconds();
    if (busy_start < 0 || busy < 0 || wall <= 0) return -1;
    return std::max(0.0, busy - busy_start - cpu) / wall;
  }
};

ScenarioResult run_workload(const EngineHostOptions& options, const Setup& setup,
                            const fs::path& path) {
  const Workload workload = load_workload(path);
  // nano-vllm's prompt ids are in [0, 10000]; a smaller vocabulary (a small --tokenizer) caps them.
  WorkloadSelection selection = options.selection;
  selection.max_token_id = std::min(selection.max_token_id, setup.vocab - 1);
  WorkloadRequests requests = select_requests(workload, selection);
  const size_t n = requests.prompts.size();
  int64_t pages = 1;
  for (size_t r = 0; r < n; ++r) {
    pages += pages_for(static_cast<int64_t>(requests.prompts[r].size()) + requests.output_lens[r],
                       options.page_size);
  }
  Bench bench(options, setup.vocab, setup.eos, options.max_running, pages, setup.detokenizer);
  engine::SamplingParams params;
  params.temperature = options.temperature;
  params.ignore_eos = true;
  params.stop = options.stops;
  for (size_t r = 0; r < n; ++r) {
    params.max_tokens = requests.output_lens[r];
    bench.add(std::move(requests.prompts[r]), params);
  }
  ScenarioResult result;
  result.name = n == workload.input_lens.size()
                    ? fmt::format("nano-vllm {}", n)
                    : fmt::format("nano-vllm first {} of {}", n, workload.input_lens.size());
  result.kind = "workload";
  result.batch = static_cast<int32_t>(n);
  std::vector<HostStep> steps;
  const CpuWatch watch;
  while (bench.engine().has_work()) {
    const HostStep step = bench.step();
    if (step.sequences > 0) steps.push_back(step);
  }
  result.wall_s = watch.seconds();
  for (size_t r = 0; r < n; ++r) {
    const int32_t expected = requests.output_lens[r];
    PA_CHECK(bench.reason(r) == engine::FinishReason::kLength && bench.tokens(r) == expected,
             "bench engine-host: request {} finished ({}) with {} of its {} output tokens{}", r,
             engine::to_string(bench.reason(r)), bench.tokens(r), expected,
             bench.error(r).empty() ? "" : ": " + bench.error(r));
    result.output_tokens += bench.tokens(r);
  }
  result.summary = summarize(steps);
  return result;
}

ScenarioResult run_decode(const EngineHostOptions& options, const Setup& setup, int32_t batch) {
  const int32_t vocab = setup.vocab;
  // Steps before every request decodes: the prefill chunks of the budget, one more to be sure.
  const int64_t prompt_tokens = int64_t{batch} * (options.prompt_len + options.page_size);
  const int64_t fill_steps =
      options.max_tokens_per_step > 0 ? prompt_tokens / options.max_tokens_per_step + 2 : 2;
  const int64_t max_tokens = fill_steps + options.warmup + options.steps + 8;
  std::mt19937_64 random(options.selection.seed + static_cast<uint64_t>(batch));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  int64_t pages = 1;
  for (int32_t r = 0; r < batch; ++r) {
    auto& prompt = prompts[static_cast<size_t>(r)];
    prompt.resize(static_cast<size_t>(options.prompt_len + r % options.page_size));
    for (int32_t& token : prompt) token = static_cast<int32_t>(random() % 10001 % vocab);
    pages += pages_for(static_cast<int64_t>(prompt.size()) + max_tokens, options.page_size);
  }
  Bench bench(options, vocab, setup.eos, std::max(batch, options.max_running), pages,
              setup.detokenizer);
  engine::SamplingParams params;
  params.temperature = options.temperature;
  params.ignore_eos = true;
  params.stop = options.stops;
  params.max_tokens = max_tokens;
  for (auto& prompt : prompts) bench.add(prompt, params);

  ScenarioResult result;
  result.name = fmt::format("decode B={}", batch);
  result.kind = "decode";
  result.batch = batch;
  auto mean_context = [&] {
    double total = 0;
    for (int32_t r = 0; r < batch; ++r) {
      total += static_cast<double>(prompts[static_cast<size_t>(r)].size()) +
               static_cast<double>(bench.tokens(static_cast<size_t>(r)));
    }
    return total / batch;
  };
  for (int64_t guard = 0;; ++guard) {
    PA_CHECK(guard <= fill_steps + 64,
             "bench engine-host: decode B={}: not all {} requests "
             "decoding after {} steps",
             batch, batch, guard);
    const HostStep step = bench.step();
    if (step.decode_only() && step.sequences == batch) break;
  }
  for (int32_t i = 0; i < options.warmup; ++i) bench.step();
  result.context_start = mean_context();
  std::vector<HostStep> steps;
  const CpuWatch watch;
  for (int32_t i = 0; i < options.steps; ++i) {
    const HostStep step = bench.step();
    PA_CHECK(step.decode_only() && step.sequences == batch,
             "bench engine-host: decode B={}: measured step {} ran {} sequences, {} decodes", batch,
             i, step.sequences, step.decodes);
    steps.push_back(step);
  }
  result.wall_s = watch.seconds();
  result.context_end = mean_context();
  result.output_tokens = int64_t{options.steps} * batch;
  result.summary = summarize(steps);
  return result;
}

std::string cell(const Spread& spread) {
  return fmt::format("{:.1f} / {:.1f}", spread.median, spread.p90);
}

nlohmann::json spread_json(const Spread& spread) {
  return {{"median", spread.median}, {"p90", spread.p90}, {"mean", spread.mean}};
}

void run_bench_engine_host(const EngineHostOptions& options) {
  if (!(options.device_step_ms > 0)) {
    throw Error(fmt::format("--device-step-ms {} (expected > 0)", options.device_step_ms));
  }
  for (const int32_t batch : options.batches) {
    if (batch < 1) throw Error(fmt::format("--batches {} (expected >= 1)", batch));
  }
  if (options.steps < 1) throw Error(fmt::format("--steps {} (expected >= 1)", options.steps));
  if (options.warmup < 0) throw Error(fmt::format("--warmup {} (expected >= 0)", options.warmup));
  if (options.prompt_len < 1) {
    throw Error(fmt::format("--prompt-len {} (expected >= 1)", options.prompt_len));
  }
  if (options.page_size < 1) {
    throw Error(fmt::format("--page-size {} (expected >= 1)", options.page_size));
  }
  if (options.max_running < 1) {
    throw Error(fmt::format("--max-running {} (expected >= 1)", options.max_running));
  }
  if (options.temperature < 0) {
    throw Error(fmt::format("--temperature {} (expected >= 0)", options.temperature));
  }
  if (options.vocab < 0 || options.vocab == 1) {
    throw Error(fmt::format("--vocab {} (expected >= 2, or 0: the shape's)", options.vocab));
  }
  for (const std::string& scenario : options.scenarios) {
    if (scenario != "workload" && scenario != "decode" && scenario != "prepare") {
      throw Error(fmt::format("--scenarios {} (expected workload, decode, prepare)", scenario));
    }
  }
  if (!options.stops.empty() && options.tokenizer.empty()) {
    throw Error("--stop: stop strings are matched on the detokenized text: pass --tokenizer DIR");
  }
  const nlohmann::json metadata = parse_metadata(options.metadata);
  const model::ModelConfig shape = model::model_shape(kShape);
  // With a tokenizer every token is detokenized (as a server does), so the runner draws ids the
  // tokenizer knows: its vocabulary unless --vocab is smaller.
  std::optional<tokenizer::Tokenizer> tok;
  if (!options.tokenizer.empty()) tok = tokenizer::Tokenizer::from_directory(options.tokenizer);
  Setup setup;
  if (options.vocab > 0) {
    setup.vocab = options.vocab;
  } else {
    setup.vocab = static_cast<int32_t>(tok ? tok->vocab_size() : shape.vocab_size);
  }
  if (tok && setup.vocab > tok->vocab_size()) {
    throw Error(fmt::format("--vocab {}: the tokenizer at {} has {} ids", setup.vocab,
                            options.tokenizer, tok->vocab_size()));
  }
  if (tok) setup.detokenizer = engine::make_detokenizer_factory(*tok);
  for (const int64_t id : shape.eos_token_ids) {
    if (id < setup.vocab) setup.eos.push_back(static_cast<int32_t>(id));
  }
  const fs::path path =
      wants(options, "workload") ? resolve_workload(options.workload) : fs::path();
  const double device_s = options.device_step_ms * 1e-3;
  std::string vocab_source = kShape;
  if (options.vocab > 0) vocab_source = "--vocab";
  if (options.vocab == 0 && tok) vocab_source = "the tokenizer's";
  std::string text = "no detokenizer";
  if (tok) text = "every token detokenized (the tokenizer at " + options.tokenizer + ")";
  for (const std::string& stop : options.stops) text += fmt::format(", stop string \"{}\"", stop);

  fmt::print(
      "bench engine-host: the engine's host time per step over a null model runner (no model "
      "compute; tokens a function of each row's seed, choice and position, never EOS); vocabulary "
      "{} ({}), page size {}, max running {}, max tokens per step {}, prefix cache {}, sampling "
      "{}, "
      "{}; GPU idle against a {:.2f} ms device step\n",
      setup.vocab, vocab_source, options.page_size, options.max_running,
      options.max_tokens_per_step, options.no_prefix_cache ? "off" : "on",
      options.host_sampling ? "on the host (--host-sampling)" : "by the runner", text,
      options.device_step_ms);
  fmt::print("{}\n", machine_description());
  std::fflush(stdout);

  std::vector<ScenarioResult> results;
  const CpuWatch watch;
  auto announce = [&](const std::string& what) {
    fmt::print(stderr, "bench engine-host: {}\n", what);
    std::fflush(stderr);
  };
  if (wants(options, "workload")) {
    announce(fmt::format("{} ...", path.string()));
    results.push_back(run_workload(options, setup, path));
  }
  std::vector<double> decode_context(options.batches.size(), 0);
  if (wants(options, "decode")) {
    for (size_t i = 0; i < options.batches.size(); ++i) {
      announce(fmt::format("decode B={}: {} steps ...", options.batches[i], options.steps));
      results.push_back(run_decode(options, setup, options.batches[i]));
      decode_context[i] = 0.5 * (results.back().context_start + results.back().context_end);
    }
  }
  const double other_cores = results.empty() ? -1 : watch.other_cores();

  Table table({"scenario", "steps", "seqs/step", "schedule us", "plan us", "runner us", "post us",
               "other us", "step us", "GPU idle %"});
  for (const ScenarioResult& r : results) {
    const HostSummary& s = r.summary;
    table.add_row({r.name, std::to_string(s.steps), fmt::format("{:.0f}", s.median_sequences),
                   cell(s.schedule_us), cell(s.plan_us), cell(s.runner_us), cell(s.post_us),
                   cell(s.other_us), cell(s.step_us),
                   fmt::format("{:.2f}", 100 * idle_fraction(s.step_us.median * 1e-6, device_s))});
  }
  if (table.rows() > 0) {
    fmt::print("\n{}", table.str());
    fmt::print(
        "Cells: median / p90 microseconds per step. schedule: the inbox, the scheduling decisions, "
        "pages; plan: the step's token ids and block tables, the rows the runner samples; runner: "
        "the call to the null runner (its draws) and the engine's check of its tokens; post: pages "
        "offered to the prefix cache, the sampled tokens taken, stop checks, events pushed to the "
        "streams, finished requests released; other: the rest of Engine::step (the stats "
        "snapshot, the timers themselves); step: the whole call. GPU idle % = step / (step + "
        "{:.2f} ms) at the median, with nothing overlapped.\n",
        options.device_step_ms);
    if (other_cores >= 0) {
      fmt::print(
          "Other processes kept {:.2f} cores busy during these runs{}\n", other_cores,
          other_cores > 0.1 ? " (a shared machine: the figures are noisier and higher)" : "");
    }
    for (const ScenarioResult& r : results) {
      if (r.kind == "decode") {
        fmt::print("{}: mean context {:.0f} to {:.0f} tokens over the measured steps\n", r.name,
                   r.context_start, r.context_end);
      } else {
        fmt::print("{}: {} output tokens, {} steps of which {} decode-only, {:.2f} s\n", r.name,
                   r.output_tokens, r.summary.steps, r.summary.decode_steps, r.wall_s);
      }
    }
  }

  // The model's host planning per decode step, at the context the decode scenario reached.
  std::vector<PrepareTiming> prepares;
  if (wants(options, "prepare")) {
    for (size_t i = 0; i < options.batches.size(); ++i) {
      const int64_t context = decode_context[i] > 0 ? static_cast<int64_t>(decode_context[i] + 0.5)
                                                    : options.prompt_len + options.page_size / 2 +
                                                          options.warmup + options.steps / 2;
      announce(
          fmt::format("StepPlanner::prepare B={} at context {} ...", options.batches[i], context));
      prepares.push_back(time_prepare(shape, options.batches[i], context, options.page_size,
                                      options.prepare_time));
    }
    Table prepare_table({"batch", "context", "calls", "prepare us", "CPU backend plan us",
                         "host part us", "engine step us", "engine + host part us", "GPU idle %"});
    for (size_t i = 0; i < prepares.size(); ++i) {
      const PrepareTiming& p = prepares[i];
      const double host_part = p.prepare_us.median - p.backend_plan_us.median;
      double engine_us = -1;
      for (const ScenarioResult& r : results) {
        if (r.kind == "decode" && r.batch == p.batch) engine_us = r.summary.step_us.median;
      }
      prepare_table.add_row(
          {std::to_string(p.batch), std::to_string(p.context), std::to_string(p.calls),
           cell(p.prepare_us), cell(p.backend_plan_us), fmt::format("{:.1f}", host_part),
           engine_us >= 0 ? fmt::format("{:.1f}", engine_us) : "-",
           engine_us >= 0 ? fmt::format("{:.1f}", engine_us + host_part) : "-",
           engine_us >= 0
               ? fmt::format("{:.2f}",
                             100 * idle_fraction((engine_us + host_part) * 1e-6, device_s))
               : "-"});
    }
    fmt::print(
        "\nThe model's host planning of a decode step (StepPlanner::prepare, called directly on "
        "the "
        "CPU: {} attention, one request of one new token per row at the context above, with its "
        "sampling row): prepare is the whole call with the CPU backend; the CPU backend's plan "
        "(its host work partition) is timed alone and left out of the host part, which a CUDA "
        "model pays as well (plus its upload and the device plan's launch).\n",
        kShape);
    fmt::print("{}", prepare_table.str());
  }

  if (!options.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const ScenarioResult& r : results) {
      const HostSummary& s = r.summary;
      rows.push_back({{"scenario", r.name},
                      {"kind", r.kind},
                      {"batch", r.batch},
                      {"steps", s.steps},
                      {"decode_steps", s.decode_steps},
                      {"median_sequences", s.median_sequences},
                      {"context_start", r.context_start},
                      {"context_end", r.context_end},
                      {"output_tokens", r.output_tokens},
                      {"wall_s", r.wall_s},
                      {"schedule_us", spread_json(s.schedule_us)},
                      {"plan_us", spread_json(s.plan_us)},
                      {"runner_us", spread_json(s.runner_us)},
                      {"post_us", spread_json(s.post_us)},
                      {"other_us", spread_json(s.other_us)},
                      {"step_us", spread_json(s.step_us)},
                      {"gpu_idle", idle_fraction(s.step_us.median * 1e-6, device_s)}});
    }
    nlohmann::json prepare_rows = nlohmann::json::array();
    for (const PrepareTiming& p : prepares) {
      prepare_rows.push_back({{"batch", p.batch},
                              {"context", p.context},
                              {"calls", p.calls},
                              {"prepare_us", spread_json(p.prepare_us)},
                              {"backend_plan_us", spread_json(p.backend_plan_us)},
                              {"host_part_us", p.prepare_us.median - p.backend_plan_us.median}});
    }
    const nlohmann::json document = {
        {"benchmark", "engine_host"},
        {"date", utc_timestamp()},
        {"machine", machine_description()},
        {"device_step_ms", options.device_step_ms},
        {"other_cores", other_cores},
        {"engine",
         {{"vocab", setup.vocab},
          {"tokenizer", options.tokenizer},
          {"stop", options.stops},
          {"page_size", options.page_size},
          {"max_running", options.max_running},
          {"max_tokens_per_step", options.max_tokens_per_step},
          {"prefix_cache", !options.no_prefix_cache},
          {"model_sampling", !options.host_sampling},
          {"temperature", options.temperature}}},
        {"decode", {{"prompt_len", options.prompt_len}, {"warmup", options.warmup}}},
        {"workload", path.empty() ? nlohmann::json() : nlohmann::json(path.filename().string())},
        {"prepare_shape", kShape},
        {"metadata", metadata},
        {"rows", rows},
        {"prepare", prepare_rows}};
    std::ofstream out(options.json_path);
    PA_CHECK(out.good(), "bench engine-host: --json {}: cannot open for writing",
             options.json_path);
    out << document.dump(2) << '\n';
  }
}

void add_bench_engine_host_command(CLI::App& bench) {
  auto options = std::make_shared<EngineHostOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "engine-host",
      "the engine's host time per step over a null model (no compute): schedule, plan, runner "
      "call, post-processing; the GPU idle it implies; StepPlanner::prepare's host time");
  cmd->add_option("--device-step-ms", options->device_step_ms,
                  "the device time of a decode step the host time is set against")
      ->capture_default_str();
  cmd->add_option("--batches", options->batches, "decode scenarios: batch sizes")
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "decode scenarios: measured steps")
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup,
                  "decode scenarios: steps after all requests decode, before measuring")
      ->capture_default_str();
  cmd->add_option("--prompt-len", options->prompt_len,
                  "decode scenarios: prompt tokens (+ request index % page size)")
      ->capture_default_str();
  cmd->add_option("--scenarios", options->scenarios, "which to run: workload, decode, prepare")
      ->capture_default_str();
  add_workload_options(cmd, &options->workload, &options->selection);
  cmd->add_option("--temperature", options->temperature, "sampling temperature")
      ->capture_default_str();
  cmd->add_option("--vocab", options->vocab,
                  fmt::format("vocabulary of the null runner (0: {}'s)", kShape))
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
                "sample every row on the host from logits the null runner fills (default: the "
                "runner samples, as a GPU model does)");
  cmd->add_option("--tokenizer", options->tokenizer,
                  "a directory with tokenizer.json: every token is detokenized, as a server does "
                  "(the runner then draws ids of its vocabulary)");
  cmd->add_option("--stop", options->stops,
                  "stop strings on every request, matched on the text (needs --tokenizer; one "
                  "that matches ends a request early, which the workload reports as an error)");
  cmd->add_option("--prepare-time", options->prepare_time,
                  "seconds of StepPlanner::prepare calls per batch size")
      ->capture_default_str();
  cmd->add_option("--json", options->json_path, "also write the results as JSON to FILE");
  cmd->add_option("--metadata", options->metadata,
                  "KEY=VALUE recorded in the JSON (e.g. commit=abc1234)");
  cmd->callback([options] { run_bench_engine_host(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("bench engine-host", add_bench_engine_host_command);

}  // namespace pagedattn::tools
