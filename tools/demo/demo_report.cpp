// The demo's report: a summary of the trace, then one aligned table with a column per attention
// page size (the same batches, measured side by side in one run), then the checks.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tools/demo/demo.h"

namespace pagedattn::tools {

std::string format_demo_table(const DemoResult& result) {
  std::string text;
  text += fmt::format("pagedattn demo: {}\n", result.description);
  text += fmt::format("backends: prefill {}, decode {}\n", result.prefill_backend,
                      result.decode_backend);
  text += fmt::format(
      "trace: {} requests, {} steps ({} prefill and {} decode batches), {} prefill rows, {} "
      "decode tokens\n",
      result.requests, result.steps, result.prefill_batches, result.decode_batches,
      result.prefill_tokens, result.decode_tokens);
  text += fmt::format(
      "pages: pool {}, peak {} in use; {} forks of a shared prefix ({} partial-page copies), {} "
      "preemptions, {} steps with admissions queued for pages\n\n",
      result.num_pages, result.peak_pages_used, result.forks, result.partial_page_copies,
      result.preemptions, result.queued_admissions);

  struct Row {
    std::string label;
    std::vector<std::string> cells;
  };
  std::vector<Row> rows = {
      {"prefill time / batch (ms)", {}},       {"prefill attention (GFLOP/s)", {}},
      {"decode time / step, median (ms)", {}}, {"decode time / step, mean (ms)", {}},
      {"decode KV read (GB/s)", {}},           {"decode tokens / s", {}},
      {"planner time / batch (us)", {}},       {"rows checked (failed)", {}},
  };
  std::vector<std::string> header;
  const double batches = static_cast<double>(result.prefill_batches + result.decode_batches);
  for (const PageSizeStats& s : result.per_page_size) {
    header.push_back(fmt::format("P={}", s.page_size));
    const double prefill_ms =
        result.prefill_batches > 0 ? s.prefill_seconds / result.prefill_batches * 1e3 : 0;
    const double mean_ms =
        result.decode_batches > 0 ? s.decode_seconds / result.decode_batches * 1e3 : 0;
    const double tokens_per_s = s.decode_seconds > 0 ? result.decode_tokens / s.decode_seconds : 0;
    rows[0].cells.push_back(fmt::format("{:.3f}", prefill_ms));
    rows[1].cells.push_back(fmt::format("{:.1f}", s.prefill_gflops()));
    rows[2].cells.push_back(fmt::format("{:.3f}", s.median_decode_ms()));
    rows[3].cells.push_back(fmt::format("{:.3f}", mean_ms));
    rows[4].cells.push_back(fmt::format("{:.2f}", s.decode_gbps()));
    rows[5].cells.push_back(fmt::format("{:.0f}", tokens_per_s));
    rows[6].cells.push_back(
        fmt::format("{:.1f}", batches > 0 ? s.planner_seconds / batches * 1e6 : 0));
    rows[7].cells.push_back(fmt::format("{} ({})", s.checks, s.failures));
  }
  size_t label_width = 0, cell_width = 8;
  for (const Row& row : rows) {
    label_width = std::max(label_width, row.label.size());
    for (const std::string& cell : row.cells) cell_width = std::max(cell_width, cell.size());
  }
  text += fmt::format("{:<{}}", "", label_width);
  for (const std::string& h : header) text += fmt::format("  {:>{}}", h, cell_width);
  text += "\n";
  for (const Row& row : rows) {
    text += fmt::format("{:<{}}", row.label, label_width);
    for (const std::string& cell : row.cells) text += fmt::format("  {:>{}}", cell, cell_width);
    text += "\n";
  }
  text += fmt::format(
      "\nchecks: {} run, {} failed (sampled rows against the float64 reference, "
      "every row equal across page sizes, padding rows, allocator consistency, no leaked "
      "page); {:.2f} s wall\n",
      result.checks, result.failures, result.wall_seconds);
  for (const std::string& message : result.failure_messages) {
    text += fmt::format("  FAILED: {}\n", message);
  }
  text += result.ok() ? "OK\n" : "FAILED\n";
  return text;
}

}  // namespace pagedattn::tools
