// The tensors each architecture expects (Hugging Face names and shapes) and their binding into the
// typed ModelWeights. Binding checks, in this order, so that the first error is the most useful:
// fp8 block quantization (not supported yet), missing tensors (all listed), unexpected tensors
// (all listed; rotary_emb.inv_freq buffers, DeepSeek-V3's multi-token-prediction layers and a tied
// lm_head.weight are ignored), then each tensor's shape, dtype and alignment.
#include <algorithm>
#include <map>
#include <set>

#include "core/check.h"
#include "pagedattn/checkpoint.h"

namespace pagedattn::model {

namespace {

std::string layer_prefix(int64_t layer) { return fmt::format("model.layers.{}.", layer); }

struct ExpectedList {
  std::vector<ExpectedTensor> tensors;
  void add(std::string name, std::vector<int64_t> shape, bool may_be_f32 = false) {
    tensors.push_back({std::move(name), std::move(shape), may_be_f32});
  }
  void linear(const std::string& name, int64_t out, int64_t in, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  }
  void mlp(const std::string& prefix, int64_t hidden, int64_t width) {
    linear(prefix + "gate_proj", width, hidden, false);
    linear(prefix + "up_proj", width, hidden, false);
    linear(prefix + "down_proj", hidden, width, false);
  }
};

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// "a, b, c and 12 more"
std::string first_names(const std::vector<std::string>& names, size_t limit = 8) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i > 0) text += ", ";
    text += names[i];
  }
  if (names.size() > limit) text += fmt::format(" and {} more", names.size() - limit);
  return text;
}

bool is_mtp_layer(const ModelConfig& config, std::string_view name) {
  if (config.num_nextn_predict_layers == 0 || !name.starts_with("model.layers.")) return false;
  const std::string_view rest = name.substr(13);
  int64_t layer = 0;
  size_t i = 0;
  for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9' && i < 6; ++i) {
    layer = layer * 10 + (rest[i] - '0');
  }
  return i > 0 && i < rest.size() && rest[i] == '.' && layer >= config.num_hidden_layers &&
         layer < config.num_hidden_layers + config.num_nextn_predict_layers;
}

}  // namespace

bool is_ignored_tensor_name(std::string_view name) { return name.ends_with("rotary_emb.inv_freq"); }

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config) {
  ExpectedList list;
  const int64_t hidden = config.hidden_size;
  const int64_t heads = config.num_attention_heads;
  list.add("model.embed_tokens.weight", {config.vocab_size, hidden});
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = layer_prefix(layer);
    list.add(prefix + "input_layernorm.weight", {hidden});
    const std::string attention = prefix + "self_attn.";
    if (config.mla) {
      const MlaConfig& mla = *config.mla;
      if (mla.has_q_lora()) {
        list.linear(attention + "q_a_proj", mla.q_lora_rank, hidden, false);
        list.add(attention + "q_a_layernorm.weight", {mla.q_lora_rank});
        list.linear(attention + "q_b_proj", heads * mla.qk_head_dim(), mla.q_lora_rank, false);
      } else {
        list.linear(attention + "q_proj", heads * mla.qk_head_dim(), hidden, false);
      }
      list.linear(attention + "kv_a_proj_with_mqa", mla.kv_lora_rank + mla.qk_rope_head_dim, hidden,
                  false);
      list.add(attention + "kv_a_layernorm.weight", {mla.kv_lora_rank});
      list.linear(attention + "kv_b_proj", heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                  mla.kv_lora_rank, false);
      list.linear(attention + "o_proj", hidden, heads * mla.v_head_dim, false);
    } else {
      const int64_t q_width = heads * config.head_dim;
      const int64_t kv_width = config.num_key_value_heads * config.head_dim;
      list.linear(attention + "q_proj", q_width, hidden, config.qkv_bias);
      list.linear(attention + "k_proj", kv_width, hidden, config.qkv_bias);
      list.linear(attention + "v_proj", kv_width, hidden, config.qkv_bias);
      list.linear(attention + "o_proj", hidden, q_width, config.o_bias);
      if (config.qk_norm) {
        list.add(attention + "q_norm.weight", {config.head_dim});
        list.add(attention + "k_norm.weight", {config.head_dim});
      }
    }
    list.add(prefix + "post_attention_layernorm.weight", {hidden});
    if (config.is_moe_layer(layer)) {
      const MoeConfig& moe = *config.moe;
      list.add(prefix + "mlp.gate.weight", {moe.n_routed_experts, hidden});
      if (moe.has_e_score_correction_bias) {
        list.add(prefix + "mlp.gate.e_score_correction_bias", {moe.n_routed_experts}, true);
      }
      for (int64_t expert = 0; expert < moe.n_routed_experts; ++expert) {
        list.mlp(fmt::format("{}mlp.experts.{}.", prefix, expert), hidden,
                 moe.moe_intermediate_size);
      }
      if (moe.n_shared_experts > 0) {
        list.mlp(prefix + "mlp.shared_experts.", hidden,
                 moe.n_shared_experts * moe.moe_intermediate_size);
      }
    } else {
      list.mlp(prefix + "mlp.", hidden, config.intermediate_size);
    }
  }
  list.add("model.norm.weight", {hidden});
  if (!config.tie_word_embeddings) list.add("lm_head.weight", {config.vocab_size, hidden});
  return list.tensors;
}

ModelWeights bind_model_weights(const ModelConfig& config, const NamedTensorSource& source) {
  const auto where = [&](std::string_view name) {
    return source.where ? source.where(name) : source.label;
  };
  // fp8 block quantization first: its tensors would otherwise show up as "unexpected".
  for (const std::string& name : source.names) {
    PA_CHECK(!name.ends_with("weight_scale_inv"),
             "{}: tensor '{}': fp8 block-quantized weights "
             "are not supported yet",
             where(name), name);
  }

  const std::vector<ExpectedTensor> expected = expected_tensors(config);
  std::map<std::string_view, const ExpectedTensor*> by_name;
  for (const ExpectedTensor& tensor : expected) by_name.emplace(tensor.name, &tensor);

  std::vector<std::string> missing;
  for (const ExpectedTensor& tensor : expected) {
    if (!source.find(tensor.name).defined()) {
      missing.push_back(fmt::format("{} {}", tensor.name, shape_text(tensor.shape)));
    }
  }
  PA_CHECK(missing.empty(), "{}: {} checkpoint is missing {} tensor(s): {}", source.label,
           architecture_name(config.architecture), missing.size(), first_names(missing));

  std::vector<std::string> unexpected;
  for (const std::string& name : source.names) {
    if (by_name.contains(name) || is_ignored_tensor_name(name) || is_mtp_layer(config, name) ||
        (config.tie_word_embeddings && name == "lm_head.weight")) {
      continue;
    }
    unexpected.push_back(fmt::format("{} (in {})", name, where(name)));
  }
  PA_CHECK(unexpected.empty(), "{}: {} unexpected tensor(s) for {} with this config.json: {}",
           source.label, unexpected.size(), architecture_name(config.architecture),
           first_names(unexpected));

  // The checkpoint's dtype is the embedding's; every tensor must share it.
  const TensorView embedding = source.find("model.embed_tokens.weight");
  PA_CHECK(embedding.dtype == DType::kF32 || embedding.dtype == DType::kF16 ||
               embedding.dtype == DType::kBF16,
           "{}: tensor 'model.embed_tokens.weight' has dtype {}, expected F32, F16 or BF16",
           where("model.embed_tokens.weight"), dtype_name(embedding.dtype));
  std::map<std::string_view, TensorView> views;
  for (const ExpectedTensor& tensor : expected) {
    const TensorView view = source.find(tensor.name);
    const std::string file = where(tensor.name);
    PA_CHECK(view.dtype != DType::kFP8E4M3,
             "{}: tensor '{}' is F8_E4M3: fp8 block-quantized "
             "weights are not supported yet",
             file, tensor.name);
    const bool shape_ok = view.ndim == static_cast<int32_t>(tensor.shape.size()) &&
                          std::equal(tensor.shape.begin(), tensor.shape.end(), view.shape.begin());
    PA_CHECK(shape_ok, "{}: tensor '{}': shape {}, expected {}", file, tensor.name,
             view.shape_str(), shape_text(tensor.shape));
    const bool dtype_ok =
        view.dtype == embedding.dtype || (tensor.may_be_f32 && view.dtype == DType::kF32);
    PA_CHECK(dtype_ok,
             "{}: tensor '{}': dtype {}, expected {} (the checkpoint's dtype, that of "
             "model.embed_tokens.weight){}",
             file, tensor.name, dtype_name(view.dtype), dtype_name(embedding.dtype),
             tensor.may_be_f32 ? " or f32" : "");
    PA_CHECK(reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) == 0,
             "{}: tensor '{}' starts at an address not aligned to its {}-byte elements (the "
             "file's header is not padded as save_pretrained pads it)",
             file, tensor.name, dtype_size(view.dtype));
    views.emplace(tensor.name, view);
  }

  const auto get = [&](const std::string& name) {
    const auto it = views.find(name);
    return it == views.end() ? TensorView{} : it->second;
  };
  const auto linear = [&](const std::string& name) {
    return LinearWeights{get(name + ".weight"), get(name + ".bias")};
  };
  const auto mlp = [&](const std::string& prefix) {
    return MlpWeights{linear(prefix + "gate_proj"), linear(prefix + "up_proj"),
                      linear(prefix + "down_proj")};
  };

  ModelWeights weights;
  weights.dtype = embedding.dtype;
  weights.embed_tokens = get("model.embed_tokens.weight");
  weights.final_norm = get("model.norm.weight");
  weights.tied_lm_head = config.tie_word_embeddings;
  weights.lm_head = config.tie_word_embeddings ? weights.embed_tokens : get("lm_head.weight");
  weights.layers.resize(config.num_hidden_layers);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    DecoderLayerWeights& out = weights.layers[layer];
    const std::string prefix = layer_prefix(layer);
    const std::string attention = prefix + "self_attn.";
    out.input_layernorm = get(prefix + "input_layernorm.weight");
    out.post_attention_layernorm = get(prefix + "post_attention_layernorm.weight");
    if (config.mla) {
      out.mla.q_proj = linear(attention + "q_proj");
      out.mla.q_a_proj = linear(attention + "q_a_proj");
      out.mla.q_a_layernorm = get(attention + "q_a_layernorm.weight");
      out.mla.q_b_proj = linear(attention + "q_b_proj");
      out.mla.kv_a_proj_with_mqa = linear(attention + "kv_a_proj_with_mqa");
      out.mla.kv_a_layernorm = get(attention + "kv_a_layernorm.weight");
      out.mla.kv_b_proj = linear(attention + "kv_b_proj");
      out.mla.o_proj = linear(attention + "o_proj");
    } else {
      out.attention.q_proj = linear(attention + "q_proj");
      out.attention.k_proj = linear(attention + "k_proj");
      out.attention.v_proj = linear(attention + "v_proj");
      out.attention.o_proj = linear(attention + "o_proj");
      out.attention.q_norm = get(attention + "q_norm.weight");
      out.attention.k_norm = get(attention + "k_norm.weight");
    }
    out.is_moe = config.is_moe_layer(layer);
    if (out.is_moe) {
      out.moe.router = get(prefix + "mlp.gate.weight");
      out.moe.e_score_correction_bias = get(prefix + "mlp.gate.e_score_correction_bias");
      for (int64_t expert = 0; expert < config.moe->n_routed_experts; ++expert) {
        out.moe.experts.push_back(mlp(fmt::format("{}mlp.experts.{}.", prefix, expert)));
      }
      out.moe.shared_experts = mlp(prefix + "mlp.shared_experts.");
    } else {
      out.mlp = mlp(prefix + "mlp.");
    }
  }
  return weights;
}

}  // namespace pagedattn::model
