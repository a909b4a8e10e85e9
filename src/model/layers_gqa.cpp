// Grouped-query attention for Llama, Qwen2 and Qwen3, and the linear-layer helper.
//
// One GEMM computes q, k and v side by side ([T, (Hq + 2 Hkv) D], the three weights stacked, with
// Qwen2's biases); q, k, v are strided views into it. Qwen3 normalizes each head of q and k
// (q_norm / k_norm over D) before RoPE; RoPE rotates q and k in place (NeoX); store_kv writes k and
// v into the step's slots; the backend attends (decode: one row per request; else prefill, causal,
// the new rows aligned to the end of each request's KV); o_proj maps [T, Hq D] back to hidden.
#include <fmt/format.h>

#include "core/check.h"
#include "model/layers.h"

namespace pagedattn::model {

ops::Linear make_linear(const std::string& name, std::initializer_list<const LinearWeights*> parts,
                        ops::WeightMode mode) {
  std::vector<ops::LinearPart> list;
  for (const LinearWeights* p : parts) list.push_back({p->weight, p->bias});
  return ops::Linear(name, list, mode);
}

namespace {

class GqaAttention final : public AttentionLayer {
 public:
  GqaAttention(const ModelConfig& config, const GqaAttentionWeights& w, int64_t layer,
               ops::WeightMode mode)
      : heads_(config.num_attention_heads),
        kv_heads_(config.num_key_value_heads),
        head_dim_(config.head_dim),
        eps_(static_cast<float>(config.rms_norm_eps)),
        q_norm_(w.q_norm),
        k_norm_(w.k_norm) {
    const std::string prefix = fmt::format("model.layers.{}.self_attn", layer);
    qkv_ = make_linear(prefix + ".qkv_proj", {&w.q_proj, &w.k_proj, &w.v_proj}, mode);
    o_ = make_linear(prefix + ".o_proj", {&w.o_proj}, mode);
    PA_CHECK(qkv_.out_features() == (heads_ + 2 * kv_heads_) * head_dim_,
             "{}: q/k/v give {} features (expected ({} + 2 x {}) heads x {})", prefix,
             qkv_.out_features(), heads_, kv_heads_, head_dim_);
  }

  void forward(const TensorView& x, const StepContext& step, const KvPool& pool, int64_t layer,
               const TensorView& out) override {
    const int64_t t = step.tokens, width = (heads_ + 2 * kv_heads_) * head_dim_;
    float* qkv = qkv_buffer_.get(t * width);
    qkv_.forward(x, f32_view(qkv, {t, width}));
    const auto heads_view = [&](int64_t offset_heads, int64_t count) {
      TensorView v = TensorView::contiguous(qkv + offset_heads * head_dim_, DType::kF32,
                                            {t, count, head_dim_});
      v.strides[0] = width;
      return v;
    };
    const TensorView q = heads_view(0, heads_), k = heads_view(heads_, kv_heads_),
                     v = heads_view(heads_ + kv_heads_, kv_heads_);
    if (q_norm_.defined()) {
      ops::rms_norm(q, q_norm_, eps_, q);
      ops::rms_norm(k, k_norm_, eps_, k);
    }
    ops::apply_rope(q, step.positions, *step.rope, step.rope_style);
    ops::apply_rope(k, step.positions, *step.rope, step.rope_style);
    const PagedKv kv = pool.layer_kv(layer);
    store_kv(kv, k, v, step.slot_view);

    float* attn = attn_buffer_.get(t * heads_ * head_dim_);
    const TensorView attn_view = f32_view(attn, {t, heads_, head_dim_});
    AttentionOptions options;
    options.sm_scale = step.sm_scale;
    options.causal = true;
    if (step.decode) {
      DecodeArgs args{q, kv, step.meta, attn_view, {}, options};
      step.backend->run_decode(*step.workspace, args);
    } else {
      PrefillArgs args{q, kv, step.meta, attn_view, {}, options};
      step.backend->run_prefill(*step.workspace, args);
    }
    o_.forward(f32_view(attn, {t, heads_ * head_dim_}), out);
  }

  int64_t owned_bytes() const override { return qkv_.owned_bytes() + o_.owned_bytes(); }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  float eps_;
  TensorView q_norm_, k_norm_;
  ops::Linear qkv_, o_;
  Scratch qkv_buffer_, attn_buffer_;
};

class DenseMlp final : public MlpLayer {
 public:
  DenseMlp(const MlpWeights& w, const std::string& name, ops::WeightMode mode)
      : gate_up_(make_linear(name + ".gate_up_proj", {&w.gate_proj, &w.up_proj}, mode)),
        down_(make_linear(name + ".down_proj", {&w.down_proj}, mode)) {}

  void forward(const TensorView& x, const TensorView& out) override {
    const int64_t t = x.shape[0], width = down_.in_features();
    float* gate_up = gate_up_buffer_.get(t * 2 * width);
    float* act = act_buffer_.get(t * width);
    gate_up_.forward(x, f32_view(gate_up, {t, 2 * width}));
    ops::silu_mul(f32_view(gate_up, {t, 2 * width}), f32_view(act, {t, width}));
    down_.forward(f32_view(act, {t, width}), out);
  }

  int64_t owned_bytes() const override { return gate_up_.owned_bytes() + down_.owned_bytes(); }

 private:
  ops::Linear gate_up_, down_;
  Scratch gate_up_buffer_, act_buffer_;
};

}  // namespace

std::unique_ptr<AttentionLayer> make_gqa_attention(const ModelConfig& config,
                                                   const GqaAttentionWeights& weights,
                                                   int64_t layer, ops::WeightMode mode) {
  return std::make_unique<GqaAttention>(config, weights, layer, mode);
}

std::unique_ptr<MlpLayer> make_dense_mlp(const MlpWeights& weights, const std::string& name,
                                         ops::WeightMode mode) {
  return std::make_unique<DenseMlp>(weights, name, mode);
}

}  // namespace pagedattn::model
