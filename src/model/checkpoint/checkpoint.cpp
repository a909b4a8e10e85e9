// Checkpoint::open: config.json parsed, the safetensors files mapped, every tensor's dtype checked
// (fp8 and dtypes without a pagedattn DType are refused before binding), the weights bound. All
// state lives in one State built completely before it is handed out, so a throw leaves nothing
// mapped or half-bound.
#include "pagedattn/checkpoint.h"

#include <set>

#include "core/check.h"

namespace pagedattn::model {

struct Checkpoint::State {
  std::filesystem::path directory;
  ModelConfig config;
  SafetensorsCheckpoint files;
  ModelWeights weights;
};

Checkpoint::Checkpoint(std::unique_ptr<State> state) : state_(std::move(state)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const std::filesystem::path& directory) {
  std::error_code error;
  PA_CHECK(std::filesystem::is_directory(directory, error),
           "{}: not a directory (expected a Hugging Face model directory with config.json and "
           "safetensors files)",
           directory.string());
  ModelConfig config = load_model_config(directory / "config.json");
  PA_CHECK(config.quantization_method.empty(),
           "{}: config.json has a quantization_config (quant_method '{}'): fp8 block-quantized "
           "weights are not supported yet",
           directory.string(), config.quantization_method);
  SafetensorsCheckpoint files = SafetensorsCheckpoint::open(directory);

  NamedTensorSource source;
  source.label = directory.string();
  source.names = files.names();
  for (const std::string& name : source.names) {
    const TensorLocation location = *files.find(name);
    const SafetensorsDType dtype = location.info->dtype;
    PA_CHECK(!name.ends_with("weight_scale_inv") && dtype != SafetensorsDType::kF8E4M3 &&
                 dtype != SafetensorsDType::kF8E5M2,
             "{}: tensor '{}' ({}): fp8 block-quantized weights are not supported yet",
             location.file->path().string(), name, safetensors_dtype_name(dtype));
    PA_CHECK(dtype == SafetensorsDType::kF32 || dtype == SafetensorsDType::kF16 ||
                 dtype == SafetensorsDType::kBF16,
             "{}: tensor '{}': dtype {}, expected F32, F16 or BF16", location.file->path().string(),
             name, safetensors_dtype_name(dtype));
  }
  source.find = [&files](std::string_view name) {
    const std::optional<TensorLocation> location = files.find(name);
    return location ? location->file->view(*location->info) : TensorView{};
  };
  source.where = [&files, &directory](std::string_view name) {
    const std::optional<TensorLocation> location = files.find(name);
    return location ? location->file->path().string() : directory.string();
  };
  ModelWeights weights = bind_model_weights(config, source);

  auto state = std::make_unique<State>(
      State{directory, std::move(config), std::move(files), std::move(weights)});
  return Checkpoint(std::move(state));
}

const std::filesystem::path& Checkpoint::directory() const { return state_->directory; }
const ModelConfig& Checkpoint::config() const { return state_->config; }
const ModelWeights& Checkpoint::weights() const { return state_->weights; }
const SafetensorsCheckpoint& Checkpoint::files() const { return state_->files; }

int64_t Checkpoint::weight_bytes() const {
  // Each bound tensor once (a tied lm_head is the embedding's view).
  std::set<const void*> seen;
  int64_t bytes = 0;
  const auto count = [&](const TensorView& view) {
    if (view.defined() && seen.insert(view.data).second) {
      bytes += view.numel() * dtype_size(view.dtype);
    }
  };
  const auto linear = [&](const LinearWeights& l) {
    count(l.weight);
    count(l.bias);
  };
  const auto mlp = [&](const MlpWeights& m) {
    linear(m.gate_proj);
    linear(m.up_proj);
    linear(m.down_proj);
  };
  const ModelWeights& w = state_->weights;
  count(w.embed_tokens);
  count(w.final_norm);
  count(w.lm_head);
  for (const DecoderLayerWeights& layer : w.layers) {
    count(layer.input_layernorm);
    count(layer.post_attention_layernorm);
    for (const LinearWeights* l :
         {&layer.attention.q_proj, &layer.attention.k_proj, &layer.attention.v_proj,
          &layer.attention.o_proj, &layer.mla.q_proj, &layer.mla.q_a_proj, &layer.mla.q_b_proj,
          &layer.mla.kv_a_proj_with_mqa, &layer.mla.kv_b_proj, &layer.mla.o_proj}) {
      linear(*l);
    }
    count(layer.attention.q_norm);
    count(layer.attention.k_norm);
    count(layer.mla.q_a_layernorm);
    count(layer.mla.kv_a_layernorm);
    mlp(layer.mlp);
    count(layer.moe.router);
    count(layer.moe.e_score_correction_bias);
    for (const MlpWeights& expert : layer.moe.experts) mlp(expert);
    mlp(layer.moe.shared_experts);
  }
  return bytes;
}

}  // namespace pagedattn::model
