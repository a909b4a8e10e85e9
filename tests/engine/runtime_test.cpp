// The engine over real checkpoints (ModelRuntime): transformers' greedy tokens through the whole
// serving path. Each tiny random checkpoint of tests/data/model/ (Llama 3, Llama with linear RoPE
// sharded, Qwen2, Qwen3, DeepSeek-V2/V3 with MLA + MoE; transformers 5.17's float32 run) is loaded
// by ModelRuntime with an f32 KV cache, and its three prompts go through the Engine as one batch,
// the first prompt also a second time in the middle (a shared prefix submitted twice). Criterion:
// the 32 greedy tokens of every request are transformers' exactly, in every configuration: token
// budgets 1 / 4 / 16 / 64 / unbounded (chunked prefill), page sizes 1 / 16 / 64, prefix cache on
// and off, and a pool so small that requests are preempted and recomputed. With f32 weights
// through f32 activations and KV the logits agree with transformers to ~1e-5 (tests/model), far
// below the fixtures' gaps between the best and second-best logit, so no near-tie can flip a
// token; bf16 noise does not enter.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagedattn/engine.h"
#include "pagedattn/engine_generate.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir(const std::string& name) {
  return fs::path(__FILE__).parent_path().parent_path() / "data" / "model" / name;
}

struct GreedyCase {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> generated;
};

GreedyCase load_greedy(const std::string& name) {
  std::ifstream in(fixture_dir(name) / "expected.json");
  if (!in) throw std::runtime_error("missing fixture " + name);
  const nlohmann::json expected = nlohmann::json::parse(in);
  GreedyCase result;
  for (const auto& tokens : expected.at("tokens")) {
    result.prompts.push_back(tokens.at("prompt").get<std::vector<int32_t>>());
    result.generated.push_back(tokens.at("generated").get<std::vector<int32_t>>());
  }
  return result;
}

struct EngineSetup {
  int32_t page_size;
  int64_t budget;  // <= 0: unbounded
  bool prefix_cache;
  int32_t num_pages;  // 0: plenty
  std::string label() const {
    return "P" + std::to_string(page_size) + "_budget" + std::to_string(budget) +
           (prefix_cache ? "_cache" : "_nocache") +
           (num_pages ? "_pages" + std::to_string(num_pages) : "");
  }
};

std::vector<EngineSetup> setups() {
  std::vector<EngineSetup> all;
  for (int32_t page : {1, 16, 64}) {
    for (int64_t budget : {1, 4, 16, 64, 0}) all.push_back({page, budget, true, 0});
  }
  all.push_back({16, 0, false, 0});
  all.push_back({1, 64, false, 0});
  // Small pools: the four requests (prompts of 5..40 tokens + 32 outputs) cannot all run at once.
  all.push_back({16, 16, true, 8});
  all.push_back({1, 8, false, 90});
  return all;
}

class EngineOverFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineOverFixture, GreedyTokensEqualTransformersInEveryConfiguration) {
  const std::string name = GetParam();
  const GreedyCase expected = load_greedy(name);
  // Prompt 0 twice: first and in the middle of the batch.
  std::vector<std::vector<int32_t>> prompts = expected.prompts;
  std::vector<size_t> source(prompts.size());
  for (size_t i = 0; i < source.size(); ++i) source[i] = i;
  prompts.insert(prompts.begin() + 2, expected.prompts[0]);
  source.insert(source.begin() + 2, 0);

  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 32;
  params.ignore_eos = true;
  int64_t preemptions = 0;
  for (const EngineSetup& setup : setups()) {
    SCOPED_TRACE(name + " " + setup.label());
    RuntimeOptions options;
    options.model.backend = "cpu";
    options.kv_dtype = DType::kF32;
    options.page_size = setup.page_size;
    options.num_pages = setup.num_pages ? setup.num_pages : 4096;
    auto runtime = ModelRuntime::open(fixture_dir(name), options);
    EngineConfig config = runtime->engine_config();
    config.max_tokens_per_step = setup.budget;
    config.prefix_cache = setup.prefix_cache;
    Engine engine(config, *runtime);
    const auto completions = generate(engine, prompts, params);
    ASSERT_EQ(completions.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      ASSERT_EQ(completions[r].size(), 1u);
      EXPECT_EQ(completions[r][0].error, "");
      EXPECT_EQ(completions[r][0].tokens, expected.generated[source[r]])
          << "request " << r << " (fixture prompt " << source[r] << ")";
    }
    engine.check_consistency();
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
    const EngineStats stats = engine.stats();
    if (setup.num_pages) preemptions += stats.num_preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the small pools never preempted: the test does not cover it";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOverFixture,
                         ::testing::Values("llama3_bf16", "llama_linear_f16_sharded", "qwen2_f32",
                                           "qwen3_bf16", "deepseek_v2_f16", "deepseek_v3_bf16"),
                         [](const auto& info) { return info.param; });

TEST(ModelRuntime, BadDirectoryNamesTheFile) {
  try {
    ModelRuntime::open(fixture_dir("no_such_model"));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedattn::engine
