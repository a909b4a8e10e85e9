// `pagedattn bench`: the benchmark subcommands. This file holds `bench plan`, the host planner's
// time over a grid of batch x KV length x attention page size, in both table forms, printed
// beside a plain memcpy of the same index bytes measured in the same run (the ceiling).
//
// The memcpy moves max(table bytes read, kv_indices bytes written): the block form writes more
// than it reads (one allocation-page id becomes A/P attention-page ids), the slot form reads
// every token's slot to validate it. Each figure is the median of repeated samples
// (tools/cli/report.h). `bench decode|prefill|mla` live in bench_attention.cpp.
// `bench plan --device cuda` shows the host planner beside the GPU planner on the same tables
// (tools/bench/cuda/bench_cuda_plan.cpp through run_cuda_rows(), bench_cuda_rows.h; default block
// form).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "core/check.h"
#include "pagedattn/error.h"
#include "pagedattn/planner.h"
#include "tools/bench/bench_cuda_rows.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

struct PlanBenchOptions {
  std::vector<int32_t> batches{1, 16, 64, 256, 1024};
  std::vector<int32_t> kv_lens{1024, 8192, 32768};
  std::vector<int32_t> page_sizes{1, 16, 64};
  std::vector<std::string> forms{"block", "slot"};
  int32_t alloc_page_size = 64;
  double min_time = 0.1;
  std::string json_path;
  std::string device = "cpu";
  bool forms_given = false;
  int32_t reps = 0;  // --device cuda: samples per figure
};

// The engine's tables for `batch` requests of `kv_len` tokens, pages shuffled over the pool.
struct BenchTables {
  std::vector<int32_t> seq_lens, table;
  int64_t row_stride = 0;
  int64_t num_alloc_pages = 0;
};

BenchTables make_tables(bool slot_form, int32_t batch, int32_t kv_len, int32_t alloc,
                        std::mt19937_64& rng) {
  BenchTables t;
  const int64_t blocks = (kv_len + alloc - 1) / alloc;
  t.num_alloc_pages = blocks * batch;
  std::vector<int32_t> pool(static_cast<size_t>(t.num_alloc_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  t.seq_lens.assign(static_cast<size_t>(batch), kv_len);
  t.row_stride = slot_form ? kv_len : blocks;
  t.table.resize(static_cast<size_t>(batch * t.row_stride));
  for (int64_t r = 0; r < batch; ++r) {
    int32_t* row = t.table.data() + r * t.row_stride;
    const int32_t* pages = pool.data() + r * blocks;
    if (!slot_form) {
      std::copy(pages, pages + blocks, row);
      continue;
    }
    for (int64_t token = 0; token < kv_len; ++token) {
      row[token] = pages[token / alloc] * alloc + static_cast<int32_t>(token % alloc);
    }
  }
  return t;
}

std::string micros(double ns) { return fmt::format("{:.3f}", ns / 1e3); }

void run_bench_plan(const PlanBenchOptions& options) {
  PA_CHECK(options.device == "cpu" || options.device == "cuda",
           "bench plan: --device '{}', expected cpu or cuda", options.device);
  PA_CHECK(options.alloc_page_size >= 1, "bench plan: --alloc-page-size {}, expected >= 1",
           options.alloc_page_size);
  for (int32_t p : options.page_sizes) {
    PA_CHECK(p >= 1 && options.alloc_page_size % p == 0,
             "bench plan: --page-size {} does not divide --alloc-page-size {}", p,
             options.alloc_page_size);
  }
  for (int32_t batch : options.batches) {
    PA_CHECK(batch >= 1, "bench plan: --batch {}, expected >= 1", batch);
  }
  for (int32_t kv_len : options.kv_lens) {
    PA_CHECK(kv_len >= 1, "bench plan: --kv-len {}, expected >= 1", kv_len);
  }
  for (const std::string& form : options.forms) {
    PA_CHECK(form == "block" || form == "slot", "bench plan: --form '{}', expected block or slot",
             form);
  }
  if (options.device == "cuda") {
    CudaRowsOptions c;
    c.bench = CudaBench::kPlan;
    c.batches = options.batches;
    c.kv_lens = options.kv_lens;
    c.page_sizes = options.page_sizes;
    if (options.forms_given) c.forms = options.forms;
    c.alloc_page_size = options.alloc_page_size;
    c.reps = options.reps;
    c.json_path = options.json_path;
    const CudaRowsStatus status = run_cuda_rows(c);
    if (!status.ran) fmt::print("{}\n", status.note);
    return;
  }
  TimingOptions timing;
  timing.min_total_seconds = options.min_time;
  const int64_t configs = static_cast<int64_t>(options.forms.size() * options.batches.size() *
                                               options.kv_lens.size() * options.page_sizes.size());
  Progress progress(configs, stderr_is_terminal());
  Table table({"form", "batch", "kv_len", "P", "pages", "bytes", "memcpy_us", "plan_us", "ratio",
               "trusted_us", "trusted_ratio"});
  nlohmann::json results = nlohmann::json::array();
  std::mt19937_64 rng(20261202);
  double worst_ratio = 0;
  for (const std::string& form : options.forms) {
    const bool slot_form = form == "slot";
    for (int32_t batch : options.batches) {
      for (int32_t kv_len : options.kv_lens) {
        const BenchTables tables =
            make_tables(slot_form, batch, kv_len, options.alloc_page_size, rng);
        for (int32_t p : options.page_sizes) {
          progress.step(fmt::format("{} B={} kv_len={} P={}", form, batch, kv_len, p));
          PlanInput in;
          if (slot_form) {
            in.table = SlotTableInput{tables.table, tables.row_stride};
          } else {
            in.table = BlockTableInput{tables.table, tables.row_stride};
          }
          in.num_reqs = batch;
          in.seq_lens = tables.seq_lens;
          in.alloc_page_size = options.alloc_page_size;
          in.page_size = p;
          in.num_alloc_pages = tables.num_alloc_pages;
          const int64_t pages = int64_t{batch} * ((kv_len + p - 1) / p);
          PlanStorage storage(batch, pages);
          const PlanBuffers buffers = storage.buffers();

          const int64_t bytes = static_cast<int64_t>(sizeof(int32_t)) *
                                std::max<int64_t>(pages, static_cast<int64_t>(tables.table.size()));
          std::vector<char> source(static_cast<size_t>(bytes), 1),
              target(static_cast<size_t>(bytes));
          PlanInput trusted = in;
          trusted.validate = false;
          const std::vector<double> medians =
              interleaved_medians_ns({[&] {
                                        std::memcpy(target.data(), source.data(), target.size());
                                        keep(target.data());
                                      },
                                      [&] {
                                        plan(in, buffers);
                                        keep(buffers.kv_indices.data());
                                      },
                                      [&] {
                                        plan(trusted, buffers);
                                        keep(buffers.kv_indices.data());
                                      }},
                                     timing);
          const double memcpy_ns = medians[0], plan_ns = medians[1], trusted_ns = medians[2];
          const double ratio = plan_ns / memcpy_ns;
          worst_ratio = std::max(worst_ratio, ratio);
          table.add_row({form, std::to_string(batch), std::to_string(kv_len), std::to_string(p),
                         std::to_string(pages), std::to_string(bytes), micros(memcpy_ns),
                         micros(plan_ns), fmt::format("{:.2f}", ratio), micros(trusted_ns),
                         fmt::format("{:.2f}", trusted_ns / memcpy_ns)});
          results.push_back({{"form", form},
                             {"batch", batch},
                             {"kv_len", kv_len},
                             {"page_size", p},
                             {"alloc_page_size", options.alloc_page_size},
                             {"pages", pages},
                             {"memcpy_bytes", bytes},
                             {"memcpy_ns", memcpy_ns},
                             {"plan_ns", plan_ns},
                             {"plan_trusted_ns", trusted_ns},
                             {"ratio", ratio},
                             {"trusted_ratio", trusted_ns / memcpy_ns}});
        }
      }
    }
  }
  fmt::print(
      "bench plan: host planner vs memcpy of the same index bytes (medians; "
      "alloc_page_size {}, decode batches, shuffled pages)\n{}\n{}",
      options.alloc_page_size, machine_description(), table.str());
  fmt::print("worst ratio plan / memcpy: {:.2f}\n", worst_ratio);
  if (!options.json_path.empty()) {
    const nlohmann::json document = {{"benchmark", "plan"},
                                     {"date", utc_timestamp()},
                                     {"machine", machine_description()},
                                     {"results", results}};
    std::ofstream out(options.json_path);
    PA_CHECK(out.good(), "bench plan: --json {}: cannot open for writing", options.json_path);
    out << document.dump(2) << '\n';
  }
}

void add_bench_plan_command(CLI::App& bench) {
  auto options = std::make_shared<PlanBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "plan", "Host planner time vs a memcpy of the same index bytes, over a grid");
  cmd->add_option("--batch", options->batches, "Batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--kv-len", options->kv_lens, "KV lengths (tokens per request)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--page-size", options->page_sizes, "Attention page sizes P")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--alloc-page-size", options->alloc_page_size,
                  "Allocation page size A (every P must divide it)")
      ->capture_default_str();
  cmd->add_option("--form", options->forms, "Table forms: block, slot")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--min-time", options->min_time, "Seconds of samples per measurement")
      ->capture_default_str();
  cmd->add_flag_callback(
      "--quick",
      [options] {
        options->batches = {1, 64};
        options->kv_lens = {1024};
        options->min_time = 0.02;
      },
      "A small grid (B 1,64; kv_len 1k; short timing)");
  cmd->add_option("--json", options->json_path, "Also write the results as JSON to FILE");
  cmd->add_option("--device", options->device,
                  "cpu (host planner vs memcpy) or cuda (host planner vs GPU planner; default "
                  "form block)")
      ->capture_default_str();
  cmd->add_option("--reps", options->reps, "--device cuda: samples per figure (default 10)");
  cmd->callback([options, cmd] {
    options->forms_given = cmd->count("--form") > 0;
    run_bench_plan(*options);
  });
}

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (medians, ratios to a ceiling)");
  bench->require_subcommand(1);
}

// `bench decode|prefill|mla` register themselves in bench_attention.cpp.
PAGEDATTN_CLI_COMMAND("bench", add_bench_command);
PAGEDATTN_CLI_COMMAND("bench plan", add_bench_plan_command);

}  // namespace

}  // namespace pagedattn::tools
