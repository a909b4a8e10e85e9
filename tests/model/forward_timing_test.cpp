// A rough CPU decode-step timing of random-weight models built from real configs (DISABLED_: run
// with --gtest_also_run_disabled_tests; PAGEDATTN_TIMING_LAYERS sets the layers built, default 4,
// and the per-layer time is reported so that the full depth can be extrapolated without holding
// the whole model in this machine's memory). Not a benchmark (that is `pagedattn bench model`);
// the figures go to bench/RESULTS.md with the command.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_random.h"

namespace pagedattn::model {
namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void time_config(const std::string& file, int64_t full_layers_hint, ops::WeightMode mode) {
  ModelConfig config = testing::load_hub_config(file);
  const int64_t full_layers = config.num_hidden_layers;
  const char* env = std::getenv("PAGEDATTN_TIMING_LAYERS");
  config.num_hidden_layers =
      std::min<int64_t>(full_layers, env ? std::atoll(env) : full_layers_hint);
  const RandomWeights random = random_weights(config, 1);
  ModelOptions options;
  options.device = "cpu";
  options.max_positions = 4096;
  options.weight_mode = mode;
  Model model(config, random.weights(), options);
  for (int batch : {1, 16}) {
    const int context = 512;
    KvPoolConfig pool_config;
    pool_config.alloc_page_size = 16;
    pool_config.num_pages = batch * (context / 16 + 2);
    KvPool pool = model.make_kv_pool(pool_config);
    testing::PageSource pages(pool.num_pages(), 1);
    std::vector<testing::Sequence> seqs(static_cast<size_t>(batch));
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(batch),
                                             std::vector<int32_t>(1, 7));
    // Fill the context by one prefill per request (timed separately), then time decode steps.
    const std::vector<int32_t> prompt(static_cast<size_t>(context), 11);
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& seq : seqs) {
      seq.reserve(context + 16, 16, pages);
      Step step;
      step.requests.push_back({prompt, 0, {}, seq.block_table});
      model.forward(step, pool);
      seq.tokens = prompt;
    }
    const double prefill_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        batch;
    std::vector<double> step_ms;
    for (int i = 0; i < 8; ++i) {
      Step step;
      for (size_t r = 0; r < seqs.size(); ++r) {
        step.requests.push_back(
            {tokens[r], static_cast<int32_t>(seqs[r].tokens.size()), {}, seqs[r].block_table});
      }
      const auto s = std::chrono::steady_clock::now();
      model.forward(step, pool);
      step_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
      for (auto& seq : seqs) seq.tokens.push_back(7);
    }
    fmt::print(
        "{} ({} of {} layers, bf16 weights, owned {} MiB, {} threads): prefill {} "
        "tokens {:.1f} ms/request; decode B={} ctx {}: {:.2f} ms/step median\n",
        file, config.num_hidden_layers, full_layers, model.owned_bytes() >> 20, ops::num_threads(),
        context, prefill_ms, batch, context, median_ms(step_ms));
  }
}

TEST(ForwardTiming, DISABLED_RandomModels) {
  fmt::print("{}\n", ops::blas_info());
  time_config("qwen3_0_6b.json", 4, ops::WeightMode::kAuto);
  // 64 experts of 3 x 2048 x 1408 per MoE layer: kept bf16 (tiles converted per call) so that
  // the second layer fits beside everyone else's work on a small machine.
  time_config("deepseek_v2_lite.json", 2, ops::WeightMode::kConvertTiles);
}

}  // namespace
}  // namespace pagedattn::model
