// Loading every transformers fixture: the config, each bound weight's shape and dtype against the
// tensors Python's safetensors listed (expected.json), views that point into the mapped files (no
// copy), tied embeddings, per-layer MoE structure, and the expected-tensor lists per architecture.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint_test_util.h"
#include "pagedattn/checkpoint.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

using namespace checkpoint_testing;
using nlohmann::json;

DType storage_dtype(const std::string& name) {
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  return DType::kF32;
}

// True when `view` lies inside one of the checkpoint's mapped files.
bool inside_mapping(const Checkpoint& checkpoint, const TensorView& view) {
  const auto* address = static_cast<const std::byte*>(view.data);
  for (const SafetensorsFile& file : checkpoint.files().files()) {
    const std::byte* begin = file.bytes(file.tensors().front()).data() -
                             file.tensors().front().data_begin - file.header().data_offset;
    if (address >= begin &&
        address + view.numel() * dtype_size(view.dtype) <= begin + file.file_size()) {
      return true;
    }
  }
  return false;
}

TEST(CheckpointLoad, EveryFixtureLoads) {
  for (const std::string& name : fixture_cases()) {
    SCOPED_TRACE(name);
    const json expected = json::parse(read_bytes(fixture_dir(name) / "expected.json"));
    const Checkpoint checkpoint = Checkpoint::open(fixture_dir(name));
    const ModelConfig& config = checkpoint.config();
    const ModelWeights& weights = checkpoint.weights();
    EXPECT_EQ(weights.dtype, storage_dtype(expected["storage_dtype"].get<std::string>()));
    ASSERT_EQ(static_cast<int64_t>(weights.layers.size()), config.num_hidden_layers);

    // Every expected tensor is bound with the shape and dtype Python's safetensors saw, and points
    // into the mapped files.
    const json& listed = expected["tensors"];
    const std::vector<ExpectedTensor> tensors = expected_tensors(config);
    EXPECT_EQ(tensors.size(), listed.size());
    int64_t bytes = 0;
    for (const ExpectedTensor& tensor : tensors) {
      ASSERT_TRUE(listed.contains(tensor.name)) << tensor.name;
      EXPECT_EQ(listed[tensor.name][2].get<std::vector<int64_t>>(), tensor.shape) << tensor.name;
      const TensorView view = checkpoint.files().view(tensor.name);
      EXPECT_TRUE(inside_mapping(checkpoint, view)) << tensor.name;
      bytes += view.numel() * dtype_size(view.dtype);
    }
    EXPECT_EQ(checkpoint.weight_bytes(), bytes);

    EXPECT_EQ(weights.embed_tokens.data, checkpoint.files().view("model.embed_tokens.weight").data);
    EXPECT_EQ(weights.final_norm.data, checkpoint.files().view("model.norm.weight").data);
    EXPECT_EQ(weights.tied_lm_head, config.tie_word_embeddings);
    if (config.tie_word_embeddings) {
      EXPECT_EQ(weights.lm_head.data, weights.embed_tokens.data);
      EXPECT_FALSE(checkpoint.files().find("lm_head.weight").has_value());
    } else {
      EXPECT_EQ(weights.lm_head.data, checkpoint.files().view("lm_head.weight").data);
    }
    EXPECT_EQ(weights.lm_head.shape[0], config.vocab_size);
    EXPECT_EQ(weights.lm_head.shape[1], config.hidden_size);

    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const DecoderLayerWeights& layer = weights.layers[l];
      const std::string prefix = fmt::format("model.layers.{}.", l);
      EXPECT_EQ(layer.input_layernorm.data,
                checkpoint.files().view(prefix + "input_layernorm.weight").data);
      EXPECT_EQ(layer.is_moe, config.is_moe_layer(l));
      if (config.is_mla()) {
        EXPECT_EQ(layer.mla.kv_b_proj.weight.data,
                  checkpoint.files().view(prefix + "self_attn.kv_b_proj.weight").data);
        EXPECT_EQ(layer.mla.q_proj.defined(), !config.mla->has_q_lora());
        EXPECT_EQ(layer.mla.q_a_proj.defined(), config.mla->has_q_lora());
        EXPECT_EQ(layer.mla.q_a_layernorm.defined(), config.mla->has_q_lora());
        EXPECT_EQ(layer.mla.kv_a_proj_with_mqa.weight.shape[0],
                  config.mla->kv_lora_rank + config.mla->qk_rope_head_dim);
        EXPECT_FALSE(layer.attention.q_proj.defined());
      } else {
        EXPECT_EQ(layer.attention.q_proj.weight.data,
                  checkpoint.files().view(prefix + "self_attn.q_proj.weight").data);
        EXPECT_EQ(layer.attention.q_proj.bias.defined(), config.qkv_bias);
        EXPECT_EQ(layer.attention.v_proj.bias.defined(), config.qkv_bias);
        EXPECT_EQ(layer.attention.o_proj.bias.defined(), config.o_bias);
        EXPECT_EQ(layer.attention.q_norm.defined(), config.qk_norm);
        EXPECT_EQ(layer.attention.k_norm.defined(), config.qk_norm);
      }
      if (layer.is_moe) {
        const MoeConfig& moe = *config.moe;
        ASSERT_EQ(static_cast<int64_t>(layer.moe.experts.size()), moe.n_routed_experts);
        EXPECT_EQ(layer.moe.router.shape[0], moe.n_routed_experts);
        EXPECT_EQ(layer.moe.e_score_correction_bias.defined(), moe.has_e_score_correction_bias);
        EXPECT_EQ(layer.moe.shared_experts.defined(), moe.n_shared_experts > 0);
        const MlpWeights& last = layer.moe.experts.back();
        EXPECT_EQ(last.down_proj.weight.data,
                  checkpoint.files()
                      .view(fmt::format("{}mlp.experts.{}.down_proj.weight", prefix,
                                        moe.n_routed_experts - 1))
                      .data);
        EXPECT_EQ(last.gate_proj.weight.shape[0], moe.moe_intermediate_size);
        EXPECT_FALSE(layer.mlp.defined());
      } else {
        EXPECT_EQ(layer.mlp.up_proj.weight.shape[0], config.intermediate_size);
        EXPECT_TRUE(layer.moe.experts.empty());
      }
    }
  }
}

TEST(CheckpointLoad, ShardedFixtureSpansItsFiles) {
  const Checkpoint checkpoint = Checkpoint::open(fixture_dir("llama_linear_f16_sharded"));
  EXPECT_EQ(checkpoint.files().files().size(), 4u);
  std::set<std::string> files;
  for (const std::string& name : checkpoint.files().names()) {
    files.insert(checkpoint.files().find(name)->file->path().filename().string());
  }
  EXPECT_EQ(files.size(), 4u);
}

TEST(CheckpointLoad, ExpectedTensorsPerArchitecture) {
  // Counts from the architecture's recipe, written out here: Qwen3 (tied): embed + norm + per layer
  // 2 norms + q,k,v,o + q_norm,k_norm + gate,up,down.
  const ModelConfig qwen3 = load_model_config(fixture_dir("configs") / "qwen3_0_6b.json");
  EXPECT_EQ(expected_tensors(qwen3).size(), 2u + 28u * 11u);
  // Qwen2.5 (untied): + lm_head, per layer 2 norms + q,k,v weights and biases + o + 3 MLP.
  const ModelConfig qwen2 = load_model_config(fixture_dir("configs") / "qwen2_5_7b.json");
  EXPECT_EQ(expected_tensors(qwen2).size(), 3u + 28u * 12u);
  // DeepSeek-V2-Lite: layer 0 dense (2 norms, q_proj, kv_a, kv_a_norm, kv_b, o, 3 MLP = 10); 26
  // MoE layers of 2 norms + 5 attention + router + 64 x 3 experts + 3 shared = 203.
  const ModelConfig lite = load_model_config(fixture_dir("configs") / "deepseek_v2_lite.json");
  EXPECT_EQ(expected_tensors(lite).size(), 3u + 10u + 26u * 203u);
  // DeepSeek-V3: q_lora (q_a, q_a_norm, q_b) and the correction bias: 3 dense layers of 12, 58 MoE
  // layers of 2 + 7 + 2 + 256 x 3 + 3 = 782.
  const ModelConfig v3 = load_model_config(fixture_dir("configs") / "deepseek_v3.json");
  const auto v3_tensors = expected_tensors(v3);
  EXPECT_EQ(v3_tensors.size(), 3u + 3u * 12u + 58u * 782u);
  const auto bias = std::find_if(v3_tensors.begin(), v3_tensors.end(), [](const ExpectedTensor& t) {
    return t.name == "model.layers.3.mlp.gate.e_score_correction_bias";
  });
  ASSERT_NE(bias, v3_tensors.end());
  EXPECT_TRUE(bias->may_be_f32);
  EXPECT_EQ(bias->shape, (std::vector<int64_t>{256}));
  const auto kv_b = std::find_if(v3_tensors.begin(), v3_tensors.end(), [](const ExpectedTensor& t) {
    return t.name == "model.layers.0.self_attn.kv_b_proj.weight";
  });
  ASSERT_NE(kv_b, v3_tensors.end());
  EXPECT_EQ(kv_b->shape, (std::vector<int64_t>{128 * 256, 512}));
}

// bind_model_weights over tensors the caller owns (a random-weight model for benchmarks): one
// buffer carved per expected tensor, every view bound to its slice; a missing one named with the
// source's label.
TEST(CheckpointLoad, BindsCallerOwnedTensors) {
  const ModelConfig config = load_model_config(fixture_dir("deepseek_v3_bf16"));
  const std::vector<ExpectedTensor> tensors = expected_tensors(config);
  int64_t total = 0;
  for (const ExpectedTensor& tensor : tensors) {
    int64_t n = 1;
    for (int64_t extent : tensor.shape) n *= extent;
    total += n;
  }
  std::vector<uint16_t> storage(static_cast<size_t>(total));
  std::map<std::string, TensorView> owned;
  int64_t offset = 0;
  for (const ExpectedTensor& tensor : tensors) {
    TensorView view;
    view.data = storage.data() + offset;
    view.dtype = DType::kBF16;
    view.ndim = static_cast<int32_t>(tensor.shape.size());
    int64_t stride = 1;
    for (int d = view.ndim - 1; d >= 0; --d) {
      view.shape[d] = tensor.shape[d];
      view.strides[d] = stride;
      stride *= tensor.shape[d];
    }
    offset += stride;
    owned.emplace(tensor.name, view);
  }
  NamedTensorSource source;
  source.label = "random weights";
  for (const auto& [name, view] : owned) source.names.push_back(name);
  source.find = [&owned](std::string_view name) {
    const auto it = owned.find(std::string(name));
    return it == owned.end() ? TensorView{} : it->second;
  };
  const ModelWeights weights = bind_model_weights(config, source);
  EXPECT_EQ(weights.dtype, DType::kBF16);
  EXPECT_EQ(weights.embed_tokens.data, owned.at("model.embed_tokens.weight").data);
  EXPECT_EQ(weights.layers[2].moe.experts[15].up_proj.weight.data,
            owned.at("model.layers.2.mlp.experts.15.up_proj.weight").data);
  EXPECT_EQ(weights.layers[0].mla.q_b_proj.weight.data,
            owned.at("model.layers.0.self_attn.q_b_proj.weight").data);

  owned.erase("model.layers.1.self_attn.kv_a_layernorm.weight");
  try {
    bind_model_weights(config, source);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_CONTAINS(error.what(),
                    "random weights: DeepseekV3ForCausalLM checkpoint is missing 1 "
                    "tensor(s): model.layers.1.self_attn.kv_a_layernorm.weight [32]");
  }
}

TEST(CheckpointLoad, MovedCheckpointKeepsItsViews) {
  Checkpoint first = Checkpoint::open(fixture_dir("qwen2_f32"));
  const void* embedding = first.weights().embed_tokens.data;
  const float value = first.weights().embed_tokens.data_as<const float>()[5];
  Checkpoint second = std::move(first);
  EXPECT_EQ(second.weights().embed_tokens.data, embedding);
  EXPECT_EQ(second.weights().embed_tokens.data_as<const float>()[5], value);
}

}  // namespace
}  // namespace pagedattn::model
