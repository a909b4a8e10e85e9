// A loaded Hugging Face checkpoint: the ModelConfig and every weight as a typed, per-layer
// TensorView, validated against what the architecture expects.
//
// expected_tensors(config) lists each tensor's Hugging Face name and shape for the architecture;
// bind_model_weights() checks a set of named views against that list (missing, unexpected, wrong
// shape, wrong dtype) and fills ModelWeights, reporting every problem of a kind in one Error that
// names the file, the tensor and expected vs got. Checkpoint::open() maps the safetensors files
// (no copy), parses config.json and binds; nothing is kept when it throws.
//
// Weights are row-major as stored: a linear layer's weight is [out_features, in_features] (y = x
// W^T + b). All tensors share one dtype (f32, f16 or bf16: ModelWeights::dtype), except that
// mlp.gate.e_score_correction_bias may also be f32 (DeepSeek-V3 ships it so).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/model_config.h"
#include "pagedattn/safetensors.h"
#include "pagedattn/tensor.h"

namespace pagedattn::model {

// weight [out, in]; bias [out] or absent (bias.defined() == false).
struct LinearWeights {
  TensorView weight;
  TensorView bias;
  bool defined() const { return weight.defined(); }
};

// Llama / Qwen2 / Qwen3 attention (grouped-query).
struct GqaAttentionWeights {
  LinearWeights q_proj;  // [num_attention_heads * head_dim, hidden]
  LinearWeights k_proj;  // [num_key_value_heads * head_dim, hidden]
  LinearWeights v_proj;  // [num_key_value_heads * head_dim, hidden]
  LinearWeights o_proj;  // [hidden, num_attention_heads * head_dim]
  TensorView q_norm;     // Qwen3: [head_dim], else absent
  TensorView k_norm;     // Qwen3: [head_dim], else absent
};

// DeepSeek multi-head latent attention (H = num_attention_heads).
struct MlaAttentionWeights {
  LinearWeights q_proj;              // no q_lora: [H * (qk_nope + qk_rope), hidden], else absent
  LinearWeights q_a_proj;            // q_lora: [q_lora_rank, hidden]
  TensorView q_a_layernorm;          // q_lora: [q_lora_rank]
  LinearWeights q_b_proj;            // q_lora: [H * (qk_nope + qk_rope), q_lora_rank]
  LinearWeights kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope, hidden]: ckv then k_pe
  TensorView kv_a_layernorm;         // [kv_lora_rank]
  // [H * (qk_nope + v_head_dim), kv_lora_rank]: per head, qk_nope rows of W_UK then v_head_dim
  // rows of W_UV.
  LinearWeights kv_b_proj;
  LinearWeights o_proj;  // [hidden, H * v_head_dim]
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)).
struct MlpWeights {
  LinearWeights gate_proj;  // [width, hidden]
  LinearWeights up_proj;    // [width, hidden]
  LinearWeights down_proj;  // [hidden, width]
  bool defined() const { return gate_proj.defined(); }
};

struct MoeWeights {
  TensorView router;                   // mlp.gate.weight [n_routed_experts, hidden]
  TensorView e_score_correction_bias;  // [n_routed_experts] or absent
  std::vector<MlpWeights> experts;     // n_routed_experts, width moe_intermediate_size
  MlpWeights shared_experts;           // width n_shared_experts * moe_intermediate_size, or absent
};

struct DecoderLayerWeights {
  TensorView input_layernorm;           // [hidden]
  TensorView post_attention_layernorm;  // [hidden]
  GqaAttentionWeights attention;        // GQA families
  MlaAttentionWeights mla;              // DeepSeek
  bool is_moe = false;
  MlpWeights mlp;  // dense layers (width intermediate_size)
  MoeWeights moe;  // MoE layers
};

struct ModelWeights {
  DType dtype = DType::kBF16;  // the checkpoint's weight dtype
  TensorView embed_tokens;     // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  TensorView final_norm;  // model.norm.weight [hidden]
  TensorView lm_head;     // [vocab, hidden]; the same view as embed_tokens when tied
  bool tied_lm_head = false;
};

// One tensor the architecture expects.
struct ExpectedTensor {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  bool may_be_f32 = false;  // e_score_correction_bias
};

// Every tensor a checkpoint of `config` holds, in model order (embeddings, layers, norm, lm_head
// unless tied).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// Names that a checkpoint may hold and the runtime ignores (rotary_emb.inv_freq buffers). Binding
// also ignores DeepSeek-V3's multi-token-prediction layers (model.layers.L .. L + n - 1, n =
// num_nextn_predict_layers) and a stored lm_head.weight when the embeddings are tied (transformers
// ignores it too).
bool is_ignored_tensor_name(std::string_view name);

// Looks a tensor up by name: the view, or an undefined view when absent. `where` names the source
// of a tensor in errors (its file).
struct NamedTensorSource {
  std::function<TensorView(std::string_view name)> find;
  std::function<std::string(std::string_view name)> where;
  std::vector<std::string> names;  // every tensor the source holds
  std::string label;               // the source as a whole (the directory)
};

// Checks the source against expected_tensors(config) and binds the views. Throws one Error listing
// every missing tensor, or every unexpected one (except ignored names), or the first wrong shape
// or dtype, each naming the file, the tensor and expected vs got. fp8 block-quantized checkpoints
// (*.weight_scale_inv tensors, F8_E4M3 weights) get "fp8 block-quantized weights are not supported
// yet".
ModelWeights bind_model_weights(const ModelConfig& config, const NamedTensorSource& source);

// A model directory, loaded: config.json parsed, safetensors mapped, weights bound. Move-only; the
// views in weights() point into the mapped files and live as long as this object.
class Checkpoint {
 public:
  // Throws Error (nothing is kept) for a bad directory, config or checkpoint. A config.json with a
  // quantization_config is rejected as fp8 block-quantized (not supported yet).
  static Checkpoint open(const std::filesystem::path& directory);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::filesystem::path& directory() const;
  const ModelConfig& config() const;
  const ModelWeights& weights() const;
  const SafetensorsCheckpoint& files() const;
  // Bytes of all bound weights (the tied lm_head counted once).
  int64_t weight_bytes() const;

 private:
  struct State;
  explicit Checkpoint(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn::model
