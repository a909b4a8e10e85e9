// `pagedattn bench throughput` and its parts (tools/bench/throughput/).
//  - The workload: the committed file read as the benchmark reads it gives the requests nano-vllm
//    runs: every length equal to the file's arrays (read here with nlohmann/json, independently),
//    the totals equal to their sums and to the 142,827 / 133,966 tokens nano-vllm's description
//    states; token ids in [0, 10000]; the same seed the same prompts; caps and --requests select
//    what they say; malformed files and bad selections are errors that name the problem.
//  - The roofline: Qwen3-0.6B's and DeepSeek-V2-Lite's per-step bytes and FLOPs against the
//    counts written out by hand from their published shapes, on made-up steps.
//  - `bench model`: each row's bytes and FLOPs are the roofline's for the step built here, and
//    its figures follow from its time and the run's ceilings; bad flags are named.
//  - The command, end to end through the binary on the tiny shape with a few requests: exit 0,
//    the table, and the JSON's token counts equal to the file's (capped) lengths; bad flags name
//    the flag and the value.
#ifdef PAGEDATTN_TEST_THROUGHPUT

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagedattn/error.h"
#include "pagedattn/model_random.h"
#include "tools/bench/throughput/roofline.h"
#include "tools/bench/throughput/step_record.h"
#include "tools/bench/throughput/workload.h"
#include "tools/cli_util.h"

namespace pagedattn::tools {
namespace {

namespace fs = std::filesystem;
using pagedattn::testing::CliRun;
using pagedattn::testing::run_cli;

const fs::path kWorkload = fs::path(__FILE__).parent_path().parent_path().parent_path() / "bench" /
                           "workloads" / "nano-vllm-offline.json";

const fs::path kEmbeddedModel =
    fs::path(__FILE__).parent_path().parent_path().parent_path() / "models" / "austen-3m";

nlohmann::json workload_json() {
  std::ifstream in(kWorkload);
  return nlohmann::json::parse(in);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(ThroughputWorkload, ReplaysTheFileExactly) {
  const nlohmann::json file = workload_json();
  const auto input = file["input_lens"].get<std::vector<int64_t>>();
  const auto output = file["output_lens"].get<std::vector<int64_t>>();
  ASSERT_EQ(input.size(), 256u);
  ASSERT_EQ(output.size(), 256u);
  int64_t input_sum = 0, output_sum = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    input_sum += input[i];
    output_sum += output[i];
  }
  // nano-vllm's workload as its description states it.
  EXPECT_EQ(input_sum, 142827);
  EXPECT_EQ(output_sum, 133966);

  const Workload workload = load_workload(kWorkload);
  const WorkloadRequests requests = select_requests(workload, {});
  ASSERT_EQ(requests.prompts.size(), 256u);
  EXPECT_EQ(requests.prompt_tokens, input_sum);
  EXPECT_EQ(requests.output_tokens, output_sum);
  for (size_t i = 0; i < input.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(requests.prompts[i].size()), input[i]) << "request " << i;
    EXPECT_EQ(requests.output_lens[i], output[i]) << "request " << i;
    for (int32_t id : requests.prompts[i]) ASSERT_TRUE(id >= 0 && id <= 10000) << id;
  }
  // Token ids cover the range (random, not a constant): min 0..small, max near 10000.
  int32_t low = 10000, high = 0;
  for (const auto& prompt : requests.prompts) {
    low = std::min(low, *std::min_element(prompt.begin(), prompt.end()));
    high = std::max(high, *std::max_element(prompt.begin(), prompt.end()));
  }
  EXPECT_LE(low, 5);
  EXPECT_GE(high, 9995);
  EXPECT_EQ(select_requests(workload, {}).prompts, requests.prompts);  // same seed, same prompts
  WorkloadSelection other_seed;
  other_seed.seed = 1;
  EXPECT_NE(select_requests(workload, other_seed).prompts[0], requests.prompts[0]);
}

TEST(ThroughputWorkload, SelectionAndCaps) {
  const nlohmann::json file = workload_json();
  const Workload workload = load_workload(kWorkload);
  const WorkloadRequests all = select_requests(workload, {});
  WorkloadSelection selection;
  selection.requests = 10;
  selection.max_input_len = 300;
  selection.max_output_len = 200;
  const WorkloadRequests some = select_requests(workload, selection);
  ASSERT_EQ(some.prompts.size(), 10u);
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (size_t i = 0; i < 10; ++i) {
    const int64_t in = std::min<int64_t>(file["input_lens"][i].get<int64_t>(), 300);
    const int64_t out = std::min<int64_t>(file["output_lens"][i].get<int64_t>(), 200);
    ASSERT_EQ(static_cast<int64_t>(some.prompts[i].size()), in);
    EXPECT_EQ(some.output_lens[i], out);
    // A cut prompt is the start of the uncut one.
    EXPECT_TRUE(std::equal(some.prompts[i].begin(), some.prompts[i].end(), all.prompts[i].begin()));
    prompt_tokens += in;
    output_tokens += out;
  }
  EXPECT_EQ(some.prompt_tokens, prompt_tokens);
  EXPECT_EQ(some.output_tokens, output_tokens);
}

TEST(ThroughputWorkload, BadFilesAndSelectionsAreNamed) {
  const Workload workload = load_workload(kWorkload);
  WorkloadSelection s;
  s.requests = 300;
  EXPECT_NE(error_of([&] { select_requests(workload, s); }).find("--requests 300"),
            std::string::npos);
  s = {};
  s.requests = -1;
  EXPECT_NE(error_of([&] { select_requests(workload, s); }).find("--requests -1"),
            std::string::npos);
  s = {};
  s.max_output_len = -2;
  EXPECT_NE(error_of([&] { select_requests(workload, s); }).find("--max-output-len -2"),
            std::string::npos);
  s = {};
  s.max_input_len = -3;
  EXPECT_NE(error_of([&] { select_requests(workload, s); }).find("--max-input-len -3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_workload("{", "w.json"); }).find("w.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_workload(R"({"input_lens": [1, 2], "output_lens": [3]})", "w");
            }).find("2 input_lens but 1 output_lens"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_workload(R"({"input_lens": [1, 0], "output_lens": [3, 4]})", "w");
            }).find("input_lens[1] is 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_workload(R"({"output_lens": [3]})", "w");
            }).find("\"input_lens\" is missing"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_workload(R"({"input_lens": [], "output_lens": []})", "w");
            }).find("no requests"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_workload("/nonexistent/w.json"); }).find("/nonexistent/w.json"),
            std::string::npos);
}

// A step: decodes at the given positions (one token each, cached = position), then prefill chunks
// (cached, new), each wanting logits or not.
engine::StepPlan make_plan(const std::vector<int64_t>& decode_positions,
                           const std::vector<std::tuple<int64_t, int64_t, bool>>& chunks) {
  engine::StepPlan plan;
  plan.page_size = 16;
  for (int64_t position : decode_positions) {
    engine::ScheduledSequence s;
    s.token_ids = {1};
    s.first_position = position;
    s.num_logit_rows = 1;
    plan.sequences.push_back(s);
    ++plan.num_decodes;
    plan.num_tokens += 1;
    plan.num_logit_rows += 1;
  }
  for (const auto& [cached, fresh, logits] : chunks) {
    engine::ScheduledSequence s;
    s.token_ids.assign(static_cast<size_t>(fresh), 1);
    s.first_position = cached;
    s.num_logit_rows = logits ? 1 : 0;
    plan.sequences.push_back(s);
    plan.num_tokens += fresh;
    plan.num_logit_rows += s.num_logit_rows;
  }
  return plan;
}

TEST(ThroughputRoofline, Qwen3StepCountedByHand) {
  const model::ModelConfig config = model::model_shape("qwen3-0.6b");
  // Per layer, from the published shape: q 2048x1024, k 1024x1024, v 1024x1024, o 1024x2048,
  // gate / up 3072x1024, down 1024x3072; norms: 2 x 1024 + q_norm, k_norm 128 each.
  const double matrices = 2048.0 * 1024 + 2 * 1024.0 * 1024 + 1024.0 * 2048 + 3 * 3072.0 * 1024;
  const double norms = 2 * 1024.0 + 2 * 128.0;
  const double layer_params = 28 * (matrices + norms);
  const double head_params = 151936.0 * 1024 + 1024;  // tied embedding (the lm_head) + final norm
  EXPECT_DOUBLE_EQ(parameter_count(config), layer_params + head_params);
  const ModelCost cost = model_cost(config, 2.0, DType::kBF16);
  EXPECT_DOUBLE_EQ(cost.layer_weight_bytes, 2 * layer_params);
  EXPECT_DOUBLE_EQ(cost.head_bytes, 2 * head_params);
  EXPECT_DOUBLE_EQ(cost.kv_bytes_per_token, 28 * 2 * 8 * 128 * 2.0);
  EXPECT_DOUBLE_EQ(cost.flops_per_token, 2 * 28 * matrices);
  EXPECT_DOUBLE_EQ(cost.attention_flops_per_key, 2 * 16 * (128 + 128) * 28.0);

  // Two decodes at positions 99 and 9 (contexts 100 and 10), a 30-token chunk over 50 cached
  // tokens that wants logits and a 20-token first chunk that does not.
  const StepShape shape = shape_of(make_plan({99, 9}, {{50, 30, true}, {0, 20, false}}));
  EXPECT_EQ(shape.tokens, 52);
  EXPECT_EQ(shape.sequences, 4);
  EXPECT_EQ(shape.decodes, 2);
  EXPECT_EQ(shape.logit_rows, 3);
  EXPECT_EQ(shape.context_tokens, 100 + 10 + 80 + 20);
  // Keys: 100 + 10 for the decodes; the chunk's token i sees 51 + i keys; the first chunk 1 + i.
  double keys = 110;
  for (int i = 0; i < 30; ++i) keys += 51 + i;
  for (int i = 0; i < 20; ++i) keys += 1 + i;
  EXPECT_DOUBLE_EQ(shape.attention_keys, keys);
  const StepCost step = step_cost(cost, shape);
  const double kv = 28 * 2 * 8 * 128 * 2.0;
  EXPECT_DOUBLE_EQ(step.bytes,
                   2 * layer_params + 52 * 1024 * 2.0 + 2 * head_params + 210 * kv + 52 * kv);
  EXPECT_DOUBLE_EQ(step.flops,
                   52 * 2 * 28 * matrices + 3 * 2 * 151936.0 * 1024 + keys * 2 * 16 * 256 * 28.0);
  // No logits row: no lm_head.
  const StepCost chunk = step_cost(cost, shape_of(make_plan({}, {{0, 20, false}})));
  EXPECT_DOUBLE_EQ(chunk.bytes, 2 * layer_params + 20 * 1024 * 2.0 + 20 * kv + 20 * kv);
}

TEST(ThroughputRoofline, DeepseekV2LiteExpertsTouched) {
  const model::ModelConfig config = model::model_shape("deepseek-v2-lite");
  const ModelCost cost = model_cost(config, 2.0, DType::kBF16);
  const double expert = 3 * 1408.0 * 2048;  // gate, up, down of one routed expert
  EXPECT_EQ(cost.moe_layers, 26);
  EXPECT_EQ(cost.experts, 64);
  EXPECT_EQ(cost.experts_per_token, 6);
  EXPECT_DOUBLE_EQ(cost.expert_bytes, 2 * expert);
  EXPECT_DOUBLE_EQ(cost.kv_bytes_per_token, 27 * 576 * 2.0);
  EXPECT_DOUBLE_EQ(cost.attention_flops_per_key, 2 * 16 * (576 + 512) * 27.0);
  // Per token: attention (q 3072x2048, kv_a 576x2048, kv_b 4096x512, o 2048x2048) in every layer,
  // layer 0's dense MLP (3 x 10944 x 2048), and in the 26 MoE layers the router (64 x 2048), the
  // shared experts (3 x 2816 x 2048) and 6 routed experts.
  const double attention = 3072.0 * 2048 + 576.0 * 2048 + 4096.0 * 512 + 2048.0 * 2048;
  const double per_token =
      27 * attention + 3 * 10944.0 * 2048 + 26 * (64.0 * 2048 + 3 * 2816.0 * 2048 + 6 * expert);
  EXPECT_DOUBLE_EQ(cost.flops_per_token, 2 * per_token);
  // One decode token touches 6 experts per MoE layer; a huge step all 64.
  const StepCost one = step_cost(cost, shape_of(make_plan({0}, {})));
  const StepCost none = step_cost(cost, shape_of(make_plan({}, {{0, 1, false}})));
  EXPECT_NEAR(one.bytes - none.bytes, cost.head_bytes, 1.0);  // only the lm_head differs
  const double dense_part = none.bytes - 1 * 2048 * 2.0 - 2 * 27 * 576 * 2.0;
  EXPECT_NEAR(dense_part - cost.layer_weight_bytes, 6 * 26 * 2 * expert, 1e-3 * expert);
  const StepCost big = step_cost(cost, shape_of(make_plan({}, {{0, 4096, false}})));
  const double big_experts =
      big.bytes - cost.layer_weight_bytes - 4096 * 2048 * 2.0 - 2 * 4096 * 27 * 576 * 2.0;
  EXPECT_NEAR(big_experts, 64 * 26 * 2 * expert, 1e-6 * big_experts);
}

TEST(ThroughputRoofline, TotalIsTheSumOfEachStepsFloor) {
  const ModelCost cost = model_cost(model::model_shape("qwen3-0.6b"), 2.0, DType::kBF16);
  // A decode step of 4 short sequences (memory-bound at any sane ratio) and a 2048-token prefill
  // (compute-bound), against 100 GB/s and 1 TFLOP/s.
  const std::vector<StepShape> steps = {shape_of(make_plan({10, 20, 30, 40}, {})),
                                        shape_of(make_plan({}, {{0, 2048, true}}))};
  const RooflineTotal total = roofline_total(cost, steps, 100e9, 1e12);
  const StepCost decode = step_cost(cost, steps[0]), prefill = step_cost(cost, steps[1]);
  ASSERT_GT(decode.bytes / 100e9, decode.flops / 1e12);
  ASSERT_LT(prefill.bytes / 100e9, prefill.flops / 1e12);
  EXPECT_EQ(total.memory_bound_steps, 1);
  EXPECT_DOUBLE_EQ(total.memory_s, decode.bytes / 100e9);
  EXPECT_DOUBLE_EQ(total.compute_s, prefill.flops / 1e12);
  EXPECT_DOUBLE_EQ(total.seconds, decode.bytes / 100e9 + prefill.flops / 1e12);
}

// gpu_idle on made-up records, against the sums written out here: a prefill step (no previous
// device end), then decodes with known gaps and spans, one mixed step in the middle (it and the
// decode right after it are not steady decode), and a CPU-like record without timing.
TEST(ThroughputGpuIdle, GapsAndSteadyDecodeFromTheRecords) {
  const StepShape prefill = shape_of(make_plan({}, {{0, 64, true}}));
  const StepShape decode = shape_of(make_plan({10, 20}, {}));
  const StepShape mixed = shape_of(make_plan({10}, {{0, 8, true}}));
  ASSERT_TRUE(decode.decode_only());
  ASSERT_FALSE(mixed.decode_only());
  const auto record = [](StepShape shape, double span, double gap) {
    StepRecord r;
    r.shape = shape;
    r.device_span_s = span;
    r.device_gap_s = gap;
    return r;
  };
  const std::vector<StepRecord> steps = {
      record(prefill, 0.010, -1),     // first: no gap known
      record(decode, 0.004, 0.001),   // after a prefill: not steady
      record(decode, 0.004, 0.0005),  // steady
      record(decode, 0.003, 0.0015),  // steady
      record(mixed, 0.006, 0.002),    // mixed
      record(decode, 0.004, 0.001),   // after a mixed step: not steady
      record(decode, 0.002, 0.002),   // steady
  };
  std::vector<StepRecord> with_graphs = steps;
  with_graphs[2].graph = with_graphs[3].graph = true;
  const double wall = 0.1;
  const GpuIdle idle = gpu_idle(with_graphs, wall);
  EXPECT_EQ(idle.graph_steps, 2);
  EXPECT_EQ(idle.decode_steps, 5);
  EXPECT_DOUBLE_EQ(idle.between_steps, (0.001 + 0.0005 + 0.0015 + 0.002 + 0.001 + 0.002) / wall);
  EXPECT_EQ(idle.steady_decode_steps, 3);
  EXPECT_DOUBLE_EQ(idle.steady_decode,
                   (0.0005 + 0.0015 + 0.002) / (0.0045 + 0.0045 + 0.004));
  EXPECT_DOUBLE_EQ(idle.steady_decode_gap_ms, 1.5);  // median of 0.5, 1.5, 2 ms

  // No device timing (the CPU): all zero.
  std::vector<StepRecord> cpu(3);
  for (StepRecord& r : cpu) r.shape = decode;
  const GpuIdle none = gpu_idle(cpu, 1.0);
  EXPECT_EQ(none.between_steps, 0.0);
  EXPECT_EQ(none.steady_decode, 0.0);
  EXPECT_EQ(none.steady_decode_steps, 0);
}

using Cli = pagedattn::testing::CliTest;

TEST_F(Cli, BenchThroughputRunsTheTinyShape) {
  const fs::path json =
      fs::temp_directory_path() / ("pagedattn_throughput_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli(
      "bench throughput --shape tiny --requests 3 --max-input-len 40 --max-output-len 6 "
      "--ceiling-time 0.05 --ceiling-mib 256 --threads 1 --metadata commit=abc1234 --json " +
      json.string());
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* text : {"output tok/s", "roofline tok/s", "host ms/step", "forward ms/step",
                           "memory read ceiling", "GEMM ceiling", "roofline: sum over"}) {
    EXPECT_NE(run.output.find(text), std::string::npos) << text << "\n" << run.output;
  }
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove(json);
  const nlohmann::json file = workload_json();
  int64_t prompt = 0, output = 0;
  for (int i = 0; i < 3; ++i) {
    prompt += std::min<int64_t>(file["input_lens"][i].get<int64_t>(), 40);
    output += std::min<int64_t>(file["output_lens"][i].get<int64_t>(), 6);
  }
  EXPECT_EQ(doc["benchmark"], "throughput");
  EXPECT_EQ(doc["metadata"]["commit"], "abc1234");
  ASSERT_EQ(doc["rows"].size(), 1u);
  const nlohmann::json& row = doc["rows"][0];
  EXPECT_EQ(row["model"], "tiny");
  EXPECT_EQ(row["requests"], 3);
  EXPECT_EQ(row["prompt_tokens"].get<int64_t>(), prompt);
  EXPECT_EQ(row["output_tokens"].get<int64_t>(), output);
  // At least one step per output token of the longest request (each decode step adds one).
  EXPECT_GE(row["steps"].get<int64_t>(), 6);
  EXPECT_GT(row["output_tok_s"].get<double>(), 0.0);
  EXPECT_GT(row["roofline_output_tok_s"].get<double>(), 0.0);
  EXPECT_NEAR(row["ratio"].get<double>(),
              row["output_tok_s"].get<double>() / row["roofline_output_tok_s"].get<double>(), 1e-9);
  EXPECT_GT(doc["ceilings"]["read_gbs"].get<double>(), 0.0);
  EXPECT_GT(doc["ceilings"]["gemm_gflops"].get<double>(), 0.0);
  // The table's row carries the same counts.
  EXPECT_NE(run.output.find(" " + std::to_string(prompt) + " "), std::string::npos) << run.output;
}

// A model with fewer ids than nano-vllm's prompts use runs with --max-token-id (the embedded
// model, as bench-serve-run's offline half runs it), and the JSON says which range was drawn.
TEST_F(Cli, BenchThroughputDrawsPromptIdsUpToMaxTokenId) {
  const fs::path json = fs::temp_directory_path() /
                        ("pagedattn_throughput_ids_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli("bench throughput --model " + kEmbeddedModel.string() +
                             " --max-token-id 4095 --requests 2 --max-input-len 16 "
                             "--max-output-len 3 --ceiling-time 0.05 --ceiling-mib 256 "
                             "--threads 1 --json " +
                             json.string());
  ASSERT_EQ(run.status, 0) << run.output;
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove(json);
  EXPECT_EQ(doc["workload"]["max_token_id"], 4095);
  EXPECT_EQ(doc["rows"][0]["requests"], 2);
  EXPECT_EQ(doc["rows"][0]["output_tokens"], 6);
}

// `bench model` end to end on the tiny shape: one prefill row and two decode rows; each row's
// bytes and FLOPs equal the roofline's cost of the same step built here, and its derived figures
// (tok/s, x floor, share of the GEMM ceiling) follow from its own time and the run's ceilings.
TEST_F(Cli, BenchModelRowsFollowTheirSteps) {
  const fs::path json =
      fs::temp_directory_path() / ("pagedattn_bench_model_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli(
      "bench model --shape tiny --device cpu --prefill 2x16 --batch 1 3 --context 40 --reps 1 "
      "--warmup 0 --ceiling-time 0.05 --ceiling-mib 256 --threads 1 --json " +
      json.string());
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* text : {"prefill 2 x 16", "decode 1 x 40", "decode 3 x 40", "x floor",
                           "GEMM ceiling"}) {
    EXPECT_NE(run.output.find(text), std::string::npos) << text << "\n" << run.output;
  }
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove(json);
  EXPECT_EQ(doc["benchmark"], "model");
  EXPECT_EQ(doc["device"], "cpu");
  ASSERT_EQ(doc["rows"].size(), 3u);
  const ModelCost cost = model_cost(model::model_shape("tiny"), 2.0, DType::kBF16);
  const std::vector<StepShape> shapes = {shape_of(make_plan({}, {{0, 16, true}, {0, 16, true}})),
                                         shape_of(make_plan({39}, {})),
                                         shape_of(make_plan({39, 39, 39}, {}))};
  const double read = doc["ceilings"]["read_gbs"].get<double>() * 1e9;
  const double gemm = doc["ceilings"]["gemm_gflops"].get<double>() * 1e9;
  ASSERT_GT(read, 0.0);
  ASSERT_GT(gemm, 0.0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const nlohmann::json& row = doc["rows"][i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["kind"], i == 0 ? "prefill" : "decode");
    EXPECT_EQ(row["tokens"].get<int64_t>(), shapes[i].tokens);
    const StepCost expected = step_cost(cost, shapes[i]);
    EXPECT_NEAR(row["bytes"].get<double>(), expected.bytes, 1e-9 * expected.bytes);
    EXPECT_NEAR(row["flops"].get<double>(), expected.flops, 1e-9 * expected.flops);
    const double seconds = row["ms_median"].get<double>() / 1e3;
    ASSERT_GT(seconds, 0.0);
    const double floor = std::max(expected.bytes / read, expected.flops / gemm);
    EXPECT_NEAR(row["floor_ms"].get<double>(), floor * 1e3, 1e-6 * floor * 1e3);
    EXPECT_NEAR(row["x_floor"].get<double>(), seconds / floor, 1e-6 * seconds / floor);
    EXPECT_NEAR(row["tok_s"].get<double>(), shapes[i].tokens / seconds,
                1e-6 * shapes[i].tokens / seconds);
    EXPECT_NEAR(row["of_gemm_ceiling"].get<double>(), expected.flops / seconds / gemm,
                1e-6 * expected.flops / seconds / gemm);
    EXPECT_EQ(row["memory_bound"].get<bool>(), expected.bytes / read >= expected.flops / gemm);
  }
}

TEST_F(Cli, BenchModelNamesBadFlags) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench model", "--model DIR or --shape NAME"},
      {"bench model --shape tiny --device cpu --prefill 3", "--prefill 3"},
      {"bench model --shape tiny --device cpu --prefill 0x5", "--prefill 0x5"},
      {"bench model --shape tiny --device cpu --prefill 2x3y", "--prefill 2x3y"},
      {"bench model --shape tiny --device cpu --batch 0", "--batch 0"},
      {"bench model --shape tiny --device cpu --context 0", "--context 0"},
      {"bench model --shape tiny --device cpu --kv-dtype int4", "--kv-dtype int4"},
      {"bench model --shape tiny --device cpu --batch 1 --context 5000", "--context 5000"},
      {"bench model --shape tiny --device nope", "nope"},
  };
  for (const auto& [arguments, expected] : cases) {
    const CliRun run = run_cli(arguments);
    EXPECT_NE(run.status, 0) << arguments;
    EXPECT_NE(run.output.find(expected), std::string::npos)
        << arguments << ": expected '" << expected << "' in\n"
        << run.output;
  }
}

TEST_F(Cli, BenchThroughputNamesBadFlags) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench throughput", "--model DIR or --shape NAME"},
      {"bench throughput --shape nope", "'nope'"},
      {"bench throughput --shape tiny --requests 300", "--requests 300"},
      {"bench throughput --shape tiny --max-output-len -1", "--max-output-len -1"},
      {"bench throughput --shape tiny --kv-dtype int4", "--kv-dtype int4"},
      {"bench throughput --shape tiny --page-size 0", "--page-size 0"},
      {"bench throughput --shape tiny --metadata commit", "--metadata commit"},
      {"bench throughput --shape tiny --workload /nonexistent/w.json", "/nonexistent/w.json"},
      {"bench throughput --model /nonexistent/model", "/nonexistent/model"},
      {"bench throughput --model /x --shape tiny", "excludes"},
      {"bench throughput --shape tiny --max-token-id -1", "--max-token-id -1"},
      // The embedded model has 4,096 ids, fewer than nano-vllm's 10,001: the error says which
      // --max-token-id fits.
      {"bench throughput --requests 1 --model " + kEmbeddedModel.string(), "--max-token-id 4095"},
  };
  for (const auto& [arguments, expected] : cases) {
    const CliRun run = run_cli(arguments);
    EXPECT_NE(run.status, 0) << arguments;
    EXPECT_NE(run.output.find(expected), std::string::npos)
        << arguments << ": expected '" << expected << "' in\n"
        << run.output;
  }
}

}  // namespace
}  // namespace pagedattn::tools

#endif  // PAGEDATTN_TEST_THROUGHPUT
