// `pagedattn bench serve --url URL [--rate R] [--requests N] ...`: the serving benchmark
// (include/pagedattn/server_bench.h) against any OpenAI-compatible server: Poisson arrivals at
// rate R or all at once; throughput, TTFT, TPOT, ITL and end-to-end latency at p50 / p90 / p99.
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "core/check.h"
#include "pagedattn/server_bench.h"
#include "tools/cli/command.h"

namespace pagedattn::tools {
namespace {

struct BenchServeCommand {
  server::BenchServeOptions options;
  std::string json_path;
};

void add_bench_serve_command(CLI::App& bench) {
  auto command = std::make_shared<BenchServeCommand>();
  server::BenchServeOptions& options = command->options;
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Replay streaming requests against an OpenAI-compatible server");
  cmd->add_option("--url", options.url, "Server base URL (scheme://host:port)")
      ->capture_default_str();
  cmd->add_option("--model", options.model, "Model name (default: the first of /v1/models)");
  cmd->add_option("--endpoint", options.endpoint, "completions or chat")->capture_default_str();
  cmd->add_option("--requests", options.num_requests, "Number of requests")->capture_default_str();
  cmd->add_option("--rate", options.rate, "Poisson arrival rate in requests/s (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--input-len", options.input_len, "Prompt length in words")
      ->capture_default_str();
  cmd->add_option("--output-len", options.output_len, "Output tokens per request (ignore_eos)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", options.max_concurrency,
                  "Requests in flight at most (0: unbounded)")
      ->capture_default_str();
  cmd->add_option("--seed", options.seed, "Seed of the arrivals and prompts")
      ->capture_default_str();
  cmd->add_option("--json", command->json_path, "Also write the results as JSON to FILE");
  cmd->callback([command] {
    const server::BenchServeResult result = server::run_bench_serve(command->options);
    fmt::print("{}", server::format_bench_serve(command->options, result));
    if (!command->json_path.empty()) {
      std::ofstream out(command->json_path);
      PA_CHECK(out.good(), "bench serve: --json {}: cannot open for writing", command->json_path);
      out << server::bench_serve_json(command->options, result) << '\n';
    }
    PA_CHECK(result.num_completed > 0, "bench serve: every request failed (first: {})",
             result.errors.empty() ? std::string("?") : result.errors.front());
  });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("bench serve", add_bench_serve_command);

}  // namespace pagedattn::tools
