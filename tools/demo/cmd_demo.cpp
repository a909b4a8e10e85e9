// `pagedattn demo`: the serving trace of tools/demo/demo.h from the command line. Prints the report
// table, a progress line while it runs on a terminal, optionally JSON (--json FILE); exits 1 when
// any check failed.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "tools/cli/command.h"
#include "tools/demo/demo.h"

namespace pagedattn::tools {
namespace {

struct DemoCli {
  DemoOptions options;
  std::string layout = "nhd";
  std::string table = "block";
  std::string json_path;
};

nlohmann::json to_json(const DemoCli& cli, const DemoResult& r) {
  const DemoOptions& o = cli.options;
  nlohmann::json page_sizes = nlohmann::json::array();
  for (const PageSizeStats& s : r.per_page_size) {
    page_sizes.push_back({
        {"page_size", s.page_size},
        {"prefill_ms_per_batch",
         r.prefill_batches > 0 ? s.prefill_seconds / r.prefill_batches * 1e3 : 0.0},
        {"prefill_gflops", s.prefill_gflops()},
        {"decode_ms_median", s.median_decode_ms()},
        {"decode_ms_mean", r.decode_batches > 0 ? s.decode_seconds / r.decode_batches * 1e3 : 0.0},
        {"decode_kv_gbps", s.decode_gbps()},
        {"decode_tokens_per_s", s.decode_seconds > 0 ? r.decode_tokens / s.decode_seconds : 0.0},
        {"planner_seconds", s.planner_seconds},
        {"rows_checked", s.checks},
        {"failures", s.failures},
    });
  }
  return {
      {"command", "demo"},
      {"options",
       {{"requests", o.num_requests},
        {"steps", o.decode_steps},
        {"seed", o.seed},
        {"page_sizes", o.page_sizes},
        {"alloc_page_size", o.alloc_page_size},
        {"max_prompt", o.max_prompt},
        {"max_batch", o.max_batch},
        {"layout", cli.layout},
        {"table", cli.table},
        {"num_qo_heads", o.num_qo_heads},
        {"num_kv_heads", o.num_kv_heads},
        {"head_dim", o.head_dim},
        {"kv_dtype", "bf16"}}},
      {"backends", {{"prefill", r.prefill_backend}, {"decode", r.decode_backend}}},
      {"trace",
       {{"steps", r.steps},
        {"prefill_batches", r.prefill_batches},
        {"decode_batches", r.decode_batches},
        {"prefill_tokens", r.prefill_tokens},
        {"decode_tokens", r.decode_tokens},
        {"num_pages", r.num_pages},
        {"peak_pages_used", r.peak_pages_used},
        {"forks", r.forks},
        {"partial_page_copies", r.partial_page_copies},
        {"preemptions", r.preemptions},
        {"queued_admissions", r.queued_admissions},
        {"wall_seconds", r.wall_seconds}}},
      {"page_sizes", page_sizes},
      {"checks", r.checks},
      {"failures", r.failures},
      {"failure_messages", r.failure_messages},
      {"ok", r.ok()},
  };
}

void run(DemoCli& cli) {
  if (cli.layout == "nhd" || cli.layout == "NHD") {
    cli.options.layout = KvLayout::kNHD;
  } else if (cli.layout == "hnd" || cli.layout == "HND") {
    cli.options.layout = KvLayout::kHND;
  } else {
    throw Error(fmt::format("--layout: '{}' is not a layout (expected nhd or hnd)", cli.layout));
  }
  if (cli.table == "block" || cli.table == "slot") {
    cli.options.slot_table = cli.table == "slot";
  } else {
    throw Error(
        fmt::format("--table: '{}' is not a table form (expected block or slot)", cli.table));
  }
  // A progress line on a terminal, redrawn at most ten times a second.
  const bool terminal = isatty(STDERR_FILENO) != 0;
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  if (terminal) {
    cli.options.progress = [&](const DemoProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_draw < std::chrono::milliseconds(100) && p.finished < p.total) return;
      last_draw = now;
      std::fprintf(stderr, "\r\033[Kdemo: step %lld, %d running, %d waiting, %d/%d finished",
                   static_cast<long long>(p.step), p.running, p.waiting, p.finished, p.total);
      std::fflush(stderr);
    };
  }
  const DemoResult result = run_demo(cli.options);
  if (terminal) std::fprintf(stderr, "\r\033[K");
  std::fputs(format_demo_table(result).c_str(), stdout);
  if (!cli.json_path.empty()) {
    std::ofstream file(cli.json_path);
    if (!file) throw Error(fmt::format("--json: cannot write '{}'", cli.json_path));
    file << to_json(cli, result).dump(2) << "\n";
  }
  if (!result.ok()) throw CLI::RuntimeError(1);
}

void add_demo_command(CLI::App& app) {
  auto cli = std::make_shared<DemoCli>();
  DemoOptions& o = cli->options;
  CLI::App* demo = app.add_subcommand(
      "demo",
      "Serve a trace of requests (shared prefixes, prefill, decode, preemption) through the "
      "allocator, planner and backend; check sampled outputs against the float64 reference");
  demo->add_option("--requests", o.num_requests, "Requests in the trace")->capture_default_str();
  demo->add_option("--steps", o.decode_steps,
                   "Decode steps per request (output lengths drawn from [steps/2, steps])")
      ->capture_default_str();
  demo->add_option("--seed", o.seed, "Seed of the trace and of the data")->capture_default_str();
  demo->add_option("--page-size", o.page_sizes,
                   "Attention page sizes to run side by side (each divides --alloc-page-size)")
      ->delimiter(',')
      ->capture_default_str();
  demo->add_option("--alloc-page-size", o.alloc_page_size, "Allocation page size (tokens)")
      ->capture_default_str();
  demo->add_option("--max-prompt", o.max_prompt, "Longest prompt (tokens, before a prefix)")
      ->capture_default_str();
  demo->add_option("--max-batch", o.max_batch, "Running requests at most")->capture_default_str();
  demo->add_option("--num-pages", o.num_pages,
                   "Pool size in allocation pages (0: small enough to queue and preempt)")
      ->capture_default_str();
  demo->add_option("--checks-per-step", o.checks_per_step,
                   "Requests of each batch checked against the reference")
      ->capture_default_str();
  demo->add_option("--layout", cli->layout, "KV layout: nhd or hnd")->capture_default_str();
  demo->add_option("--table", cli->table,
                   "Planner input: block (block tables, vLLM) or slot (token->slot, SGLang)")
      ->capture_default_str();
  demo->add_option("--backend", o.backend,
                   "Backend spec: auto, a name, or prefill=X,decode=Y (default: "
                   "$PAGEDATTN_BACKEND, else auto)");
  demo->add_option("--json", cli->json_path, "Also write the results as JSON to FILE");
  demo->callback([cli] { run(*cli); });
}

PAGEDATTN_CLI_COMMAND("demo", add_demo_command);

}  // namespace

}  // namespace pagedattn::tools
