// config.json -> ModelConfig: the architecture (the first supported entry of `architectures`, else
// `model_type`), the fields every family shares, then each family's own (biases, q/k norms, MLA
// and MoE for DeepSeek). Defaults are transformers 5's for the family; anything the runtime would
// run differently from transformers is rejected with the field, its value and what is supported.
#include <fstream>
#include <sstream>

#include "checkpoint/config_parse.h"
#include "checkpoint/json_fields.h"
#include "core/check.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model {

using detail::JsonFields;
using nlohmann::json;

namespace {

struct ArchitectureName {
  Architecture architecture;
  std::string_view class_name;
  std::string_view model_type;
};

constexpr ArchitectureName kArchitectures[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
    {Architecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
};

Architecture select_architecture(const JsonFields& fields, std::string* model_type) {
  const std::string& source = fields.source();
  *model_type = fields.optional_string("model_type").value_or("");
  if (const json* list = fields.find("architectures")) {
    PA_CHECK(list->is_array(), "{}: architectures is {}, expected a list of class names", source,
             JsonFields::describe(*list));
    std::string seen;
    for (const json& entry : *list) {
      PA_CHECK(entry.is_string(), "{}: architectures holds {}, expected class names", source,
               JsonFields::describe(entry));
      for (const ArchitectureName& known : kArchitectures) {
        if (entry.get<std::string>() == known.class_name) return known.architecture;
      }
      if (!seen.empty()) seen += ", ";
      seen += entry.get<std::string>();
    }
    PA_FAIL("{}: architectures [{}] is not supported (supported: {})", source, seen,
            supported_architectures());
  }
  for (const ArchitectureName& known : kArchitectures) {
    if (*model_type == known.model_type) return known.architecture;
  }
  PA_FAIL("{}: model_type '{}' (and no architectures list) is not supported (supported: {})",
          source, *model_type, supported_architectures());
}

std::optional<DType> parse_config_dtype(const JsonFields& fields) {
  std::optional<std::string> name = fields.optional_string("dtype");
  std::string_view key = "dtype";
  if (!name) {
    name = fields.optional_string("torch_dtype");
    key = "torch_dtype";
  }
  if (!name) return std::nullopt;
  if (*name == "bfloat16") return DType::kBF16;
  if (*name == "float16") return DType::kF16;
  if (*name == "float32") return DType::kF32;
  PA_FAIL("{}: {} is '{}', expected bfloat16, float16 or float32", fields.source(), key, *name);
}

std::vector<int64_t> parse_token_ids(const JsonFields& fields, std::string_view key) {
  const json* value = fields.find(key);
  if (value == nullptr) return {};
  std::vector<int64_t> ids;
  const auto take = [&](const json& id) {
    PA_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
             "{}: {} holds {}, expected non-negative token ids", fields.source(), key,
             JsonFields::describe(id));
    ids.push_back(id.get<int64_t>());
  };
  if (value->is_array()) {
    for (const json& id : *value) take(id);
  } else {
    take(*value);
  }
  return ids;
}

void reject_sliding_window(const JsonFields& fields) {
  PA_CHECK(!fields.bool_or("use_sliding_window", false),
           "{}: use_sliding_window is true; sliding-window attention is not supported",
           fields.source());
  if (const json* layer_types = fields.find("layer_types")) {
    PA_CHECK(layer_types->is_array(), "{}: layer_types is {}, expected a list", fields.source(),
             JsonFields::describe(*layer_types));
    for (const json& type : *layer_types) {
      PA_CHECK(type == "full_attention",
               "{}: layer_types holds {}; only full_attention layers are supported (sliding-window "
               "attention is not)",
               fields.source(), JsonFields::describe(type));
    }
  }
}

MlaConfig parse_mla(const JsonFields& fields) {
  MlaConfig mla;
  mla.q_lora_rank = fields.int_or("q_lora_rank", 0, 1);  // null: no q compression
  mla.kv_lora_rank = fields.required_int("kv_lora_rank");
  mla.qk_nope_head_dim = fields.required_int("qk_nope_head_dim");
  mla.qk_rope_head_dim = fields.required_int("qk_rope_head_dim");
  mla.v_head_dim = fields.required_int("v_head_dim");
  PA_CHECK(mla.qk_rope_head_dim % 2 == 0, "{}: qk_rope_head_dim is {}, expected an even number",
           fields.source(), mla.qk_rope_head_dim);
  return mla;
}

MoeConfig parse_moe(const JsonFields& fields, Architecture architecture, int64_t num_layers) {
  const std::string& source = fields.source();
  const bool v3 = architecture == Architecture::kDeepseekV3;
  MoeConfig moe;
  moe.n_routed_experts = fields.required_int("n_routed_experts");
  moe.num_experts_per_tok = fields.required_int("num_experts_per_tok");
  moe.n_shared_experts = fields.int_or("n_shared_experts", 0, 0);
  moe.moe_intermediate_size = fields.required_int("moe_intermediate_size");
  moe.first_k_dense_replace = fields.int_or("first_k_dense_replace", 0, 0);
  moe.moe_layer_freq = fields.int_or("moe_layer_freq", 1, 1);
  moe.routed_scaling_factor = fields.number_or("routed_scaling_factor", 1.0);
  moe.norm_topk_prob = fields.bool_or("norm_topk_prob", false);
  moe.n_group = fields.int_or("n_group", 1, 1);
  moe.topk_group = fields.int_or("topk_group", 1, 1);
  PA_CHECK(moe.moe_layer_freq == 1,
           "{}: moe_layer_freq is {}; only 1 is supported (transformers makes every layer from "
           "first_k_dense_replace on MoE)",
           source, moe.moe_layer_freq);
  PA_CHECK(moe.num_experts_per_tok <= moe.n_routed_experts,
           "{}: num_experts_per_tok {} exceeds n_routed_experts {}", source,
           moe.num_experts_per_tok, moe.n_routed_experts);
  PA_CHECK(moe.first_k_dense_replace <= num_layers,
           "{}: first_k_dense_replace {} exceeds num_hidden_layers {}", source,
           moe.first_k_dense_replace, num_layers);

  // Scoring and top-k as transformers runs them: V2 scores with softmax, V3 with sigmoid plus the
  // correction bias and grouped top-k (whatever the fields say), so other values are refused.
  const std::string scoring =
      fields.optional_string("scoring_func").value_or(v3 ? "sigmoid" : "softmax");
  const std::string method =
      fields.optional_string("topk_method").value_or(v3 ? "noaux_tc" : "greedy");
  if (v3) {
    PA_CHECK(scoring == "sigmoid",
             "{}: scoring_func is '{}'; DeepseekV3ForCausalLM supports "
             "sigmoid only",
             source, scoring);
    PA_CHECK(method == "noaux_tc",
             "{}: topk_method is '{}'; DeepseekV3ForCausalLM supports "
             "noaux_tc only",
             source, method);
    moe.scoring = MoeScoring::kSigmoid;
    moe.topk_method = MoeTopkMethod::kNoAuxTc;
    moe.has_e_score_correction_bias = true;
  } else {
    PA_CHECK(scoring == "softmax",
             "{}: scoring_func is '{}'; DeepseekV2ForCausalLM supports "
             "softmax only",
             source, scoring);
    PA_CHECK(method == "greedy" || method == "group_limited_greedy",
             "{}: topk_method is '{}'; DeepseekV2ForCausalLM supports greedy and "
             "group_limited_greedy",
             source, method);
    moe.scoring = MoeScoring::kSoftmax;
    moe.topk_method =
        method == "greedy" ? MoeTopkMethod::kGreedy : MoeTopkMethod::kGroupLimitedGreedy;
  }
  if (moe.topk_method != MoeTopkMethod::kGreedy) {
    PA_CHECK(moe.n_routed_experts % moe.n_group == 0 && moe.topk_group <= moe.n_group,
             "{}: n_routed_experts {} in n_group {} groups with topk_group {}: expected groups "
             "that divide the experts and topk_group <= n_group",
             source, moe.n_routed_experts, moe.n_group, moe.topk_group);
    const int64_t per_group = moe.n_routed_experts / moe.n_group;
    PA_CHECK(moe.topk_method != MoeTopkMethod::kNoAuxTc || per_group >= 2,
             "{}: noaux_tc scores a group by its top two experts; {} experts per group", source,
             per_group);
    PA_CHECK(moe.num_experts_per_tok <= moe.topk_group * per_group,
             "{}: num_experts_per_tok {} exceeds the {} experts of topk_group {} groups", source,
             moe.num_experts_per_tok, moe.topk_group * per_group, moe.topk_group);
  }
  return moe;
}

}  // namespace

std::string_view architecture_name(Architecture architecture) {
  for (const ArchitectureName& known : kArchitectures) {
    if (known.architecture == architecture) return known.class_name;
  }
  return "?";
}

std::string supported_architectures() {
  std::string text;
  for (const ArchitectureName& known : kArchitectures) {
    if (!text.empty()) text += ", ";
    text += known.class_name;
  }
  return text;
}

std::string_view moe_scoring_name(MoeScoring scoring) {
  return scoring == MoeScoring::kSoftmax ? "softmax" : "sigmoid";
}

std::string_view moe_topk_method_name(MoeTopkMethod method) {
  switch (method) {
    case MoeTopkMethod::kGreedy:
      return "greedy";
    case MoeTopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case MoeTopkMethod::kNoAuxTc:
      return "noaux_tc";
  }
  return "?";
}

ModelConfig parse_model_config(std::string_view json_text, std::string_view source_name) {
  const std::string source(source_name);
  const json document = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  PA_CHECK(!document.is_discarded(), "{}: not valid JSON", source);
  PA_CHECK(document.is_object(), "{}: expected a JSON object, got {}", source,
           JsonFields::describe(document));
  const JsonFields fields(document, source);

  ModelConfig config;
  config.architecture = select_architecture(fields, &config.model_type);
  const Architecture arch = config.architecture;
  const bool deepseek = arch == Architecture::kDeepseekV2 || arch == Architecture::kDeepseekV3;

  config.hidden_size = fields.required_int("hidden_size");
  config.num_hidden_layers = fields.required_int("num_hidden_layers");
  config.num_attention_heads = fields.required_int("num_attention_heads");
  config.num_key_value_heads = fields.int_or("num_key_value_heads", config.num_attention_heads, 1);
  config.intermediate_size = fields.required_int("intermediate_size");
  config.vocab_size = fields.required_int("vocab_size");
  config.max_position_embeddings = fields.int_or("max_position_embeddings", 0, 1);
  config.rms_norm_eps = fields.number_or("rms_norm_eps", 1e-6);
  PA_CHECK(config.rms_norm_eps > 0.0, "{}: rms_norm_eps is {}, expected a positive number", source,
           config.rms_norm_eps);
  config.tie_word_embeddings = fields.bool_or("tie_word_embeddings", false);
  config.bos_token_id = fields.optional_int("bos_token_id", 0);
  config.eos_token_ids = parse_token_ids(fields, "eos_token_id");
  config.pad_token_id = fields.optional_int("pad_token_id", 0);
  config.dtype = parse_config_dtype(fields);
  config.hidden_act = fields.optional_string("hidden_act").value_or("silu");
  PA_CHECK(config.hidden_act == "silu" || config.hidden_act == "swish",
           "{}: hidden_act is '{}'; only silu is supported", source, config.hidden_act);
  config.hidden_act = "silu";
  if (const json* quantization = fields.find("quantization_config")) {
    const json* method = quantization->is_object() && quantization->contains("quant_method")
                             ? &(*quantization)["quant_method"]
                             : nullptr;
    config.quantization_method =
        method != nullptr && method->is_string() ? method->get<std::string>() : "unknown";
  }
  config.attention_bias = fields.bool_or("attention_bias", false);
  PA_CHECK(!fields.bool_or("mlp_bias", false), "{}: mlp_bias is true; MLP biases are not supported",
           source);

  if (deepseek) {
    config.mla = parse_mla(fields);
    config.num_key_value_heads = config.num_attention_heads;  // MLA: one latent shared by all heads
    config.head_dim = config.mla->qk_rope_head_dim;           // as transformers sets it
    config.moe = parse_moe(fields, arch, config.num_hidden_layers);
    config.num_nextn_predict_layers = fields.int_or("num_nextn_predict_layers", 0, 0);
    PA_CHECK(!config.attention_bias,
             "{}: attention_bias is true; DeepSeek attention biases are "
             "not supported",
             source);
    const RopeLayout layout =
        arch == Architecture::kDeepseekV2 || fields.bool_or("rope_interleave", true)
            ? RopeLayout::kInterleaved
            : RopeLayout::kNeox;
    config.rope = detail::parse_rope(fields, config.mla->qk_rope_head_dim,
                                     config.max_position_embeddings, layout);
    return config;
  }

  PA_CHECK(config.num_attention_heads % config.num_key_value_heads == 0,
           "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
           config.num_attention_heads, config.num_key_value_heads);
  if (const auto head_dim = fields.optional_int("head_dim", 1)) {
    config.head_dim = *head_dim;
  } else {
    PA_CHECK(config.hidden_size % config.num_attention_heads == 0,
             "{}: hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim)",
             source, config.hidden_size, config.num_attention_heads);
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  reject_sliding_window(fields);
  switch (arch) {
    case Architecture::kQwen2:  // q/k/v always carry biases, o_proj never
      config.qkv_bias = true;
      config.o_bias = false;
      break;
    case Architecture::kQwen3:
      config.qk_norm = true;
      [[fallthrough]];
    default:  // Llama, Qwen3: attention_bias puts a bias on q, k, v and o
      config.qkv_bias = config.attention_bias;
      config.o_bias = config.attention_bias;
      break;
  }
  config.rope = detail::parse_rope(fields, config.head_dim, config.max_position_embeddings,
                                   RopeLayout::kNeox);
  return config;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) file = path / "config.json";
  std::ifstream stream(file, std::ios::binary);
  PA_CHECK(stream.good(),
           "{}: cannot open (expected a config.json or a model directory holding "
           "one)",
           file.string());
  std::ostringstream text;
  text << stream.rdbuf();
  return parse_model_config(text.str(), file.string());
}

}  // namespace pagedattn::model
