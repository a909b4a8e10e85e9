// A model's shape, read from a Hugging Face `config.json`: the architecture (chosen by
// `architectures`, else `model_type`), the transformer dimensions, RoPE (type, scaling, layout and
// the inverse frequencies it implies), and for DeepSeek-V2/V3 the MLA and MoE fields.
//
// Both config styles are read: transformers 5's `rope_parameters{rope_type, rope_theta, ...}` and
// the hub's top-level `rope_theta` + `rope_scaling{type|rope_type, ...}`. Anything the runtime
// cannot honour (an unknown architecture, hidden_act other than silu, a sliding window in use,
// dynamic NTK RoPE, fp8 block quantization) is an Error that names the field, its value and what is
// supported, never a silently wrong model.
//
// Numbers follow transformers 5 (modeling_rope_utils and the modeling_*.py of each family); the
// fields are spelled as in config.json so that a reader can match them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/dtype.h"

namespace pagedattn::model {

enum class Architecture : uint8_t { kLlama, kQwen2, kQwen3, kDeepseekV2, kDeepseekV3 };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "DeepseekV2ForCausalLM",
// "DeepseekV3ForCausalLM".
std::string_view architecture_name(Architecture architecture);

enum class RopeType : uint8_t {
  kDefault,  // inv_freq[i] = theta^(-2i / rotary_dim)
  kLinear,   // default / factor
  kLlama3,   // Llama 3.1: low frequencies / factor, a smooth ramp between the two wavelengths
  kYarn,     // YaRN: ramp between interpolation and extrapolation; cos/sin * attention_factor
};
std::string_view rope_type_name(RopeType type);  // "default", "linear", "llama3", "yarn"

// How the rotary dimensions of a head are paired.
enum class RopeLayout : uint8_t {
  // Llama / Qwen / transformers' rotate_half: element i pairs with element i + rotary_dim / 2, both
  // rotated by inv_freq[i].
  kNeox,
  // GPT-J / DeepSeek: elements 2i and 2i + 1 form a pair rotated by inv_freq[i]. transformers'
  // DeepSeek-V2 uses complex multiplication on (2i, 2i + 1); DeepSeek-V3 (rope_interleave = true)
  // permutes q_pe and k_pe to [evens, odds] then applies rotate_half, which gives the same q.k dot
  // products: a runtime that rotates pairs (2i, 2i + 1) in place and caches k_pe that way matches.
  kInterleaved,
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  RopeLayout layout = RopeLayout::kNeox;
  double theta = 10000.0;  // rope_theta
  // Number of leading dimensions of each head that are rotated (the rest pass through):
  // head_dim * partial_rotary_factor; qk_rope_head_dim for MLA. Always even.
  int64_t rotary_dim = 0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;  // linear, llama3 and yarn
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the pre-training context (yarn: defaults to max_position_embeddings).
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;                     // absent when the config has none (or 0 / null)
  std::optional<double> mscale_all_dim;             // absent when the config has none (or 0 / null)
  std::optional<double> attention_factor_override;  // an explicit `attention_factor`
  bool truncate = true;  // yarn: floor/ceil the correction range (transformers' `truncate`)

  // rotary_dim / 2 inverse frequencies (radians per position), computed in float64 with
  // transformers' formulas (transformers computes them in float32; they agree to ~1e-7 relative).
  std::vector<double> inverse_frequencies() const;
  // The factor transformers multiplies cos and sin by: 1 except for yarn, where it is
  // attention_factor if given, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
  // when both are set, else get_mscale(factor) = 0.1 ln(factor) + 1 (1 when factor <= 1).
  double attention_scaling() const;
};

// DeepSeek multi-head latent attention dimensions.
struct MlaConfig {
  int64_t q_lora_rank =
      0;  // 0 = no q compression (q_proj), else q_a_proj / q_a_layernorm / q_b_proj
  int64_t kv_lora_rank = 0;      // 512 in real models: the compressed KV (ckv) width
  int64_t qk_nope_head_dim = 0;  // 128 in real models
  int64_t qk_rope_head_dim = 0;  // 64 in real models: the kpe width
  int64_t v_head_dim = 0;        // 128 in real models
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool has_q_lora() const { return q_lora_rank > 0; }
};

enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };  // scoring_func
enum class MoeTopkMethod : uint8_t {
  kGreedy,              // top-k over all experts (DeepSeek-V2-Lite)
  kGroupLimitedGreedy,  // top-k over the experts of the topk_group best groups (group score = max)
  kNoAuxTc,             // V3: scores + e_score_correction_bias choose; group score = sum of top-2
};
std::string_view moe_scoring_name(MoeScoring scoring);  // "softmax", "sigmoid"
std::string_view moe_topk_method_name(
    MoeTopkMethod method);  // "greedy", "group_limited_greedy", ...

// DeepSeek mixture of experts. A layer is MoE when layer >= first_k_dense_replace (moe_layer_freq
// must be 1: transformers ignores it, so other values are rejected rather than guessed).
struct MoeConfig {
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_shared_experts = 0;  // one shared MLP of width n_shared_experts * moe_intermediate_size
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double routed_scaling_factor = 1.0;  // multiplies the routed experts' weighted sum
  bool norm_topk_prob = false;         // renormalise the top-k weights to sum 1 (V3: + 1e-20)
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeTopkMethod topk_method = MoeTopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // The router has a per-expert bias added to the scores for the choice only (noaux_tc); the file
  // then holds mlp.gate.e_score_correction_bias [n_routed_experts].
  bool has_e_score_correction_bias = false;

  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // as in the file ("llama", "qwen2", "qwen3", "deepseek_v2", ...)

  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // = num_attention_heads when absent (MLA: unused)
  // GQA families: head_dim when given, else hidden_size / num_attention_heads. MLA: v_head_dim is
  // in `mla`; head_dim here is qk_rope_head_dim, as transformers sets it.
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // the dense MLP width
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens (absent from the file)
  // Biases of the attention projections: Qwen2 always q/k/v (not o); Llama and Qwen3 q/k/v/o when
  // attention_bias is true. DeepSeek with attention_bias is rejected.
  bool attention_bias = false;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj carry a bias
  bool o_bias = false;    // o_proj carries a bias
  bool qk_norm =
      false;  // Qwen3: RMSNorm over each head of q and k (weights [head_dim]) before RoPE
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // `eos_token_id`, an int or a list
  std::optional<int64_t> pad_token_id;
  std::optional<DType> dtype;       // `dtype` / `torch_dtype` (f32, f16, bf16) when given
  std::string hidden_act = "silu";  // only silu is accepted
  // quantization_config.quant_method ("fp8", ...) when config.json has one, else empty. The config
  // parses; Checkpoint::open rejects such checkpoints (block-quantized weights are not supported).
  std::string quantization_method;

  RopeConfig rope;
  std::optional<MlaConfig> mla;  // DeepSeek-V2/V3
  std::optional<MoeConfig> moe;  // DeepSeek-V2/V3 (n_routed_experts set)
  // DeepSeek-V3's multi-token-prediction layers (model.layers.L .. L + n - 1 in the file, L =
  // num_hidden_layers): not run, their tensors are ignored on load.
  int64_t num_nextn_predict_layers = 0;

  bool is_mla() const { return mla.has_value(); }
  bool is_moe_layer(int64_t layer) const { return moe && moe->is_moe_layer(layer); }
  // The attention softmax scale transformers uses. GQA: head_dim^-0.5. MLA: qk_head_dim^-0.5, times
  // mscale^2 with mscale = 0.1 mscale_all_dim ln(factor) + 1 when rope is yarn with a non-zero
  // mscale_all_dim and factor > 1 (DeepSeek-V2-Lite 0.114721, V3 0.135234). In the absorbed
  // 576-wide MLA decode path the same scale applies (it is not 576^-0.5).
  double softmax_scale() const;
};

// Parses config.json text; `source` names the file in errors. Throws Error on anything invalid or
// unsupported, naming the field, the value and what is expected.
ModelConfig parse_model_config(std::string_view json_text, std::string_view source = "config.json");
// Reads `path` (config.json itself or the model directory holding it).
ModelConfig load_model_config(const std::filesystem::path& path);

// The architectures accepted, for error messages and `--help`: "LlamaForCausalLM, ...".
std::string supported_architectures();

}  // namespace pagedattn::model
