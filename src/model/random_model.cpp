// The named model shapes (their config.json built in) and random weights for any config (see
// include/pagedattn/model_random.h).
//
// Weights: one 64-byte-aligned host buffer per expected tensor, filled in parallel (OpenMP over
// elements; value i of tensor t is a function of (seed, t, i) only), then bound through
// bind_model_weights, the checkpoint loader's own checks, so a random model is shaped exactly as
// a loaded one.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "core/check.h"
#include "pagedattn/model_random.h"

namespace pagedattn::model {

namespace {

// Qwen3-0.6B's config.json as published (Qwen/Qwen3-0.6B); tests/data/model/configs holds the same.
constexpr std::string_view kQwen3_0_6B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// DeepSeek-V2-Lite's config.json as published (deepseek-ai/DeepSeek-V2-Lite), less auto_map.
constexpr std::string_view kDeepseekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 100000,
  "eos_token_id": 100001,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 10944,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 64,
  "n_shared_experts": 2,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 27,
  "num_key_value_heads": 16,
  "pretraining_tp": 1,
  "q_lora_rank": null,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 1.0,
  "scoring_func": "softmax",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "greedy",
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 102400
})";

// A Qwen3-architecture model small enough for a CPU to run a whole workload: the vocabulary holds
// the random prompt ids of nano-vllm's workload ([0, 10000]).
constexpr std::string_view kTiny = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "attention_bias": false,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 256,
  "intermediate_size": 768,
  "max_position_embeddings": 4096,
  "num_attention_heads": 4,
  "num_hidden_layers": 4,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 10240
})";

struct NamedShape {
  std::string_view name;
  std::string_view json;
};
constexpr NamedShape kShapes[] = {
    {"tiny", kTiny}, {"qwen3-0.6b", kQwen3_0_6B}, {"deepseek-v2-lite", kDeepseekV2Lite}};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool is_norm_weight(std::string_view name) {
  return name.ends_with("norm.weight") || name.ends_with("layernorm.weight");
}

HostTensor make_tensor(DType dtype, const std::vector<int64_t>& shape, const std::string& name) {
  switch (shape.size()) {
    case 1:
      return HostTensor(dtype, {shape[0]});
    case 2:
      return HostTensor(dtype, {shape[0], shape[1]});
    default:
      PA_FAIL("random_weights: tensor '{}' has {} dimensions (expected 1 or 2)", name,
              shape.size());
  }
}

// Fills `tensor` with the values of tensor number `index` (see the header).
void fill(const HostTensor& tensor, bool norm, uint64_t seed, uint64_t index) {
  const int64_t n = tensor.numel();
  const DType dtype = tensor.view().dtype;
  const uint64_t key = splitmix64(seed ^ splitmix64(index + 1));
  const float bound = static_cast<float>(0.02 * std::sqrt(3.0));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float value = 1.0f;
    if (!norm) {
      const uint64_t bits = splitmix64(key + static_cast<uint64_t>(i));
      const float unit = static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1)
      value = (2.0f * unit - 1.0f) * bound;
    }
    switch (dtype) {
      case DType::kF32:
        tensor.data<float>()[i] = value;
        break;
      case DType::kF16:
        tensor.data<uint16_t>()[i] = float_to_half(value);
        break;
      default:
        tensor.data<uint16_t>()[i] = float_to_bf16(value);
        break;
    }
  }
}

}  // namespace

std::vector<std::string> model_shape_names() {
  std::vector<std::string> names;
  for (const NamedShape& shape : kShapes) names.emplace_back(shape.name);
  return names;
}

std::string_view model_shape_config_json(std::string_view name) {
  for (const NamedShape& shape : kShapes) {
    if (shape.name == name) return shape.json;
  }
  PA_FAIL("model shape '{}' is not known (expected one of: {})", name,
          fmt::join(model_shape_names(), ", "));
}

ModelConfig model_shape(std::string_view name) {
  return parse_model_config(model_shape_config_json(name),
                            fmt::format("the built-in config of shape '{}'", name));
}

struct RandomWeights::State {
  std::map<std::string, HostTensor, std::less<>> tensors;
  ModelWeights weights;
  int64_t bytes = 0;
};

RandomWeights::RandomWeights(std::unique_ptr<State> state) : state_(std::move(state)) {}
RandomWeights::RandomWeights(RandomWeights&&) noexcept = default;
RandomWeights& RandomWeights::operator=(RandomWeights&&) noexcept = default;
RandomWeights::~RandomWeights() = default;

const ModelWeights& RandomWeights::weights() const { return state_->weights; }
int64_t RandomWeights::bytes() const { return state_->bytes; }

RandomWeights random_weights(const ModelConfig& config, uint64_t seed, DType dtype) {
  PA_CHECK(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32,
           "random_weights: dtype {} (expected bf16, f16 or f32)", dtype_name(dtype));
  auto state = std::make_unique<RandomWeights::State>();
  const std::vector<ExpectedTensor> expected = expected_tensors(config);
  for (size_t t = 0; t < expected.size(); ++t) {
    const ExpectedTensor& e = expected[t];
    HostTensor tensor = make_tensor(dtype, e.shape, e.name);
    fill(tensor, is_norm_weight(e.name), seed, t);
    state->bytes += tensor.bytes();
    state->tensors.emplace(e.name, std::move(tensor));
  }
  NamedTensorSource source;
  source.label =
      fmt::format("random weights ({}, seed {})", architecture_name(config.architecture), seed);
  for (const auto& [name, tensor] : state->tensors) source.names.push_back(name);
  const auto& tensors = state->tensors;
  source.find = [&tensors](std::string_view name) {
    const auto it = tensors.find(name);
    return it == tensors.end() ? TensorView{} : it->second.view();
  };
  state->weights = bind_model_weights(config, source);
  return RandomWeights(std::move(state));
}

}  // namespace pagedattn::model
