// Model: the layers built from a checkpoint, and forward(step) (see include/pagedattn/model.h).
//
// forward: validate the step and derive each new token's position and KV slot (forward_step.cpp),
// plan the attention once (planner + Backend::plan), embed, run the decoder layers (pre-norm fused
// with the residual add), then the final norm and lm_head on the rows asked for only (those of the
// requests that want logits). This file is the CPU model and the choice of device; a CUDA model is
// src/model/cuda/'s CudaModel.
#include <fmt/format.h>

#include "core/check.h"
#include "model/forward_step.h"
#include "model/layers.h"
#include "pagedattn/registry.h"
#ifdef PAGEDATTN_WITH_CUDA
#include "model/cuda/cuda_model.h"
#endif

namespace pagedattn::model {

ops::RopeTable make_rope_table(const ModelConfig& config, const ModelOptions& options) {
  const int64_t max_positions =
      options.max_positions > 0 ? options.max_positions : config.max_position_embeddings;
  PA_CHECK(max_positions > 0, "model: max_position_embeddings {} (expected > 0)", max_positions);
  return ops::RopeTable(config.rope.inverse_frequencies(), config.rope.attention_scaling(),
                        max_positions);
}

Device resolve_model_device(const ModelOptions& options) {
  if (options.device != "auto") {
    const Device device = parse_device(options.device);
    if (device.type == DeviceType::kCUDA) {
#ifdef PAGEDATTN_WITH_CUDA
      const Support usable = cuda::device_usable(device);
      PA_CHECK(usable.ok, "model: device {}: {}", options.device, usable.reason);
#else
      PA_FAIL(
          "model: device {} needs pagedattn built with CUDA (configure with -DPAGEDATTN_CUDA=ON)",
          options.device);
#endif
    }
    return device;
  }
  // auto: a spec that names a CPU backend ("cpu", "prefill=cpu,decode=...") keeps the model there.
  const Selection selection = Selection::parse(options.backend);
  for (const std::string& name : {selection.prefill, selection.decode}) {
    const Backend* backend = name == "auto" ? nullptr : Registry::builtin().find(name);
    if (backend != nullptr && backend->device_type() == DeviceType::kCPU) return Device::cpu();
  }
#ifdef PAGEDATTN_WITH_CUDA
  if (cuda::device_usable(Device::cuda(0)).ok) return Device::cuda(0);
#endif
  return Device::cpu();
}

struct DecoderLayer {
  TensorView input_norm, post_norm;
  std::unique_ptr<AttentionLayer> attention;
  std::unique_ptr<MlpLayer> mlp;
};

struct Model::Impl {
  ModelConfig config;
  ModelOptions options;
  Device device = Device::cpu();
#ifdef PAGEDATTN_WITH_CUDA
  std::unique_ptr<cuda::CudaModel> cuda;  // the model on a CUDA device; the rest is then unused
#endif
  TensorView embed_tokens, final_norm;
  ops::Linear lm_head;
  std::vector<DecoderLayer> layers;
  ops::RopeTable rope;
  StepPlanner planner;
  Scratch residual, hidden, branch, last_residual, last_branch, last_hidden;
  ops::RowSampler sampler;
};

namespace {

// Step::sampling on the CPU: the rows it samples are drawn by ops::RowSampler (the reference of
// the CUDA kernel); the others are moved to the front of values, in row order.
void sample_rows(const Step& step, ops::RowSampler& sampler, Logits& logits) {
  if (step.sampling.empty()) return;
  const size_t vocab = static_cast<size_t>(logits.vocab);
  logits.sampled.assign(static_cast<size_t>(logits.rows), ops::SampledToken{});
  size_t kept = 0;
  for (size_t r = 0; r < static_cast<size_t>(logits.rows); ++r) {
    const std::span<const float> row(logits.values.data() + r * vocab, vocab);
    if (step.sampling[r].sample) {
      const ops::RowDraw draw = sampler.sample(row, step.sampling[r]);
      logits.sampled[r] = {draw.token, draw.logprob};
    } else {
      if (kept != r) std::copy(row.begin(), row.end(), logits.values.begin() + kept * vocab);
      ++kept;
    }
  }
  logits.values.resize(kept * vocab);
}

}  // namespace

Model::Model(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = config;
  m.options = options;
  m.device = resolve_model_device(options);
  if (m.device.type == DeviceType::kCUDA) {
#ifdef PAGEDATTN_WITH_CUDA
    m.cuda = std::make_unique<cuda::CudaModel>(config, weights, options, m.device);
#endif
    return;
  }
  ops::init_threads(options.threads);
  PA_CHECK(static_cast<int64_t>(weights.layers.size()) == config.num_hidden_layers,
           "model: {} layers of weights for num_hidden_layers {}", weights.layers.size(),
           config.num_hidden_layers);
  m.embed_tokens = weights.embed_tokens;
  m.final_norm = weights.final_norm;
  const std::vector<ops::LinearPart> head = {{weights.lm_head, {}}};
  m.lm_head = ops::Linear("lm_head", head, options.weight_mode);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const DecoderLayerWeights& w = weights.layers[static_cast<size_t>(i)];
    DecoderLayer layer;
    layer.input_norm = w.input_layernorm;
    layer.post_norm = w.post_attention_layernorm;
    layer.attention = config.is_mla()
                          ? make_mla_attention(config, w.mla, i, options.weight_mode)
                          : make_gqa_attention(config, w.attention, i, options.weight_mode);
    layer.mlp =
        config.is_moe_layer(i)
            ? make_moe_mlp(config, w.moe, i, options.weight_mode)
            : make_dense_mlp(w.mlp, fmt::format("model.layers.{}.mlp", i), options.weight_mode);
    m.layers.push_back(std::move(layer));
  }
  m.rope = make_rope_table(config, options);
  m.planner = StepPlanner(config, Selection::parse(options.backend));
  m.planner.set_validate_metadata(options.validate_metadata);
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const ModelConfig& Model::config() const { return impl_->config; }
Device Model::device() const { return impl_->device; }

KvPool Model::make_kv_pool(const KvPoolConfig& pool) const {
  KvPoolConfig on_device = pool;
  on_device.device = impl_->device;
  return KvPool(config(), on_device);
}

int64_t Model::max_step_tokens() const {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->max_step_tokens();
#endif
  return 0;
}

int64_t Model::free_device_bytes() const {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->free_device_bytes();
#endif
  return 0;
}

int64_t Model::owned_bytes() const {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->device_bytes();
#endif
  int64_t bytes = impl_->lm_head.owned_bytes();
  for (const DecoderLayer& layer : impl_->layers) {
    bytes += layer.attention->owned_bytes() + layer.mlp->owned_bytes();
  }
  bytes += 2 * impl_->rope.max_positions() * (impl_->rope.rotary_dim() / 2) *
           static_cast<int64_t>(sizeof(float));
  return bytes;
}

std::optional<Model::DeviceTiming> Model::last_device_timing() const {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->last_timing();
#endif
  return std::nullopt;
}

void Model::set_timeline(bool on) {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) impl_->cuda->set_timeline(on);
#endif
  (void)on;
}

std::vector<Model::TimelineSpan> Model::last_timeline() const {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->last_timeline();
#endif
  return {};
}

bool Model::can_launch() const {
#ifdef PAGEDATTN_WITH_CUDA
  return impl_->cuda != nullptr;
#else
  return false;
#endif
}

void Model::launch(const Step& step, KvPool& pool) {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->launch(step, pool);
#endif
  (void)step;
  (void)pool;
  PA_FAIL("launch: a model on {} runs its steps with forward (launch is for CUDA)",
          device().str());
}

void Model::collect(std::span<ops::SampledToken> tokens) {
#ifdef PAGEDATTN_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->collect(tokens);
#endif
  (void)tokens;
  PA_FAIL("collect: a model on {} launches nothing", device().str());
}

Logits Model::forward(const Step& step, KvPool& pool) {
  Impl& m = *impl_;
#ifdef PAGEDATTN_WITH_CUDA
  if (m.cuda) return m.cuda->forward(step, pool);
#endif
  const int64_t hidden = m.config.hidden_size;
  StepContext& ctx = m.planner.prepare(step, pool, m.rope);
  const int64_t t = ctx.tokens;
  float* residual = m.residual.get(t * hidden);
  float* x = m.hidden.get(t * hidden);
  float* branch = m.branch.get(t * hidden);
  const TensorView residual_view = f32_view(residual, {t, hidden});
  const TensorView x_view = f32_view(x, {t, hidden});
  const TensorView branch_view = f32_view(branch, {t, hidden});
  ops::embedding(m.embed_tokens, m.planner.token_ids(), residual_view);

  const float eps = static_cast<float>(m.config.rms_norm_eps);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    DecoderLayer& layer = m.layers[i];
    // residual += the previous layer's MLP output (none before layer 0), x = norm(residual).
    ops::add_rms_norm(residual_view, i == 0 ? TensorView{} : branch_view, layer.input_norm, eps,
                      x_view);
    layer.attention->forward(x_view, ctx, pool, static_cast<int64_t>(i), branch_view);
    ops::add_rms_norm(residual_view, branch_view, layer.post_norm, eps, x_view);
    layer.mlp->forward(x_view, branch_view);
  }

  // The rows asked for: residual + last MLP output, final norm, lm_head.
  const std::vector<int64_t>& rows = m.planner.logit_rows(step);
  const int64_t n = static_cast<int64_t>(rows.size());
  Logits logits;
  logits.rows = n;
  logits.vocab = m.lm_head.out_features();
  if (n == 0) {  // no request wants logits (prefill chunks only)
    sample_rows(step, m.sampler, logits);
    return logits;
  }
  float* last_residual = m.last_residual.get(n * hidden);
  float* last_branch = m.last_branch.get(n * hidden);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(residual + rows[static_cast<size_t>(r)] * hidden, hidden,
                last_residual + r * hidden);
    std::copy_n(branch + rows[static_cast<size_t>(r)] * hidden, hidden, last_branch + r * hidden);
  }
  float* last_hidden = m.last_hidden.get(n * hidden);
  ops::add_rms_norm(f32_view(last_residual, {n, hidden}), f32_view(last_branch, {n, hidden}),
                    m.final_norm, eps, f32_view(last_hidden, {n, hidden}));
  logits.values.resize(static_cast<size_t>(n * logits.vocab));
  m.lm_head.forward(f32_view(last_hidden, {n, hidden}),
                    f32_view(logits.values.data(), {n, logits.vocab}));
  sample_rows(step, m.sampler, logits);
  return logits;
}

}  // namespace pagedattn::model
