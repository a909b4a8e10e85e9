// The `pagedattn` command line end to end: `plan` (both table forms give the same metadata, JSON
// and table output, errors exit non-zero naming the bad entry), `info` (backends in priority
// order, the reason CUDA is unusable), `bench plan` on a tiny grid writing JSON, and the help
// listing every registered command.
// The binary is found beside the test's build directory (<build>/pagedattn); when it was not
// built the tests skip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tools/cli_util.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using Cli = testing::CliTest;

TEST_F(Cli, PlanBlockTableAsJson) {
  const CliRun run = run_cli(
      "plan --block-table '3,1;4' --seq-lens 20,5 --alloc-page-size 16 --page-size 4 "
      "--padded-batch 3 --json");
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json doc = nlohmann::json::parse(run.output);
  // Allocation page 3 -> attention pages 12..15 (r = 4), page 1 -> 4..; 20 tokens = 5 pages.
  EXPECT_EQ(doc["kv_indices"], (std::vector<int32_t>{12, 13, 14, 15, 4, 16, 17}));
  EXPECT_EQ(doc["kv_indptr"], (std::vector<int32_t>{0, 5, 7, 7}));
  EXPECT_EQ(doc["kv_last_page_len"], (std::vector<int32_t>{4, 1, 0}));
  EXPECT_EQ(doc["qo_indptr"], (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(doc["batch_size"], 3);
}

TEST_F(Cli, SlotFormGivesTheSameMetadata) {
  std::string slots;
  for (int t = 0; t < 20; ++t) slots += std::to_string((t < 16 ? 3 * 16 : 16) + t % 16) + ",";
  slots += ";";
  for (int t = 0; t < 5; ++t) slots += std::to_string(4 * 16 + t) + ",";
  const CliRun by_slots = run_cli("plan --slots '" + slots +
                                  "' --seq-lens 20,5 --alloc-page-size 16 --page-size 4 --json");
  const CliRun by_blocks = run_cli(
      "plan --block-table '3,1;4' --seq-lens 20,5 --alloc-page-size 16 --page-size 4 --json");
  ASSERT_EQ(by_slots.status, 0) << by_slots.output;
  ASSERT_EQ(by_blocks.status, 0) << by_blocks.output;
  const nlohmann::json a = nlohmann::json::parse(by_slots.output);
  const nlohmann::json b = nlohmann::json::parse(by_blocks.output);
  for (const char* field : {"kv_indices", "kv_indptr", "kv_last_page_len", "qo_indptr"}) {
    EXPECT_EQ(a[field], b[field]) << field;
  }
}

TEST_F(Cli, PlanTableAndSplitKv) {
  const CliRun run = run_cli(
      "plan --block-table '3,1;4' --seq-lens 20,5 --alloc-page-size 16 --page-size 4 "
      "--split-kv-target 4");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("kv_indices"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[12, 13, 14, 15, 4]"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("split-KV: chunk_pages 2"), std::string::npos) << run.output;
}

TEST_F(Cli, PlanFromJsonFile) {
  const fs::path path =
      fs::temp_directory_path() / ("pagedattn_plan_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"block_table": [[2], [0, 1]], "seq_lens": [3, 20], "q_lens": [3, 4],
                             "alloc_page_size": 16, "page_size": 16})";
  const CliRun run = run_cli("plan --input " + path.string() + " --json");
  fs::remove(path);
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json doc = nlohmann::json::parse(run.output);
  EXPECT_EQ(doc["kv_indices"], (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(doc["qo_indptr"], (std::vector<int32_t>{0, 3, 7}));
  EXPECT_EQ(doc["num_alloc_pages"], 3);
}

TEST_F(Cli, PlanErrorsNameTheEntry) {
  CliRun run = run_cli(
      "plan --block-table '3,1;9' --seq-lens 20,5 --alloc-page-size 16 "
      "--num-pages 5");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("block_table[1][0] = 9"), std::string::npos) << run.output;
  run = run_cli("plan --block-table '3,1' --seq-lens 20 --alloc-page-size 16 --page-size 3");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("page_size (P) = 3"), std::string::npos) << run.output;
  run = run_cli("plan --block-table '3,x' --seq-lens 20");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("'x'"), std::string::npos) << run.output;
}

// The commands register themselves (tools/cli/command.h): every one of them, and every `bench`
// subcommand, is in the help, in alphabetical order.
TEST_F(Cli, HelpListsEveryRegisteredCommand) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected = {
      {"--help", {"bench", "demo", "info", "plan", "tokenize"}},
      {"bench --help",
       {"decode", "engine-host", "mla", "plan", "prefill", "throughput", "tokenize"}}};
  for (const auto& [arguments, commands] : expected) {
    const CliRun run = run_cli(arguments);
    ASSERT_EQ(run.status, 0) << arguments << "\n" << run.output;
    const size_t list = run.output.find("Subcommands:");
    ASSERT_NE(list, std::string::npos) << arguments << "\n" << run.output;
    size_t previous = list;
    for (const std::string& command : commands) {
      const size_t at = run.output.find("\n  " + command + " ", list);
      ASSERT_NE(at, std::string::npos) << arguments << ": no " << command << "\n" << run.output;
      EXPECT_GT(at, previous) << arguments << ": " << command << " out of order\n" << run.output;
      previous = at;
    }
  }
}

TEST_F(Cli, InfoListsBackendsInPriorityOrder) {
  const CliRun run = run_cli("info");
  ASSERT_EQ(run.status, 0) << run.output;
  const size_t cuda = run.output.find("  cuda ");
  const size_t cpu = run.output.find("  cpu ", run.output.find("priority order"));
  ASSERT_NE(cuda, std::string::npos) << run.output;
  ASSERT_NE(cpu, std::string::npos) << run.output;
  EXPECT_LT(run.output.find("1  cuda"), run.output.find("2  cpu")) << run.output;
#ifndef PAGEDATTN_WITH_CUDA
  EXPECT_NE(run.output.find("built without CUDA"), std::string::npos) << run.output;
#endif
}

TEST_F(Cli, BenchPlanWritesJson) {
  const fs::path path =
      fs::temp_directory_path() / ("pagedattn_bench_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli(
      "bench plan --batch 2 --kv-len 64 --page-size 1,16 --min-time 0.001 "
      "--json " +
      path.string());
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("memcpy_us"), std::string::npos) << run.output;
  std::ifstream file(path);
  const nlohmann::json doc = nlohmann::json::parse(file);
  fs::remove(path);
  ASSERT_EQ(doc["results"].size(), 4u);  // 2 forms x 2 page sizes
  for (const auto& result : doc["results"]) {
    EXPECT_GT(result["plan_ns"].get<double>(), 0.0);
    EXPECT_GT(result["memcpy_ns"].get<double>(), 0.0);
  }
}

}  // namespace
}  // namespace pagedattn
