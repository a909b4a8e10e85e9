// The layer recipes a Model is made of, and the per-step context they share.
//
// A decoder layer is: residual += previous output, x = input_norm(residual); attention(x);
// residual += attention, x = post_attention_norm(residual); mlp(x). The families differ only in
// the attention (GqaAttention with or without q/k/v biases and Qwen3's q_norm / k_norm;
// MlaAttention for DeepSeek) and the MLP (DenseMlp, or MoeMlp with shared experts).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedattn/backend.h"
#include "pagedattn/linear.h"
#include "pagedattn/model.h"
#include "pagedattn/moe.h"
#include "pagedattn/ops.h"
#include "pagedattn/planner.h"

namespace pagedattn::model {

// Grow-only f32 scratch (a layer's intermediate activations); reused across steps.
class Scratch {
 public:
  float* get(int64_t elements) {
    if (static_cast<int64_t>(data_.size()) < elements) data_.resize(static_cast<size_t>(elements));
    return data_.data();
  }

 private:
  std::vector<float> data_;
};

inline TensorView f32_view(float* data, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(data, DType::kF32, shape);
}

// What every layer of one step shares: the new tokens' positions and KV slots, the attention
// metadata planned once, and the backend that runs it.
struct StepContext {
  int64_t tokens = 0;              // T: new tokens of all requests
  bool decode = false;             // every request has exactly one new token
  std::vector<int32_t> positions;  // [T]
  std::vector<int64_t> slots;      // [T] page * alloc_page_size + offset
  TensorView slot_view;            // i64 [T]
  StepMetadata meta;
  const Backend* backend = nullptr;  // runs this step's attention op
  Workspace* workspace = nullptr;    // planned for it
  const ops::RopeTable* rope = nullptr;
  ops::RopeStyle rope_style = ops::RopeStyle::kNeox;
  float sm_scale = 0.0f;
};

class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;
  // out [T, hidden] = attention(x [T, hidden]); stores the step's K/V (or latent) into `pool`.
  virtual void forward(const TensorView& x, const StepContext& step, const KvPool& pool,
                       int64_t layer, const TensorView& out) = 0;
  virtual int64_t owned_bytes() const = 0;
};

class MlpLayer {
 public:
  virtual ~MlpLayer() = default;
  virtual void forward(const TensorView& x, const TensorView& out) = 0;
  virtual int64_t owned_bytes() const = 0;
};

std::unique_ptr<AttentionLayer> make_gqa_attention(const ModelConfig& config,
                                                   const GqaAttentionWeights& weights,
                                                   int64_t layer, ops::WeightMode mode);
std::unique_ptr<AttentionLayer> make_mla_attention(const ModelConfig& config,
                                                   const MlaAttentionWeights& weights,
                                                   int64_t layer, ops::WeightMode mode);
std::unique_ptr<MlpLayer> make_dense_mlp(const MlpWeights& weights, const std::string& name,
                                         ops::WeightMode mode);
std::unique_ptr<MlpLayer> make_moe_mlp(const ModelConfig& config, const MoeWeights& weights,
                                       int64_t layer, ops::WeightMode mode);

// The router of a DeepSeek MoE layer as ops::moe_route takes it (V2 softmax greedy or
// group-limited, V3 sigmoid noaux_tc); Error for a scoring / top-k method pair not supported.
ops::MoeRouterConfig moe_router_config(const MoeConfig& moe);

// The Linear of one checkpoint projection, or of several stacked (q/k/v, gate/up).
ops::Linear make_linear(const std::string& name, std::initializer_list<const LinearWeights*> parts,
                        ops::WeightMode mode);

// The model's RoPE table: options.max_positions rows, else config.max_position_embeddings; Error
// when that is not positive. The CPU and the CUDA model both build theirs here.
ops::RopeTable make_rope_table(const ModelConfig& config, const ModelOptions& options);

}  // namespace pagedattn::model
