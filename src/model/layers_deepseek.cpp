// DeepSeek-V2/V3 layers: multi-head latent attention (absorbed) and the MoE MLP.
//
// MLA, per step (H heads; nope, rope, v: the per-head dims; rank: kv_lora_rank):
//   q      = q_proj(x), or q_b_proj(rms_norm(q_a_proj(x)))           [T, H, nope + rope]
//   kv_a   = kv_a_proj_with_mqa(x)                                   [T, rank + rope]
//   ckv    = kv_a_layernorm(kv_a[:, :rank]); k_pe = RoPE(kv_a[:, rank:]); q_pe = RoPE(q[.., nope:])
//   store_latent(ckv, k_pe) -> the 576-wide (rank + rope) cache row of each new token
//   q_lat  = q_nope_h · W_UK_h for each head h (W_UK_h [nope, rank]: kv_b_proj's first nope rows
//            of head h)                                              [T, H, rank]
//   o_lat  = run_mla(q_lat, q_pe, cache)  (softmax scale from the config: mscale² / sqrt(nope +
//            rope), not 1/sqrt(rank + rope))                         [T, H, rank]
//   o_h    = o_lat_h · W_UV_hᵀ (W_UV_h [v, rank]: the next v rows)   [T, H v]
//   out    = o_proj(o)
// Absorbing W_UK into q makes q·k over the latent equal q_nope·k_nope (k_nope_h = W_UK_h ckv), and
// W_UV after attention equals attending over v_h = W_UV_h ckv, so one latent cache serves prefill
// and decode. kv_b_proj is kept as f32 for the per-head GEMMs.
//
// MoE: router logits = gate(x) in f32; ops::moe_route (V2 softmax greedy / group-limited, V3
// sigmoid noaux_tc); the routed experts as grouped GEMMs (ops::MoeExperts); plus the shared
// experts' MLP on every token.
#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"
#include "model/layers.h"

namespace pagedattn::model {
namespace {

TensorView strided(float* data, std::initializer_list<int64_t> shape, int64_t row_stride) {
  TensorView v = TensorView::contiguous(data, DType::kF32, shape);
  v.strides[0] = row_stride;
  return v;
}

class MlaAttention final : public AttentionLayer {
 public:
  MlaAttention(const ModelConfig& config, const MlaAttentionWeights& w, int64_t layer,
               ops::WeightMode mode)
      : heads_(config.num_attention_heads),
        nope_(config.mla->qk_nope_head_dim),
        rope_(config.mla->qk_rope_head_dim),
        v_(config.mla->v_head_dim),
        rank_(config.mla->kv_lora_rank),
        eps_(static_cast<float>(config.rms_norm_eps)),
        q_a_norm_(w.q_a_layernorm),
        kv_a_norm_(w.kv_a_layernorm) {
    const std::string prefix = fmt::format("model.layers.{}.self_attn", layer);
    if (config.mla->has_q_lora()) {
      q_a_ = make_linear(prefix + ".q_a_proj", {&w.q_a_proj}, mode);
      q_ = make_linear(prefix + ".q_b_proj", {&w.q_b_proj}, mode);
    } else {
      q_ = make_linear(prefix + ".q_proj", {&w.q_proj}, mode);
    }
    kv_a_ = make_linear(prefix + ".kv_a_proj_with_mqa", {&w.kv_a_proj_with_mqa}, mode);
    o_ = make_linear(prefix + ".o_proj", {&w.o_proj}, mode);
    const TensorView& kv_b = w.kv_b_proj.weight;
    PA_CHECK(kv_b.ndim == 2 && kv_b.shape[0] == heads_ * (nope_ + v_) && kv_b.shape[1] == rank_,
             "{}.kv_b_proj: shape {} (expected [{}, {}])", prefix, kv_b.shape_str(),
             heads_ * (nope_ + v_), rank_);
    PA_CHECK(!w.kv_b_proj.bias.defined(), "{}.kv_b_proj: a bias is not supported", prefix);
    kv_b_.resize(static_cast<size_t>(kv_b.shape[0] * rank_));
    dispatch_float(kv_b.dtype, prefix + ".kv_b_proj", [&](auto tag) {
      using T = decltype(tag);
      const auto* src = static_cast<const T*>(kv_b.data);
      for (int64_t r = 0; r < kv_b.shape[0]; ++r) {
        for (int64_t c = 0; c < rank_; ++c) {
          kv_b_[static_cast<size_t>(r * rank_ + c)] =
              to_float(src[r * kv_b.strides[0] + c * kv_b.strides[1]]);
        }
      }
    });
  }

  void forward(const TensorView& x, const StepContext& step, const KvPool& pool, int64_t layer,
               const TensorView& out) override {
    const int64_t t = step.tokens, qk = nope_ + rope_, q_width = heads_ * qk;
    float* q = q_buffer_.get(t * q_width);
    if (q_a_.defined()) {
      const int64_t lora = q_a_.out_features();
      float* qa = qa_buffer_.get(t * lora);
      q_a_.forward(x, f32_view(qa, {t, lora}));
      ops::rms_norm(f32_view(qa, {t, lora}), q_a_norm_, eps_, f32_view(qa, {t, lora}));
      q_.forward(f32_view(qa, {t, lora}), f32_view(q, {t, q_width}));
    } else {
      q_.forward(x, f32_view(q, {t, q_width}));
    }
    const int64_t kv_width = rank_ + rope_;
    float* kv_a = kv_a_buffer_.get(t * kv_width);
    kv_a_.forward(x, f32_view(kv_a, {t, kv_width}));
    const TensorView ckv = strided(kv_a, {t, rank_}, kv_width);
    ops::rms_norm(ckv, kv_a_norm_, eps_, ckv);
    TensorView k_pe = strided(kv_a + rank_, {t, 1, rope_}, kv_width);
    TensorView q_pe = strided(q + nope_, {t, heads_, rope_}, q_width);
    q_pe.strides[1] = qk;
    ops::apply_rope(q_pe, step.positions, *step.rope, step.rope_style);
    ops::apply_rope(k_pe, step.positions, *step.rope, step.rope_style);
    const PagedLatent cache = pool.layer_latent(layer);
    store_latent(cache, ckv, strided(kv_a + rank_, {t, rope_}, kv_width), step.slot_view);

    // q_lat[t, h] = q_nope[t, h] · W_UK_h, one GEMM per head over all tokens.
    float* q_lat = q_lat_buffer_.get(t * heads_ * rank_);
    // Threads only for products worth a fork/join (see ops::Linear).
    const bool parallel =
        heads_ > 1 && t * heads_ * rank_ * std::max(nope_, v_) >= (int64_t{1} << 19);
#pragma omp parallel for if (parallel)
    for (int64_t h = 0; h < heads_; ++h) {
      ops::gemm_f32(false, t, rank_, nope_, 1.0f, q + h * qk, q_width,
                    kv_b_.data() + h * (nope_ + v_) * rank_, rank_, 0.0f, q_lat + h * rank_,
                    heads_ * rank_);
    }
    float* o_lat = o_lat_buffer_.get(t * heads_ * rank_);
    MlaArgs args;
    args.q_nope = f32_view(q_lat, {t, heads_, rank_});
    args.q_pe = q_pe;
    args.kv = cache;
    args.meta = step.meta;
    args.out = f32_view(o_lat, {t, heads_, rank_});
    args.sm_scale = step.sm_scale;
    args.causal = true;
    step.backend->run_mla(*step.workspace, args);

    float* o = o_buffer_.get(t * heads_ * v_);
#pragma omp parallel for if (parallel)
    for (int64_t h = 0; h < heads_; ++h) {
      ops::gemm_f32(true, t, v_, rank_, 1.0f, o_lat + h * rank_, heads_ * rank_,
                    kv_b_.data() + (h * (nope_ + v_) + nope_) * rank_, rank_, 0.0f, o + h * v_,
                    heads_ * v_);
    }
    o_.forward(f32_view(o, {t, heads_ * v_}), out);
  }

  int64_t owned_bytes() const override {
    return q_a_.owned_bytes() + q_.owned_bytes() + kv_a_.owned_bytes() + o_.owned_bytes() +
           static_cast<int64_t>(kv_b_.size() * sizeof(float));
  }

 private:
  int64_t heads_, nope_, rope_, v_, rank_;
  float eps_;
  TensorView q_a_norm_, kv_a_norm_;
  ops::Linear q_a_, q_, kv_a_, o_;
  std::vector<float> kv_b_;  // [H (nope + v), rank] f32
  Scratch q_buffer_, qa_buffer_, kv_a_buffer_, q_lat_buffer_, o_lat_buffer_, o_buffer_;
};

class MoeMlp final : public MlpLayer {
 public:
  MoeMlp(const ModelConfig& config, const MoeWeights& w, int64_t layer, ops::WeightMode mode)
      : bias_(w.e_score_correction_bias) {
    const MoeConfig& moe = *config.moe;
    const std::string prefix = fmt::format("model.layers.{}.mlp", layer);
    const std::vector<ops::LinearPart> router_part = {{w.router, {}}};
    router_ = ops::Linear(prefix + ".gate", router_part, ops::WeightMode::kCachedF32);
    routing_ = moe_router_config(moe);
    std::vector<ops::Linear> gate_up, down;
    for (size_t e = 0; e < w.experts.size(); ++e) {
      const MlpWeights& ew = w.experts[e];
      const std::string name = fmt::format("{}.experts.{}", prefix, e);
      gate_up.push_back(make_linear(name + ".gate_up_proj", {&ew.gate_proj, &ew.up_proj}, mode));
      down.push_back(make_linear(name + ".down_proj", {&ew.down_proj}, mode));
    }
    experts_ = ops::MoeExperts(std::move(gate_up), std::move(down));
    if (w.shared_experts.defined()) {
      shared_ = make_dense_mlp(w.shared_experts, prefix + ".shared_experts", mode);
    }
  }

  void forward(const TensorView& x, const TensorView& out) override {
    const int64_t t = x.shape[0], hidden = x.shape[1], experts = routing_.num_experts;
    float* logits = logits_buffer_.get(t * experts);
    router_.forward(x, f32_view(logits, {t, experts}));
    ops::moe_route(f32_view(logits, {t, experts}), routing_, bias_, assignment_);
    experts_.forward(x, assignment_, out);
    if (shared_) {
      float* shared = shared_buffer_.get(t * hidden);
      shared_->forward(x, f32_view(shared, {t, hidden}));
      ops::add_inplace(out, f32_view(shared, {t, hidden}));
    }
  }

  int64_t owned_bytes() const override {
    return router_.owned_bytes() + experts_.owned_bytes() + (shared_ ? shared_->owned_bytes() : 0);
  }

 private:
  TensorView bias_;
  ops::Linear router_;
  ops::MoeRouterConfig routing_;
  ops::MoeExperts experts_;
  std::unique_ptr<MlpLayer> shared_;
  ops::MoeAssignment assignment_;
  Scratch logits_buffer_, shared_buffer_;
};

}  // namespace

namespace {

ops::MoeRouting routing_of(const MoeConfig& moe) {
  if (moe.scoring == MoeScoring::kSoftmax && moe.topk_method == MoeTopkMethod::kGreedy) {
    return ops::MoeRouting::kSoftmaxGreedy;
  }
  if (moe.scoring == MoeScoring::kSoftmax &&
      moe.topk_method == MoeTopkMethod::kGroupLimitedGreedy) {
    return ops::MoeRouting::kSoftmaxGroupLimited;
  }
  if (moe.scoring == MoeScoring::kSigmoid && moe.topk_method == MoeTopkMethod::kNoAuxTc) {
    return ops::MoeRouting::kSigmoidNoAuxTc;
  }
  PA_FAIL(
      "moe: scoring_func {} with topk_method {} is not supported (expected softmax with "
      "greedy or group_limited_greedy, or sigmoid with noaux_tc)",
      moe_scoring_name(moe.scoring), moe_topk_method_name(moe.topk_method));
}

}  // namespace

ops::MoeRouterConfig moe_router_config(const MoeConfig& moe) {
  ops::MoeRouterConfig routing;
  routing.method = routing_of(moe);
  routing.num_experts = static_cast<int32_t>(moe.n_routed_experts);
  routing.top_k = static_cast<int32_t>(moe.num_experts_per_tok);
  routing.num_groups = static_cast<int32_t>(moe.n_group);
  routing.topk_groups = static_cast<int32_t>(moe.topk_group);
  routing.norm_topk_prob = moe.norm_topk_prob;
  routing.routed_scaling_factor = static_cast<float>(moe.routed_scaling_factor);
  return routing;
}

std::unique_ptr<AttentionLayer> make_mla_attention(const ModelConfig& config,
                                                   const MlaAttentionWeights& weights,
                                                   int64_t layer, ops::WeightMode mode) {
  return std::make_unique<MlaAttention>(config, weights, layer, mode);
}

std::unique_ptr<MlpLayer> make_moe_mlp(const ModelConfig& config, const MoeWeights& weights,
                                       int64_t layer, ops::WeightMode mode) {
  return std::make_unique<MoeMlp>(config, weights, layer, mode);
}

}  // namespace pagedattn::model
