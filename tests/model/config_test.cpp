// config.json parsing against transformers: the fixtures' configs (transformers 5's
// rope_parameters style) and real hub configs (rope_theta + rope_scaling) give the RoPE inverse
// frequencies, cos/sin scaling and softmax scale transformers 5.17 computed for them
// (tests/data/model/*/expected.json, configs/transformers_expected.json), and a float64 reference
// written here from the formulas; then the errors, each matched by its message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "checkpoint_test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model {
namespace {

using namespace checkpoint_testing;
using nlohmann::json;

// Relative tolerance against transformers' float32 inverse frequencies (float32 pow and products:
// a few ulp).
constexpr double kFloat32Tolerance = 2e-6;

void expect_near_relative(const std::vector<double>& got, const std::vector<double>& expected,
                          double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], tolerance * std::fabs(expected[i]))
        << what << " [" << i << "]";
  }
}

std::string config_error(std::string_view text) {
  try {
    parse_model_config(text, "bad/config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// ---- a float64 reference of the RoPE formulas, written from the papers / transformers' docs ----

std::vector<double> reference_inverse_frequencies(const RopeConfig& rope) {
  const int half = static_cast<int>(rope.rotary_dim / 2);
  const double d = static_cast<double>(rope.rotary_dim);
  std::vector<double> out;
  // yarn's correction range: the dimension index where a frequency makes `r` full turns over the
  // original context is d log(L / (2 pi r)) / (2 log theta).
  const double L = static_cast<double>(rope.original_max_position_embeddings);
  const auto turns_dim = [&](double r) {
    return d * std::log(L / (2.0 * std::numbers::pi * r)) / (2.0 * std::log(rope.theta));
  };
  double lo = 0, hi = 0;
  if (rope.type == RopeType::kYarn) {
    lo = turns_dim(rope.beta_fast);
    hi = turns_dim(rope.beta_slow);
    if (rope.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, d - 1);
    if (hi == lo) hi = lo + 0.001;
  }
  for (int i = 0; i < half; ++i) {
    const double base = 1.0 / std::pow(rope.theta, (2.0 * i) / d);
    double value = base;
    switch (rope.type) {
      case RopeType::kDefault:
        break;
      case RopeType::kLinear:
        value = base / rope.factor;
        break;
      case RopeType::kLlama3: {
        const double wavelength = 2.0 * std::numbers::pi / base;
        const double low_wavelength = L / rope.low_freq_factor;
        const double high_wavelength = L / rope.high_freq_factor;
        if (wavelength < high_wavelength) {
          value = base;
        } else if (wavelength > low_wavelength) {
          value = base / rope.factor;
        } else {
          const double s = (L / wavelength - rope.low_freq_factor) /
                           (rope.high_freq_factor - rope.low_freq_factor);
          value = s * base + (1.0 - s) * base / rope.factor;
        }
        break;
      }
      case RopeType::kYarn: {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
        value = ramp * (base / rope.factor) + (1.0 - ramp) * base;
        break;
      }
    }
    out.push_back(value);
  }
  return out;
}

double reference_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// ---- fixtures (transformers 5 style) ----

TEST(ModelConfig, FixturesMatchTransformers) {
  for (const std::string& name : fixture_cases()) {
    SCOPED_TRACE(name);
    const ModelConfig config = load_model_config(fixture_dir(name));
    const json raw = json::parse(read_bytes(fixture_dir(name) / "config.json"));
    const json expected = json::parse(read_bytes(fixture_dir(name) / "expected.json"));
    EXPECT_EQ(architecture_name(config.architecture), expected["architecture"].get<std::string>());
    EXPECT_EQ(config.hidden_size, raw["hidden_size"].get<int64_t>());
    EXPECT_EQ(config.num_hidden_layers, raw["num_hidden_layers"].get<int64_t>());
    EXPECT_EQ(config.vocab_size, raw["vocab_size"].get<int64_t>());
    EXPECT_EQ(config.tie_word_embeddings, raw["tie_word_embeddings"].get<bool>());
    EXPECT_EQ(std::string(rope_type_name(config.rope.type)),
              expected["rope"]["rope_type"].get<std::string>());
    expect_near_relative(config.rope.inverse_frequencies(),
                         expected["rope"]["inv_freq"].get<std::vector<double>>(), kFloat32Tolerance,
                         name + " inv_freq");
    expect_near_relative(config.rope.inverse_frequencies(),
                         reference_inverse_frequencies(config.rope), 1e-12, name + " reference");
    EXPECT_NEAR(config.rope.attention_scaling(),
                expected["rope"]["attention_scaling"].get<double>(), 1e-12);
    EXPECT_NEAR(config.softmax_scale(), expected["softmax_scale"].get<double>(), 1e-12);
  }
}

TEST(ModelConfig, FixtureFamiliesHaveTheirFields) {
  const ModelConfig llama = load_model_config(fixture_dir("llama3_bf16"));
  EXPECT_EQ(llama.num_key_value_heads, 2);
  EXPECT_EQ(llama.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(llama.dtype, DType::kBF16);
  EXPECT_EQ(llama.rope.layout, RopeLayout::kNeox);
  EXPECT_EQ(llama.rope.original_max_position_embeddings, 32);
  const ModelConfig qwen2 = load_model_config(fixture_dir("qwen2_f32"));
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias);
  EXPECT_EQ(qwen2.dtype, DType::kF32);
  const ModelConfig qwen3 = load_model_config(fixture_dir("qwen3_bf16"));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 32);
  EXPECT_FALSE(qwen3.qkv_bias);
  const ModelConfig v2 = load_model_config(fixture_dir("deepseek_v2_f16"));
  ASSERT_TRUE(v2.is_mla() && v2.moe.has_value());
  EXPECT_EQ(v2.mla->q_lora_rank, 0);
  EXPECT_EQ(v2.rope.layout, RopeLayout::kInterleaved);
  EXPECT_EQ(v2.moe->scoring, MoeScoring::kSoftmax);
  EXPECT_EQ(v2.moe->topk_method, MoeTopkMethod::kGreedy);
  EXPECT_FALSE(v2.moe->has_e_score_correction_bias);
  EXPECT_FALSE(v2.is_moe_layer(0));
  EXPECT_TRUE(v2.is_moe_layer(1));
  const ModelConfig v3 = load_model_config(fixture_dir("deepseek_v3_mla512_bf16"));
  EXPECT_EQ(v3.mla->kv_lora_rank, 512);
  EXPECT_EQ(v3.mla->qk_rope_head_dim, 64);
  EXPECT_EQ(v3.mla->q_lora_rank, 32);
  EXPECT_EQ(v3.moe->topk_method, MoeTopkMethod::kNoAuxTc);
  EXPECT_EQ(v3.moe->n_group, 4);
  EXPECT_EQ(v3.moe->topk_group, 2);
  EXPECT_DOUBLE_EQ(v3.moe->routed_scaling_factor, 2.5);
  EXPECT_TRUE(v3.moe->norm_topk_prob);
  EXPECT_TRUE(v3.moe->has_e_score_correction_bias);
  EXPECT_EQ(v3.rope.layout, RopeLayout::kInterleaved);
}

// ---- real hub configs (rope_theta + rope_scaling style) ----

TEST(ModelConfig, HubConfigsMatchTransformers) {
  const json expected =
      json::parse(read_bytes(fixture_dir("configs") / "transformers_expected.json"));
  for (const char* file : {"deepseek_v2_lite.json", "deepseek_v3.json", "llama3_1_8b.json",
                           "llama3_2_1b.json", "qwen2_5_7b.json", "qwen3_0_6b.json"}) {
    SCOPED_TRACE(file);
    const ModelConfig config = load_model_config(fixture_dir("configs") / file);
    const json& oracle = expected[file];
    ASSERT_FALSE(oracle.contains("error")) << oracle.dump();
    EXPECT_EQ(std::string(rope_type_name(config.rope.type)),
              oracle["rope_type"].get<std::string>());
    expect_near_relative(config.rope.inverse_frequencies(),
                         oracle["inv_freq"].get<std::vector<double>>(), kFloat32Tolerance, file);
    expect_near_relative(config.rope.inverse_frequencies(),
                         reference_inverse_frequencies(config.rope), 1e-12, file);
    EXPECT_NEAR(config.rope.attention_scaling(), oracle["attention_scaling"].get<double>(), 1e-12);
    EXPECT_NEAR(config.softmax_scale(), oracle["softmax_scale"].get<double>(), 1e-12);
  }
}

TEST(ModelConfig, DeepseekMlaSoftmaxScale) {
  // mscale^2 / sqrt(qk_nope + qk_rope) with mscale = 0.1 mscale_all_dim ln(40) + 1.
  const ModelConfig lite = load_model_config(fixture_dir("configs") / "deepseek_v2_lite.json");
  const double lite_mscale = reference_mscale(40.0, 0.707);
  EXPECT_NEAR(lite.softmax_scale(), lite_mscale * lite_mscale / std::sqrt(192.0), 1e-15);
  EXPECT_NEAR(lite.softmax_scale(), 0.114721, 5e-7);
  const ModelConfig v3 = load_model_config(fixture_dir("configs") / "deepseek_v3.json");
  EXPECT_NEAR(v3.softmax_scale(), 0.135234, 5e-7);
  EXPECT_DOUBLE_EQ(v3.rope.attention_scaling(), 1.0);  // mscale / mscale_all_dim = 1
}

TEST(ModelConfig, HubConfigFields) {
  const auto path = fixture_dir("configs");
  const ModelConfig lite = load_model_config(path / "deepseek_v2_lite.json");
  EXPECT_EQ(lite.architecture, Architecture::kDeepseekV2);
  EXPECT_EQ(lite.mla->q_lora_rank, 0);
  EXPECT_EQ(lite.mla->kv_lora_rank, 512);
  EXPECT_EQ(lite.mla->qk_head_dim(), 192);
  EXPECT_EQ(lite.moe->n_routed_experts, 64);
  EXPECT_EQ(lite.moe->num_experts_per_tok, 6);
  EXPECT_EQ(lite.moe->n_shared_experts, 2);
  EXPECT_EQ(lite.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(lite.rope.factor, 40.0);
  EXPECT_EQ(*lite.rope.mscale, 0.707);
  const ModelConfig v3 = load_model_config(path / "deepseek_v3.json");
  EXPECT_EQ(v3.quantization_method, "fp8");
  EXPECT_EQ(v3.num_nextn_predict_layers, 1);
  EXPECT_EQ(v3.moe->n_group, 8);
  EXPECT_TRUE(v3.is_moe_layer(3));
  EXPECT_FALSE(v3.is_moe_layer(2));
  const ModelConfig llama = load_model_config(path / "llama3_1_8b.json");
  EXPECT_EQ(llama.head_dim, 128);
  EXPECT_EQ(llama.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(llama.bos_token_id, 128000);
  const ModelConfig qwen2 = load_model_config(path / "qwen2_5_7b.json");
  EXPECT_TRUE(qwen2.qkv_bias);  // sliding_window is set but use_sliding_window is false: accepted
  EXPECT_DOUBLE_EQ(qwen2.rope.theta, 1e6);
  const ModelConfig qwen3 = load_model_config(path / "qwen3_0_6b.json");
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_TRUE(qwen3.tie_word_embeddings);
  EXPECT_TRUE(qwen3.qk_norm);
}

// ---- RoPE variants beyond the fixtures, against the reference ----

TEST(RopeConfig, VariantsMatchTheReference) {
  RopeConfig rope;
  rope.rotary_dim = 96;
  rope.theta = 25000.0;
  for (bool truncate : {true, false}) {
    rope.type = RopeType::kYarn;
    rope.factor = 16.0;
    rope.original_max_position_embeddings = 2048;
    rope.beta_fast = 24.0;
    rope.beta_slow = 2.0;
    rope.truncate = truncate;
    expect_near_relative(rope.inverse_frequencies(), reference_inverse_frequencies(rope), 1e-12,
                         "yarn");
  }
  rope.type = RopeType::kLlama3;
  rope.low_freq_factor = 2.0;
  rope.high_freq_factor = 8.0;
  expect_near_relative(rope.inverse_frequencies(), reference_inverse_frequencies(rope), 1e-12,
                       "llama3");
  // yarn's cos/sin factor: explicit attention_factor, mscale / mscale_all_dim, or 0.1 ln f + 1.
  rope.type = RopeType::kYarn;
  EXPECT_DOUBLE_EQ(rope.attention_scaling(), reference_mscale(16.0, 1.0));
  rope.mscale = 0.8;
  EXPECT_DOUBLE_EQ(rope.attention_scaling(), reference_mscale(16.0, 1.0));  // needs both
  rope.mscale_all_dim = 0.5;
  EXPECT_DOUBLE_EQ(rope.attention_scaling(),
                   reference_mscale(16.0, 0.8) / reference_mscale(16.0, 0.5));
  rope.attention_factor_override = 1.25;
  EXPECT_DOUBLE_EQ(rope.attention_scaling(), 1.25);
}

TEST(ModelConfig, PartialRotaryAndYarnFactorFromContexts) {
  const ModelConfig config = parse_model_config(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
    "max_position_embeddings": 32768, "partial_rotary_factor": 0.5,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0,
                        "original_max_position_embeddings": 4096}})");
  EXPECT_EQ(config.rope.rotary_dim, 32);
  EXPECT_DOUBLE_EQ(config.rope.factor, 8.0);  // max_position_embeddings / original
  EXPECT_DOUBLE_EQ(config.rope.theta, 50000.0);
  EXPECT_EQ(config.rope.inverse_frequencies().size(), 16u);
}

// ---- errors ----

constexpr const char* kLlamaBase = R"("hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100)";

std::string llama_with(std::string_view extra) {
  return fmt::format(R"({{"architectures": ["LlamaForCausalLM"], {}{}}})", kLlamaBase, extra);
}

std::string deepseek_with(std::string_view architecture, std::string_view extra) {
  return fmt::format(R"({{"architectures": ["{}"], {}, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
      "qk_rope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 32{}}})",
                     architecture, kLlamaBase, extra);
}

TEST(ModelConfig, ErrorsNameTheFieldAndWhatIsSupported) {
  EXPECT_CONTAINS(config_error(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 4})"),
                  "bad/config.json: architectures [MistralForCausalLM] is not supported "
                  "(supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                  "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  EXPECT_CONTAINS(config_error(R"({"model_type": "gemma"})"), "model_type 'gemma'");
  EXPECT_EQ(config_error(fmt::format(R"({{"model_type": "qwen3", {}}})", kLlamaBase)), "");
  EXPECT_CONTAINS(config_error("{"), "bad/config.json: not valid JSON");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "hidden_act": "gelu")")),
                  "hidden_act is 'gelu'; only silu is supported");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "mlp_bias": true)")), "mlp_bias is true");
  EXPECT_CONTAINS(config_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})"),
                  "num_hidden_layers is missing, expected an integer >= 1");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "num_key_value_heads": "2")")),
                  "num_key_value_heads is \"2\", expected an integer >= 1");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "num_key_value_heads": 3)")),
                  "num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "torch_dtype": "float8")")),
                  "torch_dtype is 'float8', expected bfloat16, float16 or float32");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "rope_scaling": {"type": "dynamic", "factor": 2})")),
                  "rope_scaling.rope_type is 'dynamic', which is not supported (supported: "
                  "default, linear, llama3, yarn)");
  EXPECT_CONTAINS(config_error(llama_with(
                      R"(, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4})")),
                  "rope_parameters.rope_type is 'longrope'");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "rope_scaling": {"rope_type": "linear"})")),
                  "rope_scaling: factor is missing");
  EXPECT_CONTAINS(
      config_error(llama_with(
          R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1})")),
      "high_freq_factor is missing");
  EXPECT_CONTAINS(config_error(llama_with(
                      R"(, "rope_parameters": {"full_attention": {"rope_type": "default"},
                         "sliding_attention": {"rope_type": "default"}})")),
                  "rope_parameters has an entry for layer type 'sliding_attention'");
  EXPECT_CONTAINS(config_error(fmt::format(R"({{"architectures": ["Qwen2ForCausalLM"], {},
                                             "use_sliding_window": true}})",
                                           kLlamaBase)),
                  "use_sliding_window is true; sliding-window attention is not supported");
  EXPECT_CONTAINS(config_error(fmt::format(R"({{"architectures": ["Qwen3ForCausalLM"], {},
                      "layer_types": ["full_attention", "sliding_attention"]}})",
                                           kLlamaBase)),
                  "layer_types holds \"sliding_attention\"");
  EXPECT_CONTAINS(config_error(llama_with(R"(, "partial_rotary_factor": 0.1)")),
                  "the rotary dimension head_dim 16 x partial_rotary_factor 0.1 = 1 must be even");
}

TEST(ModelConfig, DeepseekErrors) {
  EXPECT_EQ(config_error(deepseek_with("DeepseekV2ForCausalLM", "")), "");
  EXPECT_EQ(
      config_error(deepseek_with("DeepseekV3ForCausalLM", ", \"n_group\": 4, \"topk_group\": 2")),
      "");
  EXPECT_CONTAINS(config_error(deepseek_with("DeepseekV2ForCausalLM", ", \"moe_layer_freq\": 2")),
                  "moe_layer_freq is 2; only 1 is supported");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV3ForCausalLM", ", \"scoring_func\": \"softmax\"")),
      "scoring_func is 'softmax'; DeepseekV3ForCausalLM supports sigmoid only");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV2ForCausalLM", ", \"topk_method\": \"noaux_tc\"")),
      "topk_method is 'noaux_tc'; DeepseekV2ForCausalLM supports greedy and group_limited_greedy");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV3ForCausalLM", ", \"n_group\": 3, \"topk_group\": 2")),
      "n_routed_experts 8 in n_group 3 groups");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV3ForCausalLM", ", \"n_group\": 8, \"topk_group\": 2")),
      "noaux_tc scores a group by its top two experts; 1 experts per group");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV2ForCausalLM", ", \"num_experts_per_tok\": 9")),
      "num_experts_per_tok 9 exceeds n_routed_experts 8");
  EXPECT_CONTAINS(
      config_error(deepseek_with("DeepseekV2ForCausalLM", ", \"attention_bias\": true")),
      "attention_bias is true; DeepSeek attention biases are not supported");
  const ModelConfig neox =
      parse_model_config(deepseek_with("DeepseekV3ForCausalLM", ", \"rope_interleave\": false"));
  EXPECT_EQ(neox.rope.layout, RopeLayout::kNeox);
}

TEST(ModelConfig, LoadNamesAMissingFile) {
  TempDir dir;
  try {
    load_model_config(dir.path());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_CONTAINS(error.what(), (dir.path() / "config.json").string() + ": cannot open");
  }
}

}  // namespace
}  // namespace pagedattn::model
