// Models without a checkpoint: the named shapes the benchmarks run (a real model's config.json,
// built in), and random weights for any ModelConfig, made in host memory. What `pagedattn bench
// throughput --shape NAME` (and any benchmark or test that needs a model of a given size but not
// its trained values) runs.
//
// Shapes: "qwen3-0.6b" is Qwen3-0.6B's config.json (hidden 1024, 28 layers, 16 q / 8 kv heads of
// 128, intermediate 3072, vocab 151936, tied embeddings, q/k norm, rope_theta 1e6);
// "deepseek-v2-lite" DeepSeek-V2-Lite's (hidden 2048, 27 layers, 16 heads, MLA kv_lora 512 + rope
// 64, no q_lora, 64 routed experts top-6 + 2 shared of width 1408, first layer dense of 10944,
// vocab 102400, yarn factor 40); "tiny" a Qwen3-architecture model of about 6M parameters (hidden
// 256, 4 layers, 4 q / 2 kv heads of 64, intermediate 768, vocab 10240: random prompt ids of up to
// 10000 fit) that a CPU runs through a whole benchmark workload in about a minute.
//
// Random weights: every tensor expected_tensors(config) lists, in `dtype` (bf16 by default), bound
// with bind_model_weights exactly as a checkpoint's would be. Norm weights are 1 (RMSNorm as
// initialised); everything else is uniform in [-a, a] with a = 0.02 * sqrt(3) (standard deviation
// 0.02, transformers' initializer_range), so that the residual stream stays near unit scale after
// each norm and activations stay finite through any depth. Values are a counter-based hash of
// (seed, tensor, element): the same seed gives the same model on any thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/checkpoint.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model {

// "tiny", "qwen3-0.6b", "deepseek-v2-lite".
std::vector<std::string> model_shape_names();
// The shape's ModelConfig (parsed from its built-in config.json text). Throws Error naming the
// name and listing the shapes for an unknown one.
ModelConfig model_shape(std::string_view name);
// The built-in config.json text of a shape (what model_shape parses).
std::string_view model_shape_config_json(std::string_view name);

class RandomWeights;
// Random weights for `config` (f32, f16 or bf16; see above). Throws Error for another dtype.
RandomWeights random_weights(const ModelConfig& config, uint64_t seed, DType dtype = DType::kBF16);

// Host buffers holding a model's random weights and the ModelWeights views into them. Move-only;
// the views stay valid across moves (the buffers are heap allocations that do not move).
class RandomWeights {
 public:
  RandomWeights(RandomWeights&&) noexcept;
  RandomWeights& operator=(RandomWeights&&) noexcept;
  ~RandomWeights();

  const ModelWeights& weights() const;
  // Bytes of all bound weights (the tied lm_head counted once).
  int64_t bytes() const;

 private:
  friend RandomWeights random_weights(const ModelConfig& config, uint64_t seed, DType dtype);
  struct State;
  explicit RandomWeights(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn::model
