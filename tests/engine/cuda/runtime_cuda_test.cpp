// The engine over real checkpoints on the GPU (ModelRuntime with device cuda): transformers'
// greedy tokens through the whole serving path, as tests/engine/runtime_test.cpp does on the CPU.
// Each tiny fixture of tests/data/model runs with compute dtype f32 and an f32 KV cache on the
// device (the f32 GEMMs and the cuda_generic attention: logits within ~1e-5 of transformers, far
// below every fixture's gap between the best and second-best logit), its prompts as one batch
// with the first prompt again in the middle (a shared prefix), in several configurations: token
// budgets 1 / 16 / unbounded (chunked prefill), page sizes 1 / 16 / 64, prefix cache on and off,
// and a pool small enough to preempt. Criterion: every request's 32 greedy tokens are exactly
// transformers'; no page leaked. Prompt logprobs (a logits row per prompt token, the model's last
// num_logit_rows rows on the device): each prompt token's logprob and top 5 are transformers'
// (float64 log-softmax of its row, within 1e-4) under chunked prefill and a small pool. Then the
// default (bf16) runtime on the GPU generates from the embedded model and from a fixture without
// error, on the device it says. Skips without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "common/gpu_skip.h"
#include "cuda/cuda_backend.h"
#include "model/model_fixture.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_generate.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {
namespace {

std::string gpu_unusable() {
  const Support support = ::pagedattn::cuda::device_available();
  return support ? std::string() : support.reason;
}
#define REQUIRE_GPU() PA_SKIP_OR_FAIL_WITHOUT_GPU(gpu_unusable())

struct EngineSetup {
  int32_t page_size;
  int64_t budget;  // <= 0: unbounded
  bool prefix_cache;
  int32_t num_pages;  // 0: plenty
};

class EngineOnCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineOnCuda, GreedyTokensEqualTransformers) {
  REQUIRE_GPU();
  const model::testing::Fixture fixture = model::testing::Fixture::load(GetParam());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> source;
  for (size_t i = 0; i < fixture.prompts.size(); ++i) {
    prompts.push_back(fixture.prompts[i].prompt);
    source.push_back(i);
  }
  prompts.insert(prompts.begin() + 2, fixture.prompts[0].prompt);
  source.insert(source.begin() + 2, 0);
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 32;
  params.ignore_eos = true;
  int64_t preemptions = 0;
  for (const EngineSetup& setup : std::vector<EngineSetup>{{16, 0, true, 0},
                                                           {16, 16, true, 0},
                                                           {1, 1, false, 0},
                                                           {64, 16, false, 0},
                                                           {16, 16, true, 8}}) {
    SCOPED_TRACE(fmt::format("{}: page {} budget {} cache {} pages {}", GetParam(), setup.page_size,
                             setup.budget, setup.prefix_cache, setup.num_pages));
    RuntimeOptions options;
    options.model.device = "cuda";
    options.model.compute_dtype = DType::kF32;
    options.kv_dtype = DType::kF32;
    options.page_size = setup.page_size;
    options.num_pages = setup.num_pages ? setup.num_pages : 2048;
    auto runtime = ModelRuntime::open(fixture.directory, options);
    ASSERT_EQ(runtime->device(), Device::cuda(0));
    ASSERT_EQ(runtime->pool().device(), Device::cuda(0));
    EngineConfig config = runtime->engine_config();
    EXPECT_GT(config.max_tokens_per_step, 0) << "the GPU model's buffers bound the budget";
    config.max_tokens_per_step = setup.budget > 0 ? setup.budget : config.max_tokens_per_step;
    config.prefix_cache = setup.prefix_cache;
    Engine engine(config, *runtime);
    const auto completions = generate(engine, prompts, params);
    ASSERT_EQ(completions.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      ASSERT_EQ(completions[r].size(), 1u);
      EXPECT_EQ(completions[r][0].error, "");
      EXPECT_EQ(completions[r][0].tokens, fixture.prompts[source[r]].generated)
          << "request " << r << " (fixture prompt " << source[r] << ")";
    }
    engine.check_consistency();
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
    if (setup.num_pages) preemptions += engine.stats().num_preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the small pool never preempted: the test does not cover it";
}

TEST_P(EngineOnCuda, PromptLogprobsEqualTransformers) {
  REQUIRE_GPU();
  const model::testing::Fixture fixture = model::testing::Fixture::load(GetParam());
  constexpr double kBound = 1e-4;
  constexpr int32_t kTop = 5;
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 1;
  params.ignore_eos = true;
  params.prompt_logprobs = kTop;
  for (const EngineSetup& setup :
       std::vector<EngineSetup>{{16, 0, true, 0}, {16, 7, true, 0}, {1, 16, true, 5 * 16}}) {
    SCOPED_TRACE(fmt::format("{}: page {} budget {} pages {}", GetParam(), setup.page_size,
                             setup.budget, setup.num_pages));
    RuntimeOptions options;
    options.model.device = "cuda";
    options.model.compute_dtype = DType::kF32;
    options.kv_dtype = DType::kF32;
    options.page_size = setup.page_size;
    options.num_pages = setup.num_pages ? setup.num_pages : 2048;
    auto runtime = ModelRuntime::open(fixture.directory, options);
    EngineConfig config = runtime->engine_config();
    config.max_tokens_per_step = setup.budget > 0 ? setup.budget : config.max_tokens_per_step;
    config.prefix_cache = setup.prefix_cache;
    Engine engine(config, *runtime);
    std::vector<Engine::Handle> handles;
    for (const auto& prompt : fixture.prompts) {
      handles.push_back(engine.add_request(prompt.prompt, params));
    }
    std::vector<std::vector<TokenLogprob>> got(handles.size());
    while (engine.has_work()) {
      engine.step();
      for (size_t r = 0; r < handles.size(); ++r) {
        while (auto event = handles[r].stream->try_pop()) {
          if (!event->prompt_logprobs.empty()) got[r] = event->prompt_logprobs;
        }
      }
    }
    for (size_t r = 0; r < handles.size(); ++r) {
      const model::testing::FixturePrompt& prompt = fixture.prompts[r];
      ASSERT_EQ(got[r].size(), prompt.prompt.size() - 1) << "prompt " << r;
      for (size_t i = 0; i + 1 < prompt.prompt.size(); ++i) {
        const std::vector<double> row =
            model::testing::log_softmax(fixture.row(prompt.first_row + static_cast<int64_t>(i)));
        std::vector<double> sorted = row;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        const TokenLogprob& entry = got[r][i];
        EXPECT_EQ(entry.token, prompt.prompt[i + 1]);
        EXPECT_NEAR(entry.logprob, row[static_cast<size_t>(entry.token)], kBound)
            << "prompt " << r << " token " << i + 1;
        ASSERT_EQ(entry.top.size(), static_cast<size_t>(kTop));
        for (size_t k = 0; k < entry.top.size(); ++k) {
          EXPECT_NEAR(entry.top[k].second, row[static_cast<size_t>(entry.top[k].first)], kBound);
          EXPECT_NEAR(entry.top[k].second, sorted[k], kBound) << "top " << k;
        }
      }
    }
    engine.check_consistency();
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOnCuda,
                         ::testing::Values("llama3_bf16", "qwen2_f32", "qwen3_bf16",
                                           "deepseek_v2_f16", "deepseek_v3_bf16",
                                           "deepseek_v3_mla512_bf16"),
                         [](const auto& info) { return info.param; });

// Sampling on the device (the default on CUDA: RuntimeOptions::model_sampling unset) against the
// engine's host sampler over the same GPU logits: greedy rows (transformers' tokens), seeded rows
// with temperature / top-k / top-p (sampled by the kernel when on; drawn by the engine's
// Sampler from the copied logits when off) and penalised rows (on the host either way), each kind
// as one batch; every choice's tokens are the same, no page leaked. A seeded draw could differ only
// within ~1e-9 of a cumulative boundary (sampling.h), not expected in these ~300 draws. Three runs:
// sampling on the device with overlap scheduling (the default: each decode step launched before
// the previous one is collected, its input tokens read on the device), on the device one step at
// a time, and on the host. A fourth kind stops at a token greedy decoding meets mid-way (the
// overlapped step after the stop is dropped).
TEST(EngineOnCudaModelSampling, SameTokensAsTheHostSampler) {
  REQUIRE_GPU();
  const model::testing::Fixture fixture = model::testing::Fixture::load("qwen3_bf16");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : fixture.prompts) prompts.push_back(p.prompt);
  std::vector<SamplingParams> kinds(3);
  kinds[0].temperature = 0.0;
  kinds[1].temperature = 0.9;
  kinds[1].top_k = 40;
  kinds[1].top_p = 0.9;
  kinds[1].seed = 5;
  kinds[1].n = 2;
  kinds[2] = kinds[1];
  kinds[2].n = 1;
  kinds[2].repetition_penalty = 1.3;  // not samplable on the device
  // Stop at prompt 0's first greedy token unlike its first one (tied fixtures repeat tokens).
  const std::vector<int32_t>& greedy0 = fixture.prompts[0].generated;
  size_t stop_at = 1;
  while (stop_at + 1 < greedy0.size() && greedy0[stop_at] == greedy0[0]) ++stop_at;
  kinds.push_back(kinds[0]);
  kinds[3].stop_token_ids = {greedy0[stop_at]};
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (const int mode : {0, 1, 2}) {
    const bool on = mode < 2;
    RuntimeOptions options;
    options.model.device = "cuda";
    options.model.compute_dtype = DType::kF32;
    options.kv_dtype = DType::kF32;
    options.num_pages = 2048;
    if (!on) options.model_sampling = false;
    auto runtime = ModelRuntime::open(fixture.directory, options);
    EXPECT_EQ(runtime->prefers_model_sampling(), on);
    EngineConfig config = runtime->engine_config();
    if (mode == 1) config.overlap = false;
    Engine engine(config, *runtime);
    std::vector<std::vector<int32_t>> tokens;
    for (size_t k = 0; k < kinds.size(); ++k) {
      SamplingParams params = kinds[k];
      params.max_tokens = 32;
      params.ignore_eos = true;
      const auto completions = generate(engine, prompts, params);
      for (size_t r = 0; r < completions.size(); ++r) {
        for (const auto& choice : completions[r]) {
          EXPECT_EQ(choice.error, "");
          tokens.push_back(choice.tokens);
          if (k == 0) {
            EXPECT_EQ(choice.tokens, fixture.prompts[r].generated) << "greedy, prompt " << r;
          }
        }
      }
    }
    engine.check_consistency();
    if (mode == 0) {
      EXPECT_GT(engine.stats().num_overlapped_steps, 32) << "overlap scheduling did not run";
    } else {
      EXPECT_EQ(engine.stats().num_overlapped_steps, 0);
    }
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
    runs.push_back(std::move(tokens));
  }
  for (const int mode : {1, 2}) {
    ASSERT_EQ(runs[0].size(), runs[mode].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_EQ(runs[mode][i], runs[0][i]) << "mode " << mode << ", choice " << i;
    }
  }
  // The stop kind: prompt 0 stops at that token (which is emitted).
  EXPECT_EQ(runs[0][runs[0].size() - prompts.size()].size(), stop_at + 1);
}

// Overlap scheduling over CUDA graphs: the defaults (bf16 compute and KV) on the fixture with the
// real MLA widths, whose decode steps run the tuned kernels and so replay CUDA graphs (MoE routed on
// the device) with the embedding reading the pending tokens, give the same tokens with overlap on
// and off: greedy and seeded rows, requests joining one per step (batch sizes that change, so
// graphs of several sizes). No stops: every step then has the same rows in both runs, so the same
// kernels and bitwise the same logits (a stop would leave one wasted row in the overlapped run's
// next step, a different GEMM shape, and bf16 rounding that may differ; the f32 test above covers
// stops).
TEST(EngineOnCudaOverlap, GraphStepsGiveTheSameTokensAsStepsOneAtATime) {
  REQUIRE_GPU();
  const model::testing::Fixture fixture = model::testing::Fixture::load("deepseek_v3_mla512_bf16");
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (const bool overlap : {true, false}) {
    RuntimeOptions options;
    options.model.device = "cuda";
    options.num_pages = 1024;
    auto runtime = ModelRuntime::open(fixture.directory, options);
    EngineConfig config = runtime->engine_config();
    config.overlap = overlap;
    Engine engine(config, *runtime);
    std::vector<Engine::Handle> handles;
    for (size_t i = 0; i < 3 * fixture.prompts.size(); ++i) {
      SamplingParams params;
      params.max_tokens = 24 + static_cast<int32_t>(i % 5);
      params.ignore_eos = true;
      if (i % 2 == 1) {
        params.temperature = 0.8;
        params.top_p = 0.9;
        params.seed = 11 + i;
      } else {
        params.temperature = 0.0;
      }
      handles.push_back(
          engine.add_request(fixture.prompts[i % fixture.prompts.size()].prompt, params));
      engine.step();  // one request joins per step: the decode batch grows
    }
    int64_t graph_steps = 0;
    while (engine.has_work()) {
      engine.step();
      const auto timing = runtime->model().last_device_timing();
      graph_steps += timing.has_value() && timing->graph ? 1 : 0;
    }
    EXPECT_GT(graph_steps, 10) << "decode steps did not replay CUDA graphs";
    std::vector<std::vector<int32_t>> tokens;
    for (auto& handle : handles) {
      std::vector<int32_t> out;
      while (auto event = handle.stream->try_pop()) {
        EXPECT_EQ(event->error, "");
        out.insert(out.end(), event->token_ids.begin(), event->token_ids.end());
      }
      tokens.push_back(std::move(out));
    }
    const EngineStats stats = engine.stats();
    if (overlap) {
      EXPECT_GT(stats.num_overlapped_steps, stats.num_steps / 2);
    } else {
      EXPECT_EQ(stats.num_overlapped_steps, 0);
    }
    engine.check_consistency();
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
    runs.push_back(std::move(tokens));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i], runs[1][i]) << "request " << i;
    EXPECT_FALSE(runs[0][i].empty()) << "request " << i;
  }
}

// The defaults a user gets (device auto, bf16 compute and KV) on a GPU machine.
TEST(EngineOnCudaDefaults, AutoRunsOnTheGpuAndGenerates) {
  REQUIRE_GPU();
  const model::testing::Fixture fixture = model::testing::Fixture::load("deepseek_v3_mla512_bf16");
  auto runtime = ModelRuntime::open(fixture.directory);
  EXPECT_EQ(runtime->device(), Device::cuda(0));
  Engine engine(runtime->engine_config(), *runtime);
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 16;
  params.ignore_eos = true;
  const auto completions = generate(engine, {fixture.prompts[0].prompt}, params);
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0][0].error, "");
  EXPECT_EQ(completions[0][0].tokens.size(), 16u);
}

}  // namespace
}  // namespace pagedattn::engine
