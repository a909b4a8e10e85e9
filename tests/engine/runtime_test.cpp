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

// transformers' logits of every prompt row, as float64 log-softmax: [prompt][position][vocab].
std::vector<std::vector<std::vector<double>>> load_prompt_logprobs(const std::string& name) {
  std::ifstream in(fixture_dir(name) / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const auto vocab = expected.at("vocab_size").get<size_t>();
  std::ifstream raw(fixture_dir(name) / "expected_logits.f32", std::ios::binary);
  std::vector<std::vector<std::vector<double>>> result;
  std::vector<float> row(vocab);
  for (const auto& prompt : expected.at("prompts")) {
    auto& rows = result.emplace_back();
    for (int64_t r = 0; r < prompt.at("prefill_rows").get<int64_t>(); ++r) {
      raw.read(reinterpret_cast<char*>(row.data()), static_cast<std::streamsize>(vocab * 4));
      double max_logit = -INFINITY, total = 0.0;
      for (const float v : row) max_logit = std::max<double>(max_logit, v);
      for (const float v : row) total += std::exp(double{v} - max_logit);
      auto& out = rows.emplace_back(vocab);
      for (size_t v = 0; v < vocab; ++v) out[v] = row[v] - max_logit - std::log(total);
    }
    raw.seekg(static_cast<std::streamoff>(prompt.at("decode_rows").get<int64_t>() * vocab * 4),
              std::ios::cur);
  }
  if (!raw) throw std::runtime_error("short logits file for " + name);
  return result;
}

TEST_P(EngineOverFixture, PromptLogprobsEqualTransformers) {
  const std::string name = GetParam();
  const GreedyCase expected = load_greedy(name);
  const auto reference = load_prompt_logprobs(name);
  constexpr double kBound = 1e-4;
  constexpr int32_t kTop = 5;
  // A plain request for prompt 2 first (it caches the prompt's pages), then every prompt scored.
  std::vector<std::vector<int32_t>> prompts = {expected.prompts[2]};
  for (const auto& prompt : expected.prompts) prompts.push_back(prompt);
  SamplingParams plain;
  plain.temperature = 0.0;
  plain.max_tokens = 2;
  plain.ignore_eos = true;
  SamplingParams scoring = plain;
  scoring.prompt_logprobs = kTop;
  const std::vector<EngineSetup> configurations = {
      {16, 1, true, 0},  {1, 4, true, 0},   {16, 16, true, 0}, {64, 0, true, 0},
      {16, 0, false, 0}, {16, 16, true, 5}, {1, 8, true, 48}};
  int64_t preemptions = 0;
  for (const EngineSetup& setup : configurations) {
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
    std::vector<Engine::Handle> handles;
    handles.push_back(engine.add_request(prompts[0], plain));
    // The plain request runs to its end before the scoring ones arrive: its pages are cached.
    while (engine.has_work()) engine.step();
    for (size_t r = 1; r < prompts.size(); ++r) {
      handles.push_back(engine.add_request(prompts[r], scoring));
    }
    std::vector<std::vector<TokenLogprob>> got(prompts.size());
    std::vector<std::vector<int32_t>> tokens(prompts.size());
    std::vector<int64_t> cached(prompts.size(), -1);
    while (engine.has_work()) {
      engine.step();
      engine.check_consistency();
      for (size_t r = 1; r < prompts.size(); ++r) {
        while (auto event = handles[r].stream->try_pop()) {
          if (!event->prompt_logprobs.empty()) {
            EXPECT_TRUE(got[r].empty()) << "prompt logprobs sent twice for request " << r;
            got[r] = event->prompt_logprobs;
            cached[r] = event->num_cached_tokens;
          }
          tokens[r].insert(tokens[r].end(), event->token_ids.begin(), event->token_ids.end());
        }
      }
    }
    for (size_t r = 1; r < prompts.size(); ++r) {
      const size_t p = r - 1;  // the fixture prompt
      const auto& rows = reference[p];
      const std::vector<int32_t>& prompt = prompts[r];
      ASSERT_EQ(got[r].size(), prompt.size() - 1) << "request " << r;
      EXPECT_EQ(cached[r], 0) << "a scoring request took a prefix-cache hit";
      EXPECT_EQ(tokens[r], std::vector<int32_t>(expected.generated[p].begin(),
                                                expected.generated[p].begin() + 2));
      for (size_t i = 0; i + 1 < prompt.size(); ++i) {
        const TokenLogprob& entry = got[r][i];
        const std::vector<double>& row = rows[i];
        EXPECT_EQ(entry.token, prompt[i + 1]);
        EXPECT_NEAR(entry.logprob, row[static_cast<size_t>(prompt[i + 1])], kBound)
            << "prompt " << p << " token " << i + 1;
        // The top 5: each the fixture's logprob of that token, best first, and none of the
        // tokens left out better than the last one kept (up to the bound: near-ties may swap).
        ASSERT_EQ(entry.top.size(), static_cast<size_t>(kTop));
        std::vector<double> sorted = row;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        for (size_t k = 0; k < entry.top.size(); ++k) {
          const auto [token, logprob] = entry.top[k];
          EXPECT_NEAR(logprob, row[static_cast<size_t>(token)], kBound);
          EXPECT_NEAR(logprob, sorted[k], kBound) << "top " << k;
        }
      }
    }
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
    preemptions += engine.stats().num_preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the small pools never preempted: the test does not cover it";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOverFixture,
                         ::testing::Values("llama3_bf16", "llama_linear_f16_sharded", "qwen2_f32",
                                           "qwen3_bf16", "deepseek_v2_f16", "deepseek_v3_bf16"),
                         [](const auto& info) { return info.param; });

// The pool's size: as many pages as kv_bytes holds, no more than max_pages; num_pages overrides
// both.
TEST(ModelRuntime, PoolSizedFromTheBudgetAndItsCaps) {
  const std::filesystem::path dir = fixture_dir("qwen3_bf16");
  RuntimeOptions options;
  options.model.device = "cpu";
  options.kv_dtype = DType::kF32;
  const int64_t page_bytes = model::KvPool::bytes_per_page(
      ModelRuntime::open(dir, options)->config(), options.page_size, DType::kF32);
  options.kv_bytes = 100 * page_bytes + page_bytes / 2;
  EXPECT_EQ(ModelRuntime::open(dir, options)->pool().num_pages(), 100);
  options.max_pages = 37;
  EXPECT_EQ(ModelRuntime::open(dir, options)->pool().num_pages(), 37);
  options.max_pages = 1000;
  EXPECT_EQ(ModelRuntime::open(dir, options)->pool().num_pages(), 100);
  options.num_pages = 7;
  EXPECT_EQ(ModelRuntime::open(dir, options)->pool().num_pages(), 7);
}

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
