// The named model shapes and random weights (include/pagedattn/model_random.h).
//  - Each real shape's config equals the one parsed from its published config.json, committed
//    independently under tests/data/model/configs/ (every field the runtime reads), and
//    DeepSeek-V2-Lite's MLA softmax scale is issue 14's 0.114721.
//  - Random weights: every expected tensor present with its shape and dtype; norm weights exactly
//    1; other values inside [-0.02 sqrt 3, 0.02 sqrt 3] with mean ~0 and standard deviation ~0.02
//    (the uniform law's, checked on every element of the tiny shape); the same seed gives the
//    same bytes, another seed other bytes; the byte count is the sum of the tensors'.
//  - The tiny model runs a step over a KV pool with finite logits.
//  - An unknown shape or dtype is an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "pagedattn/error.h"
#include "pagedattn/model.h"
#include "pagedattn/model_random.h"

namespace pagedattn::model {
namespace {

namespace fs = std::filesystem;

fs::path config_file(const char* name) {
  return fs::path(__FILE__).parent_path().parent_path() / "data" / "model" / "configs" / name;
}

void expect_same_config(const ModelConfig& got, const ModelConfig& expected) {
  EXPECT_EQ(got.architecture, expected.architecture);
  EXPECT_EQ(got.hidden_size, expected.hidden_size);
  EXPECT_EQ(got.num_hidden_layers, expected.num_hidden_layers);
  EXPECT_EQ(got.num_attention_heads, expected.num_attention_heads);
  EXPECT_EQ(got.num_key_value_heads, expected.num_key_value_heads);
  EXPECT_EQ(got.head_dim, expected.head_dim);
  EXPECT_EQ(got.intermediate_size, expected.intermediate_size);
  EXPECT_EQ(got.vocab_size, expected.vocab_size);
  EXPECT_EQ(got.max_position_embeddings, expected.max_position_embeddings);
  EXPECT_EQ(got.rms_norm_eps, expected.rms_norm_eps);
  EXPECT_EQ(got.tie_word_embeddings, expected.tie_word_embeddings);
  EXPECT_EQ(got.qkv_bias, expected.qkv_bias);
  EXPECT_EQ(got.o_bias, expected.o_bias);
  EXPECT_EQ(got.qk_norm, expected.qk_norm);
  EXPECT_EQ(got.eos_token_ids, expected.eos_token_ids);
  EXPECT_EQ(got.rope.type, expected.rope.type);
  EXPECT_EQ(got.rope.layout, expected.rope.layout);
  EXPECT_EQ(got.rope.theta, expected.rope.theta);
  EXPECT_EQ(got.rope.rotary_dim, expected.rope.rotary_dim);
  EXPECT_EQ(got.rope.factor, expected.rope.factor);
  EXPECT_EQ(got.rope.inverse_frequencies(), expected.rope.inverse_frequencies());
  EXPECT_EQ(got.rope.attention_scaling(), expected.rope.attention_scaling());
  EXPECT_EQ(got.softmax_scale(), expected.softmax_scale());
  ASSERT_EQ(got.mla.has_value(), expected.mla.has_value());
  if (got.mla) {
    EXPECT_EQ(got.mla->q_lora_rank, expected.mla->q_lora_rank);
    EXPECT_EQ(got.mla->kv_lora_rank, expected.mla->kv_lora_rank);
    EXPECT_EQ(got.mla->qk_nope_head_dim, expected.mla->qk_nope_head_dim);
    EXPECT_EQ(got.mla->qk_rope_head_dim, expected.mla->qk_rope_head_dim);
    EXPECT_EQ(got.mla->v_head_dim, expected.mla->v_head_dim);
  }
  ASSERT_EQ(got.moe.has_value(), expected.moe.has_value());
  if (got.moe) {
    EXPECT_EQ(got.moe->n_routed_experts, expected.moe->n_routed_experts);
    EXPECT_EQ(got.moe->num_experts_per_tok, expected.moe->num_experts_per_tok);
    EXPECT_EQ(got.moe->n_shared_experts, expected.moe->n_shared_experts);
    EXPECT_EQ(got.moe->moe_intermediate_size, expected.moe->moe_intermediate_size);
    EXPECT_EQ(got.moe->first_k_dense_replace, expected.moe->first_k_dense_replace);
    EXPECT_EQ(got.moe->routed_scaling_factor, expected.moe->routed_scaling_factor);
    EXPECT_EQ(got.moe->norm_topk_prob, expected.moe->norm_topk_prob);
    EXPECT_EQ(got.moe->scoring, expected.moe->scoring);
    EXPECT_EQ(got.moe->topk_method, expected.moe->topk_method);
  }
}

TEST(ModelShapes, RealShapesAreTheirPublishedConfigs) {
  EXPECT_EQ(model_shape_names(),
            (std::vector<std::string>{"tiny", "qwen3-0.6b", "deepseek-v2-lite"}));
  expect_same_config(model_shape("qwen3-0.6b"), load_model_config(config_file("qwen3_0_6b.json")));
  const ModelConfig lite = model_shape("deepseek-v2-lite");
  expect_same_config(lite, load_model_config(config_file("deepseek_v2_lite.json")));
  EXPECT_NEAR(lite.softmax_scale(), 0.114721, 1e-6);
  // The numbers, written out.
  const ModelConfig qwen = model_shape("qwen3-0.6b");
  EXPECT_EQ(qwen.hidden_size, 1024);
  EXPECT_EQ(qwen.num_hidden_layers, 28);
  EXPECT_EQ(qwen.num_attention_heads, 16);
  EXPECT_EQ(qwen.num_key_value_heads, 8);
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_EQ(qwen.intermediate_size, 3072);
  EXPECT_EQ(qwen.vocab_size, 151936);
  EXPECT_TRUE(qwen.tie_word_embeddings);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(lite.moe->n_routed_experts, 64);
  EXPECT_EQ(lite.moe->num_experts_per_tok, 6);
  EXPECT_EQ(lite.moe->n_shared_experts, 2);
  EXPECT_EQ(lite.moe->first_k_dense_replace, 1);
  EXPECT_EQ(lite.mla->kv_lora_rank, 512);
  EXPECT_EQ(lite.num_hidden_layers, 27);
  const ModelConfig tiny = model_shape("tiny");
  EXPECT_GT(tiny.vocab_size, 10000);  // nano-vllm's prompt ids are in [0, 10000]
}

TEST(ModelShapes, UnknownShapeIsNamed) {
  try {
    model_shape("qwen3-7b");
    FAIL() << "no error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'qwen3-7b'"), std::string::npos) << message;
    EXPECT_NE(message.find("tiny, qwen3-0.6b, deepseek-v2-lite"), std::string::npos) << message;
  }
  EXPECT_THROW(random_weights(model_shape("tiny"), 0, DType::kFP8E4M3), Error);
}

// Every element of every tensor of `weights` as (value, is a norm weight).
struct ElementStats {
  int64_t count = 0, norms = 0, outside = 0, norm_not_one = 0;
  double sum = 0, sum_squares = 0;
};

void visit(const TensorView& view, bool norm, ElementStats& stats) {
  if (!view.defined()) return;
  const float bound = static_cast<float>(0.02 * std::sqrt(3.0));
  const auto* bits = view.data_as<uint16_t>();
  for (int64_t i = 0; i < view.numel(); ++i) {
    const float v = bf16_to_float(bits[i]);
    if (norm) {
      ++stats.norms;
      stats.norm_not_one += v != 1.0f;
      continue;
    }
    ++stats.count;
    stats.outside += !(std::abs(v) <= bound * (1 + 1.0f / 128));  // bf16 rounding of the bound
    stats.sum += v;
    stats.sum_squares += double{v} * v;
  }
}

TEST(RandomWeights, ValuesShapesAndDeterminism) {
  const ModelConfig config = model_shape("tiny");
  const RandomWeights a = random_weights(config, 7);
  const ModelWeights& w = a.weights();
  EXPECT_EQ(w.dtype, DType::kBF16);
  EXPECT_TRUE(w.tied_lm_head);
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), config.num_hidden_layers);
  EXPECT_EQ(w.embed_tokens.shape_str(), "[10240, 256]");
  ElementStats stats;
  int64_t bytes = 0;
  auto count = [&](const TensorView& view, bool norm) {
    visit(view, norm, stats);
    if (view.defined()) bytes += view.numel() * 2;
  };
  count(w.embed_tokens, false);
  count(w.final_norm, true);
  for (const DecoderLayerWeights& layer : w.layers) {
    count(layer.input_layernorm, true);
    count(layer.post_attention_layernorm, true);
    count(layer.attention.q_proj.weight, false);
    count(layer.attention.k_proj.weight, false);
    count(layer.attention.v_proj.weight, false);
    count(layer.attention.o_proj.weight, false);
    count(layer.attention.q_norm, true);
    count(layer.attention.k_norm, true);
    count(layer.mlp.gate_proj.weight, false);
    count(layer.mlp.up_proj.weight, false);
    count(layer.mlp.down_proj.weight, false);
    EXPECT_EQ(layer.attention.q_proj.weight.shape_str(), "[256, 256]");
    EXPECT_EQ(layer.attention.k_proj.weight.shape_str(), "[128, 256]");
    EXPECT_EQ(layer.mlp.down_proj.weight.shape_str(), "[256, 768]");
  }
  EXPECT_EQ(a.bytes(), bytes);
  EXPECT_EQ(stats.norm_not_one, 0);
  EXPECT_EQ(stats.outside, 0);
  const double n = static_cast<double>(stats.count);
  const double mean = stats.sum / n;
  const double std_dev = std::sqrt(stats.sum_squares / n - mean * mean);
  // ~6M samples: the mean's standard error is 0.02 / sqrt(n) ~ 8e-6.
  EXPECT_LT(std::abs(mean), 1e-4);
  EXPECT_NEAR(std_dev, 0.02, 2e-4);

  const RandomWeights same = random_weights(config, 7);
  const RandomWeights other = random_weights(config, 8);
  const size_t embed_bytes = static_cast<size_t>(w.embed_tokens.numel() * 2);
  EXPECT_EQ(std::memcmp(w.embed_tokens.data, same.weights().embed_tokens.data, embed_bytes), 0);
  EXPECT_NE(std::memcmp(w.embed_tokens.data, other.weights().embed_tokens.data, embed_bytes), 0);
  const TensorView& down = w.layers[3].mlp.down_proj.weight;
  EXPECT_EQ(std::memcmp(down.data, same.weights().layers[3].mlp.down_proj.weight.data,
                        static_cast<size_t>(down.numel() * 2)),
            0);
  // Two tensors of one model differ (each has its own stream).
  EXPECT_NE(std::memcmp(w.layers[0].mlp.gate_proj.weight.data, w.layers[0].mlp.up_proj.weight.data,
                        static_cast<size_t>(w.layers[0].mlp.up_proj.weight.numel() * 2)),
            0);
}

TEST(RandomWeights, TinyModelRunsAStep) {
  const ModelConfig config = model_shape("tiny");
  const RandomWeights weights = random_weights(config, 1);
  Model model(config, weights.weights());
  KvPool pool = model.make_kv_pool({.alloc_page_size = 16, .num_pages = 8});
  const std::vector<int32_t> tokens = {5, 9999, 10000, 17, 3};
  const std::vector<int32_t> table = {2};
  Step step;
  step.rows = LogitsRows::kAll;
  step.requests.push_back({tokens, 0, {}, table});
  const Logits logits = model.forward(step, pool);
  ASSERT_EQ(logits.rows, 5);
  ASSERT_EQ(logits.vocab, 10240);
  double max_abs = 0;
  for (float v : logits.values) {
    ASSERT_TRUE(std::isfinite(v));
    max_abs = std::max(max_abs, double{std::abs(v)});
  }
  EXPECT_GT(max_abs, 0.0);
}

}  // namespace
}  // namespace pagedattn::model
