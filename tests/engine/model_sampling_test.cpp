// Sampling by the model (EngineConfig::model_sampling, ModelRunner::forward_sampled, Model's
// Step::sampling) on the CPU, against the engine's own sampler:
// 1. The engine's Sampler and ops::RowSampler (what a model runs) give the same token and logprob
//    on thousands of random rows and parameters (tests/common/sampling_reference.h's rows: ties,
//    -inf, NaN, every filter and edge value), and both the float64 reference's token unless the
//    draw lies within 1e-6 of a boundary.
// 2. The engine over the fake model with model sampling on and off: a batch mixing greedy,
//    seeded temperature / top-k / top-p / min-p rows, n = 3, logprobs 0 (all sampled by the
//    runner) with rows it must keep on the host (strong penalties, a logit bias, top-n logprobs:
//    a runner drawing them would ignore the penalty or bias and change the tokens), arriving at
//    different steps (prefills beside decodes), under a small budget. Every choice's tokens and
//    logprobs are the same; the runner was asked to sample rows only when on; no page leaked.
// 3. ModelRuntime on a CPU fixture (Model::forward with Step::sampling: ops sampling inside the
//    model, the other rows' logits compacted and put back at their rows) on and off: the same
//    tokens, the greedy ones transformers'.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/sampling_reference.h"
#include "common/test_util.h"
#include "engine/fake_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/engine_sampler.h"
#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {
namespace {

TEST(ModelSampling, EngineSamplerEqualsOpsReferenceOnRandomRows) {
  const uint64_t seed = ::pagedattn::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Sampler sampler;
  ops::RowSampler reference;
  int compared = 0, near = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t vocab = 1 + static_cast<int64_t>(rng() % 2000);
    const int kind = static_cast<int>(rng() % 4);
    const std::vector<float> logits = ::pagedattn::testing::random_sampling_row(rng, vocab, kind);
    bool any_finite = false;
    for (const float x : logits) any_finite |= std::isfinite(x);
    if (!any_finite) continue;
    const auto spec = ::pagedattn::testing::random_sampling_spec(rng, vocab);
    SamplingParams params;
    params.temperature = spec.temperature;
    params.top_k = spec.top_k;
    params.top_p = spec.top_p;
    params.min_p = spec.min_p;
    params.logprobs = 0;
    SampleContext context;
    context.seed = spec.seed;
    context.choice = spec.choice;
    context.position = spec.position;
    ASSERT_TRUE(model_can_sample(params));
    SCOPED_TRACE("trial " + std::to_string(trial));
    const TokenLogprob engine_token = sampler.sample(logits, params, context);
    const ops::RowDraw ops_token = reference.sample(logits, row_sampling(params, context));
    ASSERT_EQ(engine_token.token, ops_token.token);
    if (kind != 2) {
      ASSERT_EQ(engine_token.logprob, ops_token.logprob);
    }
    const auto ref = ::pagedattn::testing::sampling_reference(logits, spec);
    if (ref.draw_margin < 1e-6 || ref.top_p_margin < 1e-9) {
      ++near;
      continue;
    }
    ++compared;
    ASSERT_EQ(engine_token.token, ref.token);
  }
  EXPECT_GT(compared, 3000);
  EXPECT_LT(near, 40);
}

// The fake model, recording how many rows the engine asked it to sample; it samples them with
// ModelRunner's default (forward, then ops::RowSampler on the host).
class SamplingFakeModel : public testing::FakeModel {
 public:
  using FakeModel::FakeModel;
  void forward_sampled(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                       std::span<float> logits, std::span<ops::SampledToken> sampled) override {
    for (const ops::RowSampling& row : sampling) rows_sampled += row.sample ? 1 : 0;
    ModelRunner::forward_sampled(plan, sampling, logits, sampled);
  }
  int64_t rows_sampled = 0;
};

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int64_t arrival = 0;
};

struct ChoiceRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
};

// Runs `requests` (each added at its arrival step) to the end; [request][choice].
std::vector<std::vector<ChoiceRun>> run_all(Engine& engine, const std::vector<Request>& requests) {
  std::vector<std::vector<ChoiceRun>> out(requests.size());
  std::vector<Engine::Handle> handles(requests.size());
  size_t added = 0;
  for (int64_t step = 0; added < requests.size() || engine.has_work(); ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].arrival == step) {
        handles[i] = engine.add_request(requests[i].prompt, requests[i].params);
        out[i].resize(static_cast<size_t>(requests[i].params.n));
        ++added;
      }
    }
    engine.step();
    engine.check_consistency();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!handles[i].stream) continue;
      while (auto event = handles[i].stream->try_pop()) {
        ChoiceRun& choice = out[i][static_cast<size_t>(event->index)];
        choice.tokens.insert(choice.tokens.end(), event->token_ids.begin(), event->token_ids.end());
        for (const TokenLogprob& lp : event->logprobs) choice.logprobs.push_back(lp.logprob);
        for (const TokenLogprob& lp : event->prompt_logprobs) {
          choice.prompt_logprobs.push_back(lp.logprob);
        }
        if (event->finished()) choice.reason = event->finish_reason;
      }
    }
    if (step > 100000) {
      ADD_FAILURE() << "the engine did not finish";
      break;
    }
  }
  return out;
}

std::vector<Request> mixed_requests(int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  std::vector<Request> requests;
  for (int i = 0; i < 26; ++i) {
    Request request;
    const int length = 2 + pick(20);
    for (int t = 0; t < length; ++t) request.prompt.push_back(pick(vocab));
    request.arrival = pick(12);
    SamplingParams& p = request.params;
    p.max_tokens = 8 + pick(20);
    p.seed = rng();
    switch (i % 13) {
      case 0:
        p.temperature = 0.0;
        break;
      case 1:
        p.temperature = 0.8;
        break;
      case 2:
        p.temperature = 1.2;
        p.top_k = 5;
        break;
      case 3:
        p.top_p = 0.7;
        break;
      case 4:
        p.min_p = 0.1;
        p.top_k = 10;
        p.top_p = 0.9;
        break;
      case 5:
        p.n = 3;
        break;
      case 6:
        p.temperature = 0.9;
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 2.0;
        break;
      case 7:
        p.temperature = 0.0;
        p.logit_bias = {{pick(vocab), 5.0f}};
        break;
      case 8:
        p.logprobs = 0;
        break;
      case 9:
        p.logprobs = 3;
        p.temperature = 0.7;
        break;
      case 10:
        p.temperature = 0.0;
        p.logprobs = 0;
        break;
      case 11:  // prompt scoring rows (host) beside a sampling row the model may draw
        p.temperature = 0.8;
        p.prompt_logprobs = 2;
        break;
      default:  // scoring only: nothing sampled
        p.prompt_logprobs = 0;
        p.max_tokens = 0;
        break;
    }
    requests.push_back(std::move(request));
  }
  return requests;
}

TEST(ModelSampling, EngineOverFakeModelSameOutputsOnAndOff) {
  const int32_t vocab = 64;
  const std::vector<Request> requests = mixed_requests(vocab, 17);
  std::vector<std::vector<std::vector<ChoiceRun>>> runs;
  for (const bool on : {false, true}) {
    EngineConfig config;
    config.num_pages = 256;
    config.page_size = 4;
    config.max_tokens_per_step = 24;
    config.max_model_length = 128;
    config.model_sampling = on;
    SamplingFakeModel model(vocab, config.num_pages, config.page_size);
    Engine engine(config, model);
    model.watch(&engine.allocator());
    runs.push_back(run_all(engine, requests));
    if (on) {
      EXPECT_GT(model.rows_sampled, 100);
    } else {
      EXPECT_EQ(model.rows_sampled, 0);
    }
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(runs[0][i].size(), runs[1][i].size());
    for (size_t c = 0; c < runs[0][i].size(); ++c) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(c));
      EXPECT_EQ(runs[0][i][c].reason, FinishReason::kLength);
      EXPECT_EQ(runs[1][i][c].tokens, runs[0][i][c].tokens);
      EXPECT_EQ(runs[1][i][c].logprobs, runs[0][i][c].logprobs);
      EXPECT_EQ(runs[1][i][c].prompt_logprobs, runs[0][i][c].prompt_logprobs);
      if (requests[i].params.prompt_logprobs) {
        EXPECT_EQ(runs[0][i][c].prompt_logprobs.size(), requests[i].prompt.size() - 1);
      }
      EXPECT_EQ(runs[0][i][c].tokens.size(), static_cast<size_t>(*requests[i].params.max_tokens));
    }
  }
  // The choices of n = 3 draw different numbers: not all the same.
  EXPECT_NE(runs[1][5][0].tokens, runs[1][5][1].tokens);
}

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "model" / name;
}

TEST(ModelSampling, RuntimeOnCpuSameTokensOnAndOff) {
  const std::filesystem::path dir = fixture_dir("qwen3_bf16");
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in) << "missing fixture";
  const nlohmann::json expected = nlohmann::json::parse(in);
  std::vector<Request> requests;
  std::vector<std::vector<int32_t>> greedy_expected;
  for (const auto& tokens : expected.at("tokens")) {
    Request greedy;
    greedy.prompt = tokens.at("prompt").get<std::vector<int32_t>>();
    greedy.params.temperature = 0.0;
    greedy.params.max_tokens = 32;
    greedy.params.ignore_eos = true;
    greedy_expected.push_back(tokens.at("generated").get<std::vector<int32_t>>());
    Request seeded = greedy;
    seeded.params.temperature = 0.9;
    seeded.params.top_p = 0.9;
    seeded.params.top_k = 40;
    seeded.params.seed = 7;
    seeded.params.logprobs = 0;
    seeded.arrival = 1;
    Request penalised = seeded;  // stays on the host
    penalised.params.presence_penalty = 1.5;
    penalised.arrival = 2;
    requests.push_back(greedy);
    requests.push_back(seeded);
    requests.push_back(penalised);
  }
  // Host sampling, sampling by the model, and the model's sampling with overlap scheduling (the
  // runner's default launch / collect): the requests with a penalty arrive after the others have
  // finished in that run, so the first ones overlap and the last ones do not.
  std::vector<std::vector<std::vector<ChoiceRun>>> runs;
  for (const int mode : {0, 1, 2}) {
    const bool on = mode > 0;
    RuntimeOptions options;
    options.model.device = "cpu";
    options.kv_dtype = DType::kF32;
    options.num_pages = 256;
    options.model_sampling = on;
    auto runtime = ModelRuntime::open(dir, options);
    EXPECT_EQ(runtime->prefers_model_sampling(), on);
    EngineConfig config = runtime->engine_config();
    config.max_tokens_per_step = 16;
    if (mode == 2) config.overlap = true;
    Engine engine(config, *runtime);
    std::vector<Request> ordered = requests;
    if (mode == 2) {
      for (size_t i = 2; i < ordered.size(); i += 3) ordered[i].arrival = 200;
    }
    runs.push_back(run_all(engine, ordered));
    engine.clear_prefix_cache();
    EXPECT_EQ(engine.allocator().num_free_pages(), config.num_pages) << "pages leaked";
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(runs[1][i][0].tokens, runs[0][i][0].tokens);
    EXPECT_EQ(runs[1][i][0].logprobs, runs[0][i][0].logprobs);
    // The overlap run batches the requests differently (the later arrivals), which moves the f32
    // logits in their last bits: the same tokens, logprobs within 1e-4.
    EXPECT_EQ(runs[2][i][0].tokens, runs[0][i][0].tokens);
    ASSERT_EQ(runs[2][i][0].logprobs.size(), runs[0][i][0].logprobs.size());
    for (size_t k = 0; k < runs[0][i][0].logprobs.size(); ++k) {
      EXPECT_NEAR(runs[2][i][0].logprobs[k], runs[0][i][0].logprobs[k], 1e-4) << "token " << k;
    }
    if (i % 3 == 0) {
      EXPECT_EQ(runs[1][i][0].tokens, greedy_expected[i / 3]);
    }
  }
}

}  // namespace
}  // namespace pagedattn::engine
