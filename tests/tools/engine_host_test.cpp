// `pagedattn bench engine-host` and its parts (tools/bench/engine_host/).
//  - The null runner: a sampled row's token is floor(sampling_uniform(seed, choice, position) *
//    vocab) stepped past the avoided tokens, whatever else is in the step; its logits rows are 0
//    but for the peak; rows it samples are left unwritten; through the Engine, a request's output
//    is exactly that sequence of draws (position = output index), batched or alone.
//  - The summaries: medians, 90th percentiles and means on hand-made steps, the phases as the
//    differences of two stats snapshots, the idle fraction.
//  - The command end to end through the binary with a few short scenarios: exit 0, both tables,
//    and a JSON whose counts follow from the flags; with the embedded model's tokenizer and a
//    stop string; bad flags name the flag and the value.
#ifdef PAGEDATTN_TEST_THROUGHPUT

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/sampling.h"
#include "tools/bench/engine_host/host_steps.h"
#include "tools/bench/engine_host/null_runner.h"
#include "tools/cli_util.h"

namespace pagedattn::tools {
namespace {

namespace fs = std::filesystem;
using pagedattn::testing::CliRun;
using pagedattn::testing::run_cli;

const fs::path kWorkload = fs::path(__FILE__).parent_path().parent_path().parent_path() / "bench" /
                           "workloads" / "nano-vllm-offline.json";

// The draw written out from its definition: floor(u * vocab), then the next token not avoided.
int32_t expected_token(uint64_t seed, uint64_t choice, uint64_t position, int32_t vocab,
                       const std::vector<int32_t>& avoid) {
  const double u = ops::sampling_uniform(seed, choice, position);
  auto token = static_cast<int32_t>(std::floor(u * vocab));
  while (std::find(avoid.begin(), avoid.end(), token) != avoid.end()) token = (token + 1) % vocab;
  return token;
}

engine::ScheduledSequence sequence(int64_t id, int64_t first_position, int64_t new_tokens,
                                   int32_t logit_rows) {
  engine::ScheduledSequence s;
  s.sequence = id;
  s.token_ids.assign(static_cast<size_t>(new_tokens), 1);
  s.first_position = first_position;
  s.block_table.assign(static_cast<size_t>((first_position + new_tokens + 15) / 16), 0);
  s.num_logit_rows = logit_rows;
  return s;
}

// Two decodes, a prompt chunk without logits and a prompt-scoring chunk of 3 rows: 5 logit rows.
engine::StepPlan mixed_plan() {
  engine::StepPlan plan;
  plan.page_size = 16;
  plan.sequences = {sequence(4, 30, 1, 1), sequence(9, 7, 1, 1), sequence(2, 0, 20, 0),
                    sequence(5, 10, 3, 3)};
  plan.num_decodes = 2;
  plan.num_tokens = 25;
  plan.num_logit_rows = 5;
  return plan;
}

TEST(NullRunner, DrawsAreAFunctionOfTheRowAndSkipAvoidedTokens) {
  const int32_t vocab = 50;
  const std::vector<int32_t> avoid = {3, 4, 17};
  NullRunner runner(vocab, avoid);
  EXPECT_TRUE(runner.prefers_model_sampling());
  EXPECT_EQ(runner.vocab_size(), vocab);
  int32_t hits_avoided_slot = 0;
  for (uint64_t seed : {0ull, 7ull, 123456789ull}) {
    for (uint64_t choice = 0; choice < 3; ++choice) {
      for (uint64_t position = 0; position < 200; ++position) {
        const int32_t token = runner.sampled_token(seed, choice, position);
        ASSERT_EQ(token, expected_token(seed, choice, position, vocab, avoid));
        ASSERT_TRUE(std::find(avoid.begin(), avoid.end(), token) == avoid.end()) << token;
        const auto raw =
            static_cast<int32_t>(std::floor(ops::sampling_uniform(seed, choice, position) * vocab));
        hits_avoided_slot += raw != token ? 1 : 0;
      }
    }
  }
  EXPECT_GT(hits_avoided_slot, 0);  // the avoidance was exercised

  // Only one token left: every draw and every peak is it.
  NullRunner narrow(4, {0, 1, 2});
  for (uint64_t position = 0; position < 20; ++position) {
    EXPECT_EQ(narrow.sampled_token(1, 0, position), 3);
    EXPECT_EQ(narrow.peak_token(5, static_cast<int64_t>(position)), 3);
  }
}

TEST(NullRunner, ForwardSampledDrawsMarkedRowsAndFillsTheOthers) {
  const int32_t vocab = 64;
  NullRunner runner(vocab, {0});
  const engine::StepPlan plan = mixed_plan();
  std::vector<ops::RowSampling> sampling(5);
  sampling[0].sample = true;  // the first decode
  sampling[0].seed = 11;
  sampling[0].choice = 1;
  sampling[0].position = 6;
  sampling[4].sample = true;  // the scoring chunk's last row
  sampling[4].seed = 12;
  std::vector<float> logits(5 * vocab, std::numeric_limits<float>::quiet_NaN());
  std::vector<ops::SampledToken> sampled(5, ops::SampledToken{99, 1.0f});
  runner.forward_sampled(plan, sampling, logits, sampled);

  EXPECT_EQ(sampled[0].token, expected_token(11, 1, 6, vocab, {0}));
  EXPECT_FLOAT_EQ(sampled[0].logprob, -std::log(64.0f));
  EXPECT_EQ(sampled[4].token, expected_token(12, 0, 0, vocab, {0}));
  for (size_t r : {1u, 2u, 3u}) EXPECT_EQ(sampled[r].token, -1) << r;
  // Rows 1-3 in plan order: sequence 9 at position 7, sequence 5 at positions 10 and 11.
  const std::vector<std::pair<int64_t, int64_t>> rows = {{9, 7}, {5, 10}, {5, 11}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = i + 1;
    const int32_t peak = runner.peak_token(rows[i].first, rows[i].second);
    EXPECT_NE(peak, 0);
    for (int32_t v = 0; v < vocab; ++v) {
      ASSERT_EQ(logits[r * vocab + static_cast<size_t>(v)], v == peak ? 8.0f : 0.0f)
          << "row " << r << " token " << v;
    }
  }
  for (size_t r : {0u, 4u}) {
    for (int32_t v = 0; v < vocab; ++v) {
      ASSERT_TRUE(std::isnan(logits[r * vocab + static_cast<size_t>(v)])) << "row " << r;
    }
  }
  EXPECT_EQ(runner.rows_sampled(), 2);
  EXPECT_EQ(runner.rows_with_logits(), 3);
  EXPECT_EQ(runner.calls(), 1);
  EXPECT_EQ(runner.last_sequences(), 4);
  EXPECT_EQ(runner.last_decodes(), 2);

  // forward(): every row.
  runner.forward(plan, logits);
  EXPECT_EQ(runner.rows_with_logits(), 8);
  const int32_t first = runner.peak_token(4, 30);
  EXPECT_EQ(logits[static_cast<size_t>(first)], 8.0f);
  EXPECT_EQ(std::count(logits.begin(), logits.end(), 8.0f), 5);
  EXPECT_EQ(std::count(logits.begin(), logits.end(), 0.0f), 5 * (vocab - 1));
}

TEST(NullRunner, RejectsBadConstruction) {
  EXPECT_THROW(NullRunner(1, {}), Error);
  EXPECT_THROW(NullRunner(8, {8}), Error);
  EXPECT_THROW(NullRunner(2, {0, 1}), Error);
}

// Through the engine: each request's tokens are the runner's draws at output positions 0, 1, ...
// of its seed and choice, whether it runs alone or beside others (and with n = 2, per choice).
TEST(NullRunner, EngineOutputsAreTheDrawsOfEachRequest) {
  const int32_t vocab = 1000;
  const std::vector<int32_t> eos = {7};
  NullRunner runner(vocab, eos);
  engine::EngineConfig config;
  config.num_pages = 64;
  config.page_size = 4;
  config.max_tokens_per_step = 16;
  config.eos_token_ids = eos;
  engine::Engine engine(config, runner);
  std::vector<engine::Engine::Handle> handles;
  std::vector<engine::SamplingParams> params(3);
  for (size_t r = 0; r < params.size(); ++r) {
    params[r].seed = 100 + r;
    params[r].max_tokens = 5 + static_cast<int32_t>(r) * 3;
    params[r].temperature = 0.6;
  }
  params[2].n = 2;
  for (size_t r = 0; r < params.size(); ++r) {
    handles.push_back(engine.add_request(std::vector<int32_t>(6 + r * 5, 3), params[r]));
  }
  while (engine.has_work()) engine.step();
  engine.check_consistency();
  for (size_t r = 0; r < params.size(); ++r) {
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(params[r].n));
    int32_t finished = 0;
    while (auto event = handles[r].stream->try_pop()) {
      auto& out = tokens[static_cast<size_t>(event->index)];
      out.insert(out.end(), event->token_ids.begin(), event->token_ids.end());
      if (event->finished()) {
        EXPECT_EQ(event->finish_reason, engine::FinishReason::kLength);
        ++finished;
      }
    }
    EXPECT_EQ(finished, params[r].n);
    for (int32_t choice = 0; choice < params[r].n; ++choice) {
      const auto& out = tokens[static_cast<size_t>(choice)];
      ASSERT_EQ(static_cast<int32_t>(out.size()), *params[r].max_tokens);
      for (size_t k = 0; k < out.size(); ++k) {
        EXPECT_EQ(out[k],
                  expected_token(*params[r].seed, static_cast<uint64_t>(choice), k, vocab, eos))
            << "request " << r << " choice " << choice << " token " << k;
      }
    }
  }
  EXPECT_GT(runner.rows_sampled(), 0);
  EXPECT_EQ(runner.rows_with_logits(), 0);
}

TEST(EngineHostSummary, SpreadMedianP90Mean) {
  const Spread odd = spread({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(odd.median, 3);
  EXPECT_DOUBLE_EQ(odd.p90, 5);  // ceil(4.5) = 5th smallest
  EXPECT_DOUBLE_EQ(odd.mean, 3);
  std::vector<double> twenty;
  for (int i = 20; i >= 1; --i) twenty.push_back(i);
  const Spread even = spread(twenty);
  EXPECT_DOUBLE_EQ(even.median, 10.5);
  EXPECT_DOUBLE_EQ(even.p90, 18);  // ceil(18) = 18th smallest
  EXPECT_DOUBLE_EQ(even.mean, 10.5);
  const Spread one = spread({7});
  EXPECT_DOUBLE_EQ(one.median, 7);
  EXPECT_DOUBLE_EQ(one.p90, 7);
  const Spread none = spread({});
  EXPECT_EQ(none.median, 0);
  EXPECT_EQ(none.p90, 0);
  EXPECT_EQ(none.mean, 0);
}

TEST(EngineHostSummary, StepsFromStatsAndTheirSummary) {
  engine::EngineStats before, after;
  before.schedule_seconds = 1.0;
  before.plan_seconds = 2.0;
  before.forward_seconds = 3.0;
  before.sample_seconds = 4.0;
  before.num_computed_tokens = 100;
  after = before;
  after.schedule_seconds += 10e-6;
  after.plan_seconds += 5e-6;
  after.forward_seconds += 2e-6;
  after.sample_seconds += 20e-6;
  after.num_computed_tokens += 16;
  const HostStep step = host_step_between(before, after, 40e-6);
  EXPECT_NEAR(step.schedule_s, 10e-6, 1e-12);
  EXPECT_NEAR(step.plan_s, 5e-6, 1e-12);
  EXPECT_NEAR(step.runner_s, 2e-6, 1e-12);
  EXPECT_NEAR(step.post_s, 20e-6, 1e-12);
  EXPECT_NEAR(step.other_s(), 3e-6, 1e-12);
  EXPECT_EQ(step.tokens, 16);

  // Steps of 10, 20, 30 us (phases in proportion), the last one with a prefill chunk.
  std::vector<HostStep> steps(3);
  for (size_t i = 0; i < steps.size(); ++i) {
    const double unit = static_cast<double>(i + 1) * 1e-6;
    steps[i] = HostStep{1 * unit, 2 * unit, 3 * unit, 4 * unit, 10 * unit, 8, 8, 8};
  }
  steps[2].decodes = 7;
  const HostSummary summary = summarize(steps);
  EXPECT_EQ(summary.steps, 3);
  EXPECT_EQ(summary.decode_steps, 2);
  EXPECT_DOUBLE_EQ(summary.median_sequences, 8);
  EXPECT_NEAR(summary.schedule_us.median, 2, 1e-9);
  EXPECT_NEAR(summary.plan_us.median, 4, 1e-9);
  EXPECT_NEAR(summary.runner_us.median, 6, 1e-9);
  EXPECT_NEAR(summary.post_us.median, 8, 1e-9);
  EXPECT_NEAR(summary.step_us.median, 20, 1e-9);
  EXPECT_NEAR(summary.step_us.p90, 30, 1e-9);
  EXPECT_NEAR(summary.step_us.mean, 20, 1e-9);
  EXPECT_NEAR(summary.other_us.median, 0, 1e-9);

  EXPECT_DOUBLE_EQ(idle_fraction(1e-3, 4e-3), 0.2);
  EXPECT_DOUBLE_EQ(idle_fraction(0, 4e-3), 0.0);
}

using Cli = pagedattn::testing::CliTest;

TEST_F(Cli, BenchEngineHostRunsItsScenarios) {
  const fs::path json =
      fs::temp_directory_path() / ("pagedattn_engine_host_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli(
      "bench engine-host --requests 4 --max-input-len 40 --max-output-len 8 --batches 1 3 "
      "--steps 5 --warmup 2 --prompt-len 8 --prepare-time 0.01 --device-step-ms 2 "
      "--metadata commit=abc1234 --json " +
      json.string());
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* text : {"schedule us", "plan us", "runner us", "post us", "step us",
                           "GPU idle %", "nano-vllm first 4 of 256", "decode B=1", "decode B=3",
                           "StepPlanner::prepare", "CPU backend plan us"}) {
    EXPECT_NE(run.output.find(text), std::string::npos) << text << "\n" << run.output;
  }
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove(json);
  EXPECT_EQ(doc["benchmark"], "engine_host");
  EXPECT_EQ(doc["metadata"]["commit"], "abc1234");
  EXPECT_EQ(doc["device_step_ms"].get<double>(), 2.0);
  ASSERT_EQ(doc["rows"].size(), 3u);

  std::ifstream workload_in(kWorkload);
  const nlohmann::json file = nlohmann::json::parse(workload_in);
  int64_t output = 0, longest = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t length = std::min<int64_t>(file["output_lens"][i].get<int64_t>(), 8);
    output += length;
    longest = std::max(longest, length);
  }
  const nlohmann::json& workload = doc["rows"][0];
  EXPECT_EQ(workload["kind"], "workload");
  EXPECT_EQ(workload["batch"], 4);
  EXPECT_EQ(workload["output_tokens"].get<int64_t>(), output);
  // At least one step per token of the longest output; each step decodes or prefills.
  EXPECT_GE(workload["steps"].get<int64_t>(), longest);

  for (size_t i = 1; i < 3; ++i) {
    const nlohmann::json& row = doc["rows"][i];
    SCOPED_TRACE(row.dump());
    const int64_t batch = i == 1 ? 1 : 3;
    EXPECT_EQ(row["kind"], "decode");
    EXPECT_EQ(row["batch"].get<int64_t>(), batch);
    EXPECT_EQ(row["steps"].get<int64_t>(), 5);
    EXPECT_EQ(row["decode_steps"].get<int64_t>(), 5);
    EXPECT_EQ(row["median_sequences"].get<double>(), static_cast<double>(batch));
    EXPECT_EQ(row["output_tokens"].get<int64_t>(), 5 * batch);
    // Each request's context grows by one token a step.
    EXPECT_DOUBLE_EQ(row["context_end"].get<double>() - row["context_start"].get<double>(), 5.0);
  }
  for (const nlohmann::json& row : doc["rows"]) {
    for (const char* part : {"schedule_us", "plan_us", "runner_us", "post_us", "step_us"}) {
      EXPECT_GT(row[part]["median"].get<double>(), 0.0) << part;
      EXPECT_GE(row[part]["p90"].get<double>(), row[part]["median"].get<double>()) << part;
    }
    const double step_s = row["step_us"]["median"].get<double>() * 1e-6;
    EXPECT_NEAR(row["gpu_idle"].get<double>(), step_s / (step_s + 2e-3), 1e-12);
  }
  ASSERT_EQ(doc["prepare"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& p = doc["prepare"][i];
    EXPECT_EQ(p["batch"].get<int64_t>(), i == 0 ? 1 : 3);
    // The context the decode scenario reached halfway: its mean over the measured steps.
    const nlohmann::json& decode = doc["rows"][i + 1];
    EXPECT_EQ(p["context"].get<int64_t>(),
              std::llround(0.5 * (decode["context_start"].get<double>() +
                                  decode["context_end"].get<double>())));
    EXPECT_GE(p["calls"].get<int64_t>(), 100);
    EXPECT_GT(p["prepare_us"]["median"].get<double>(), 0.0);
    EXPECT_NEAR(
        p["host_part_us"].get<double>(),
        p["prepare_us"]["median"].get<double>() - p["backend_plan_us"]["median"].get<double>(),
        1e-9);
  }
}

// With a tokenizer (the embedded model's, 4,096 ids) every token is detokenized and stop strings
// are matched: the runner draws ids of the tokenizer's vocabulary, the workload's prompt ids are
// capped to it, and nothing ends early (the stop string never appears).
TEST_F(Cli, BenchEngineHostDetokenizesWithATokenizer) {
  const fs::path tokenizer =
      kWorkload.parent_path().parent_path().parent_path() / "models" / "austen-3m";
  const fs::path json = fs::temp_directory_path() /
                        ("pagedattn_engine_host_tok_" + std::to_string(::getpid()) + ".json");
  const CliRun run = run_cli(
      "bench engine-host --scenarios workload decode --requests 3 --max-input-len 30 "
      "--max-output-len 6 --batches 2 --steps 4 --warmup 1 --prompt-len 8 --tokenizer " +
      tokenizer.string() + " --stop @@@@ --json " + json.string());
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* text : {"vocabulary 4096 (the tokenizer's)", "every token detokenized",
                           "stop string \"@@@@\"", "decode B=2"}) {
    EXPECT_NE(run.output.find(text), std::string::npos) << text << "\n" << run.output;
  }
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove(json);
  EXPECT_EQ(doc["engine"]["vocab"], 4096);
  EXPECT_EQ(doc["engine"]["tokenizer"], tokenizer.string());
  EXPECT_EQ(doc["engine"]["stop"], nlohmann::json::array({"@@@@"}));
  ASSERT_EQ(doc["rows"].size(), 2u);
  EXPECT_EQ(doc["rows"][1]["steps"].get<int64_t>(), 4);
  EXPECT_EQ(doc["rows"][1]["decode_steps"].get<int64_t>(), 4);
}

TEST_F(Cli, BenchEngineHostNamesBadFlags) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench engine-host --device-step-ms 0", "--device-step-ms 0"},
      {"bench engine-host --batches 4 0", "--batches 0"},
      {"bench engine-host --steps 0", "--steps 0"},
      {"bench engine-host --prompt-len 0", "--prompt-len 0"},
      {"bench engine-host --page-size 0", "--page-size 0"},
      {"bench engine-host --vocab 1", "--vocab 1"},
      {"bench engine-host --scenarios decode nope", "--scenarios nope"},
      {"bench engine-host --metadata commit", "--metadata commit"},
      {"bench engine-host --requests 300", "--requests 300"},
      {"bench engine-host --workload /nonexistent/w.json", "/nonexistent/w.json"},
      {"bench engine-host --stop END", "--stop"},
      {"bench engine-host --tokenizer /nonexistent/tok", "/nonexistent/tok"},
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
