// `pagedattn bench decode|prefill|mla|plan --device cuda` end to end, on tiny rows. Where no CUDA
// device is usable (CI: "driver insufficient"; or a build without CUDA) each must say
// "no usable CUDA device: <why>" and exit with 0; on a GPU each must run its rows and write JSON
// with finite results. Option errors (bad rows, shapes the rows do not take) must exit non-zero
// naming the bad value, before any device is touched, so they are checked everywhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/gpu_skip.h"
#include "tools/cli_util.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using CliCuda = testing::CliTest;

struct CudaBenchCase {
  const char* name;
  const char* arguments;  // without --json
  size_t rows;            // rows in the JSON document on a GPU
};

class CliBenchCuda : public testing::CliTest,
                     public ::testing::WithParamInterface<CudaBenchCase> {};

TEST_P(CliBenchCuda, RunsOrSaysWhyNot) {
  const CudaBenchCase& c = GetParam();
  const fs::path path = fs::temp_directory_path() /
                        (std::string("pagedattn_cuda_") + c.name + std::to_string(::getpid()));
  const CliRun run = run_cli(std::string(c.arguments) + " --json " + path.string());
  ASSERT_EQ(run.status, 0) << run.output;
  if (run.output.find("no usable CUDA device: ") != std::string::npos) {
    EXPECT_FALSE(fs::exists(path)) << "no JSON without a device";
    fs::remove(path);
    PA_SKIP_OR_FAIL_WITHOUT_GPU("said why: " + run.output);
  }
  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << run.output;
  const nlohmann::json doc = nlohmann::json::parse(file);
  fs::remove(path);
  EXPECT_GT(doc["ceilings"]["read_gbs"].get<double>(), 0.0);
  ASSERT_EQ(doc["rows"].size(), c.rows) << doc.dump(1);
  bool seen_extend = false;  // bench prefill: no prefill row after an extend row
  for (const auto& row : doc["rows"]) {
    if (row.contains("median_us")) {
      EXPECT_GT(row["median_us"].get<double>(), 0.0);
    }
    if (row.contains("lse_not_finite")) {
      EXPECT_EQ(row["lse_not_finite"].get<int64_t>(), 0);
    }
    // bench prefill: extend rows (BxQ/L, Q < L) come after the others, in a section of their own.
    if (row.contains("section")) {
      const bool extend = row["row"] == "2x16/64";
      EXPECT_EQ(row["section"], extend ? "extend" : "prefill") << row.dump();
      EXPECT_TRUE(extend || !seen_extend) << doc.dump(1);
      seen_extend |= extend;
    }
    if (row.contains("indices_equal")) {
      EXPECT_TRUE(row["indices_equal"].get<bool>());
    }
    if (row.contains("gpu_us")) {
      EXPECT_GT(row["gpu_us"].get<double>(), 0.0);
    }
  }
  // bench prefill with a shape of its own (--qo-heads / --kv-heads / --head-dim): the JSON says it,
  // and no row has a target (the belong to its shape).
  if (std::string(c.name) == "prefill_shape") {
    EXPECT_EQ(doc["shape"]["num_qo_heads"], 16) << doc["shape"].dump();
    EXPECT_EQ(doc["shape"]["num_kv_heads"], 8) << doc["shape"].dump();
    EXPECT_EQ(doc["shape"]["head_dim"], 64) << doc["shape"].dump();
    for (const auto& row : doc["rows"]) EXPECT_EQ(row["target_tflops"].get<double>(), 0.0);
  }
  // bench mla: the wgmma rates (an empty list off sm_90a); no sequence beats the tensor cores'
  // dense rate by more than the clock reading's slack.
  if (doc.contains("wgmma_rates")) {
    for (const auto& rate : doc["wgmma_rates"]) {
      EXPECT_GT(rate["cycles"].get<double>(), 0.9 * rate["ideal_cycles"].get<double>())
          << rate.dump();
    }
  }
  // bench mla: clusters of 2, 4, 8 (an empty list where the H <= 16 kernel cannot run); at least
  // one of each fits.
  if (doc.contains("cluster_occupancy")) {
    for (const auto& entry : doc["cluster_occupancy"]) {
      EXPECT_GE(entry["max_active_clusters"].get<int>(), 1) << entry.dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, CliBenchCuda,
    ::testing::Values(CudaBenchCase{"decode",
                                    "bench decode --device cuda --rows 2x64 --page-size 16,1 "
                                    "--reps 1 --no-graphs",
                                    2},
                      CudaBenchCase{"decode_dirty_l2",
                                    "bench decode --device cuda --rows 2x64 --page-size 16 "
                                    "--reps 1 --no-graphs --l2-flush dirty",
                                    1},
                      CudaBenchCase{"prefill",
                                    "bench prefill --device cuda --rows 2x16/64,1x64,ragged2/64 "
                                    "--page-size 16 --reps 1",
                                    3},
                      CudaBenchCase{"prefill_shape",
                                    "bench prefill --device cuda --rows 1x8192,1x64 --qo-heads 16 "
                                    "--kv-heads 8 --head-dim 64 --page-size 16 --reps 1",
                                    2},
                      CudaBenchCase{"mla",
                                    "bench mla --device cuda --rows 2x64 --qo-heads 16,128 "
                                    "--page-size 64,1 --reps 1",
                                    4},
                      CudaBenchCase{"mla_batch_kv_len",
                                    "bench mla --device cuda --batch 1,2 --kv-len 64 "
                                    "--qo-heads 16 --page-size 1 --reps 1",
                                    2},
                      CudaBenchCase{"plan",
                                    "bench plan --device cuda --batch 2 --kv-len 64,128 "
                                    "--page-size 1,16 --form block,slot --reps 1",
                                    8}),
    [](const ::testing::TestParamInfo<CudaBenchCase>& info) { return info.param.name; });

// The host-generated case on the device (--host-data), MLA included.
TEST_F(CliCuda, HostDataMlaRunsOrSaysWhyNot) {
  const CliRun run = run_cli(
      "bench mla --device cuda --host-data --batch 1 --kv-len 64 --qo-heads 16 --min-time 0.001");
  ASSERT_EQ(run.status, 0) << run.output;
  if (run.output.find("no usable CUDA device: ") != std::string::npos) {
    PA_SKIP_OR_FAIL_WITHOUT_GPU("said why: " + run.output);
  }
  EXPECT_NE(run.output.find("mla_decode"), std::string::npos) << run.output;
}

TEST_F(CliCuda, OptionErrorsNameTheValue) {
  struct Bad {
    const char* arguments;
    const char* expected;
  };
  for (const Bad& bad : {
           Bad{"bench decode --device cuda --rows 4y8", "'4y8'"},
           Bad{"bench decode --device cuda --rows 2x0", "'2x0'"},
           Bad{"bench mla --device cuda --rows ragged2/64", "mla_decode rows are BxL"},
           Bad{"bench decode --device cuda --rows 2x64/32", "'2x64/32'"},
           Bad{"bench mla --device cuda --qo-heads 256", "--qo-heads 256"},
           Bad{"bench decode --device cuda --head-dim 64", "--host-data"},
           Bad{"bench prefill --device cuda --qo-heads 30 --kv-heads 8", "--qo-heads 30"},
           Bad{"bench prefill --device cuda --head-dim 96", "--head-dim 96"},
           Bad{"bench prefill --device cuda --head-dim 128 --head-dim-vo 64", "--head-dim-vo 64"},
           Bad{"bench prefill --device cuda --qo-heads 16,32", "one --qo-heads"},
           Bad{"bench prefill --device cuda --kv-dtype f16", "--host-data"},
           Bad{"bench decode --device cuda --kv-dtype fp8_e4m3", "--host-data"},
           Bad{"bench plan --device cuda --page-size 3", "--page-size 3"},
           Bad{"bench plan --device gpu", "--device 'gpu'"},
           Bad{"bench decode --device cuda --l2-flush bogus", "bogus"},
       }) {
    const CliRun run = run_cli(bad.arguments);
    EXPECT_NE(run.status, 0) << bad.arguments << "\n" << run.output;
    EXPECT_NE(run.output.find(bad.expected), std::string::npos) << bad.arguments << "\n"
                                                                << run.output;
  }
}

}  // namespace
}  // namespace pagedattn
