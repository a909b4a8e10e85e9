// `pagedattn plan`: builds the planner's metadata for a table given on the command line or in a
// JSON file and prints it, as an aligned table (one row per request) or as JSON.
//
//   pagedattn plan --block-table "3,1;4" --seq-lens 20,5 --alloc-page-size 16 --page-size 4
//   pagedattn plan --slots "32,33,34;0,1" --seq-lens 3,2 --alloc-page-size 16 --page-size 16
//   pagedattn plan --input batch.json --json
// Rows are separated by ';' and entries by ','; rows may differ in length (the table is padded
// with -1, which the planner never reads). The JSON input has the same fields as the options:
//   {"block_table": [[3, 1], [4]], "seq_lens": [20, 5], "q_lens": [4, 1],
//    "alloc_page_size": 16, "page_size": 4, "num_alloc_pages": 8, "padded_batch": 4}
// (or "slots" instead of "block_table"). With --split-kv-target N the split-KV partition is
// printed as well.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "pagedattn/planner.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

struct PlanCommandOptions {
  std::string block_table, slots, input_path;
  std::vector<int32_t> seq_lens, q_lens;
  int32_t alloc_page_size = 16;
  int32_t page_size = 0;        // 0: alloc_page_size
  int64_t num_alloc_pages = 0;  // 0: derived from the largest id in the table
  int32_t padded_batch = 0;
  int32_t split_kv_target = 0;
  bool json = false;
  bool no_validate = false;
};

using Rows = std::vector<std::vector<int32_t>>;

Rows parse_rows(const std::string& text, std::string_view what) {
  Rows rows;
  std::stringstream all(text);
  for (std::string row_text; std::getline(all, row_text, ';');) {
    std::vector<int32_t> row;
    std::stringstream row_stream(row_text);
    for (std::string item; std::getline(row_stream, item, ',');) {
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (item.empty()) continue;
      size_t used = 0;
      long long value = 0;
      try {
        value = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PA_CHECK(used == item.size() && value >= INT32_MIN && value <= INT32_MAX,
               "{}: '{}' in row {} is not an int32 (expected rows 'a,b,c;d,e')", what, item,
               rows.size());
      row.push_back(static_cast<int32_t>(value));
    }
    rows.push_back(std::move(row));
  }
  if (!text.empty() && text.back() == ';') rows.emplace_back();
  return rows;
}

// Reads the JSON input into the options (command-line values are replaced).
void load_json(PlanCommandOptions& o, Rows& rows, bool& slot_form) {
  std::ifstream file(o.input_path);
  PA_CHECK(file.good(), "plan: --input {}: cannot open", o.input_path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(file);
    PA_CHECK(doc.contains("block_table") != doc.contains("slots"),
             "plan: --input {}: expected exactly one of \"block_table\" and \"slots\"",
             o.input_path);
    slot_form = doc.contains("slots");
    rows = doc.at(slot_form ? "slots" : "block_table").get<Rows>();
    o.seq_lens = doc.at("seq_lens").get<std::vector<int32_t>>();
    o.q_lens = doc.value("q_lens", std::vector<int32_t>{});
    o.alloc_page_size = doc.value("alloc_page_size", o.alloc_page_size);
    o.page_size = doc.value("page_size", o.page_size);
    o.num_alloc_pages = doc.value("num_alloc_pages", o.num_alloc_pages);
    o.padded_batch = doc.value("padded_batch", o.padded_batch);
  } catch (const nlohmann::json::exception& error) {
    PA_FAIL("plan: --input {}: {}", o.input_path, error.what());
  }
}

void run_plan(PlanCommandOptions o) {
  Rows rows;
  bool slot_form = false;
  if (!o.input_path.empty()) {
    load_json(o, rows, slot_form);
  } else {
    PA_CHECK(o.block_table.empty() != o.slots.empty(),
             "plan: give exactly one of --block-table, --slots or --input");
    slot_form = !o.slots.empty();
    rows = parse_rows(slot_form ? o.slots : o.block_table, slot_form ? "--slots" : "--block-table");
  }
  if (o.page_size == 0) o.page_size = o.alloc_page_size;
  const int32_t num_reqs = static_cast<int32_t>(o.seq_lens.size());
  PA_CHECK(static_cast<int32_t>(rows.size()) == num_reqs,
           "plan: the table has {} rows but --seq-lens gives {} requests", rows.size(), num_reqs);
  size_t stride = 0;
  int64_t largest = -1;
  for (const auto& row : rows) {
    stride = std::max(stride, row.size());
    for (int32_t id : row) largest = std::max<int64_t>(largest, id);
  }
  std::vector<int32_t> table(rows.size() * stride, -1);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), table.begin() + r * stride);
  if (o.num_alloc_pages == 0 && o.alloc_page_size > 0) {
    o.num_alloc_pages = slot_form ? largest / o.alloc_page_size + 1 : largest + 1;
  }

  PlanInput in;
  if (slot_form) {
    in.table = SlotTableInput{table, static_cast<int64_t>(stride)};
  } else {
    in.table = BlockTableInput{table, static_cast<int64_t>(stride)};
  }
  in.num_reqs = num_reqs;
  in.seq_lens = o.seq_lens;
  in.q_lens = o.q_lens;
  in.alloc_page_size = o.alloc_page_size;
  in.page_size = o.page_size;
  in.num_alloc_pages = o.num_alloc_pages;
  in.padded_batch = o.padded_batch;
  in.validate = !o.no_validate;
  int64_t max_pages = 0;
  for (int32_t len : o.seq_lens) max_pages += std::max(0, len) / std::max(1, o.page_size) + 1;
  PlanStorage storage(std::max(num_reqs, o.padded_batch), max_pages);
  const PlanSummary summary = plan(in, storage.buffers());
  const int32_t batch = summary.batch_size;

  // Optional split-KV partition.
  SplitKvSummary split;
  std::vector<int32_t> work_request, work_chunk, merge;
  if (o.split_kv_target > 0) {
    const SplitKvConfig config{true, o.split_kv_target, 1};
    const int64_t capacity = split_kv_capacity(batch, summary.num_pages, config);
    work_request.resize(capacity);
    work_chunk.resize(capacity);
    merge.resize(batch + 1);
    split = split_kv_partition(storage.kv_indptr, batch, config, {work_request, work_chunk, merge});
  }

  auto indices_of = [&](int32_t r) {
    return std::vector<int32_t>(storage.kv_indices.begin() + storage.kv_indptr[r],
                                storage.kv_indices.begin() + storage.kv_indptr[r + 1]);
  };
  if (o.json) {
    nlohmann::json doc = {
        {"form", slot_form ? "slots" : "block_table"},
        {"alloc_page_size", o.alloc_page_size},
        {"page_size", o.page_size},
        {"num_alloc_pages", o.num_alloc_pages},
        {"batch_size", batch},
        {"num_reqs", num_reqs},
        {"num_pages", summary.num_pages},
        {"num_qo_rows", summary.num_qo_rows},
        {"max_q_len", summary.max_q_len},
        {"max_kv_len", summary.max_kv_len},
        {"qo_indptr",
         std::vector<int32_t>(storage.qo_indptr.begin(), storage.qo_indptr.begin() + batch + 1)},
        {"kv_indptr",
         std::vector<int32_t>(storage.kv_indptr.begin(), storage.kv_indptr.begin() + batch + 1)},
        {"kv_indices", std::vector<int32_t>(storage.kv_indices.begin(),
                                            storage.kv_indices.begin() + summary.num_pages)},
        {"kv_last_page_len", std::vector<int32_t>(storage.kv_last_page_len.begin(),
                                                  storage.kv_last_page_len.begin() + batch)},
        {"kv_lens",
         std::vector<int32_t>(storage.kv_lens.begin(), storage.kv_lens.begin() + batch)}};
    if (o.split_kv_target > 0) {
      doc["split_kv"] = {
          {"chunk_pages", split.chunk_pages},
          {"num_items", split.num_items},
          {"work_request",
           std::vector<int32_t>(work_request.begin(), work_request.begin() + split.num_items)},
          {"work_chunk",
           std::vector<int32_t>(work_chunk.begin(), work_chunk.begin() + split.num_items)},
          {"merge_indptr", merge}};
    }
    fmt::print("{}\n", doc.dump(2));
    return;
  }
  Table out({"req", "seq_len", "q_rows", "qo_indptr", "kv_indptr", "pages", "last_page_len",
             "kv_len", "kv_indices"});
  for (int32_t r = 0; r < batch; ++r) {
    const int32_t pages = storage.kv_indptr[r + 1] - storage.kv_indptr[r];
    out.add_row({r < num_reqs ? std::to_string(r) : fmt::format("{} (pad)", r),
                 std::to_string(r < num_reqs ? o.seq_lens[r] : 0),
                 std::to_string(storage.qo_indptr[r + 1] - storage.qo_indptr[r]),
                 std::to_string(storage.qo_indptr[r]), std::to_string(storage.kv_indptr[r]),
                 std::to_string(pages), std::to_string(storage.kv_last_page_len[r]),
                 std::to_string(storage.kv_lens[r]),
                 fmt::format("[{}]", fmt::join(indices_of(r), ", "))});
  }
  fmt::print(
      "plan: {} form, alloc_page_size {}, page_size {}, {} allocation pages; batch {} "
      "({} requests), {} attention pages, {} query rows\n{}",
      slot_form ? "slot" : "block-table", o.alloc_page_size, o.page_size, o.num_alloc_pages, batch,
      num_reqs, summary.num_pages, summary.num_qo_rows, out.str());
  if (o.split_kv_target > 0) {
    Table items({"item", "request", "chunk", "pages"});
    for (int32_t w = 0; w < split.num_items; ++w) {
      const int32_t r = work_request[w];
      const int32_t pages = storage.kv_indptr[r + 1] - storage.kv_indptr[r];
      const int32_t begin = work_chunk[w] * split.chunk_pages;
      const int32_t end = std::min(pages, begin + split.chunk_pages);
      items.add_row({std::to_string(w), std::to_string(r), std::to_string(work_chunk[w]),
                     begin < end ? fmt::format("[{}, {})", begin, end) : "none"});
    }
    fmt::print("\nsplit-KV: chunk_pages {}, {} items (target {})\n{}", split.chunk_pages,
               split.num_items, o.split_kv_target, items.str());
  }
}

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommandOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "Build and print the planner's metadata for a table");
  cmd->add_option("--block-table", o->block_table, "Block table rows, e.g. \"3,1;4\"");
  cmd->add_option("--slots", o->slots, "Token->slot table rows, e.g. \"32,33;0\"");
  cmd->add_option("--input", o->input_path, "A JSON file with the batch (see --help-all)");
  cmd->add_option("--seq-lens", o->seq_lens, "KV length of each request")->delimiter(',');
  cmd->add_option("--q-lens", o->q_lens, "New tokens of each request (prefill/extend)")
      ->delimiter(',');
  cmd->add_option("--alloc-page-size", o->alloc_page_size, "Allocation page size A")
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "Attention page size P (default: A)");
  cmd->add_option("--num-pages", o->num_alloc_pages,
                  "Allocation pages in the pool (default: largest id + 1)");
  cmd->add_option("--padded-batch", o->padded_batch, "Pad the batch to this many requests");
  cmd->add_option("--split-kv-target", o->split_kv_target,
                  "Also print the split-KV partition for this many target items");
  cmd->add_flag("--json", o->json, "Print JSON instead of a table");
  cmd->add_flag("--no-validate", o->no_validate, "Skip the input checks (trusted hot path)");
  cmd->callback([o] { run_plan(*o); });
}

PAGEDATTN_CLI_COMMAND("plan", add_plan_command);

}  // namespace

}  // namespace pagedattn::tools
