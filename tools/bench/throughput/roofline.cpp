// The throughput benchmark's roofline (see roofline.h).
#include "tools/bench/throughput/roofline.h"

#include <cmath>
#include <string>

#include "pagedattn/checkpoint.h"
#include "pagedattn/model.h"

namespace pagedattn::tools {

StepShape shape_of(const engine::StepPlan& plan) {
  StepShape shape;
  shape.tokens = plan.num_tokens;
  shape.sequences = static_cast<int32_t>(plan.sequences.size());
  shape.logit_rows = plan.num_logit_rows;
  for (const engine::ScheduledSequence& sequence : plan.sequences) {
    const double n = static_cast<double>(sequence.num_new_tokens());
    const double first = static_cast<double>(sequence.first_position);
    shape.decodes += sequence.num_new_tokens() == 1 ? 1 : 0;
    shape.context_tokens += sequence.context_length();
    shape.attention_keys += n * first + n * (n + 1) / 2;  // token i sees first + i + 1 keys
  }
  return shape;
}

double parameter_count(const model::ModelConfig& config) {
  double params = 0;
  for (const model::ExpectedTensor& tensor : model::expected_tensors(config)) {
    double numel = 1;
    for (int64_t extent : tensor.shape) numel *= static_cast<double>(extent);
    params += numel;
  }
  return params;
}

ModelCost model_cost(const model::ModelConfig& config, double bytes_per_weight, DType kv_dtype) {
  ModelCost cost;
  const double element = bytes_per_weight;
  const double hidden = static_cast<double>(config.hidden_size);
  const double vocab = static_cast<double>(config.vocab_size);
  double expert_params = 0;
  for (const model::ExpectedTensor& tensor : model::expected_tensors(config)) {
    double numel = 1;
    for (int64_t extent : tensor.shape) numel *= static_cast<double>(extent);
    const std::string& name = tensor.name;
    cost.all_weight_bytes += numel * element;
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight" ||
        name == "model.norm.weight") {
      continue;  // counted below (the embedding by rows, the head when logits are wanted)
    }
    if (name.find(".mlp.experts.") != std::string::npos) {
      expert_params += numel;
      continue;
    }
    cost.layer_weight_bytes += numel * element;
    if (tensor.shape.size() == 2) cost.flops_per_token += 2 * numel;  // a matrix: one product
  }
  if (config.moe) {
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      cost.moe_layers += config.is_moe_layer(layer) ? 1 : 0;
    }
    cost.experts = config.moe->n_routed_experts;
    cost.experts_per_token = config.moe->num_experts_per_tok;
    if (cost.moe_layers > 0 && cost.experts > 0) {
      const double per_expert = expert_params / static_cast<double>(cost.moe_layers * cost.experts);
      cost.expert_bytes = per_expert * element;
      cost.flops_per_token += 2 * per_expert * static_cast<double>(cost.experts_per_token) *
                              static_cast<double>(cost.moe_layers);
    }
  }
  cost.embedding_row_bytes = hidden * element;
  cost.head_bytes = (vocab * hidden + hidden) * element;
  cost.head_flops_per_row = 2 * vocab * hidden;
  cost.kv_bytes_per_token = static_cast<double>(model::KvPool::bytes_per_page(config, 1, kv_dtype));
  const double heads = static_cast<double>(config.num_attention_heads);
  const double layers = static_cast<double>(config.num_hidden_layers);
  const double qk_vo =
      config.mla ? static_cast<double>(2 * config.mla->kv_lora_rank + config.mla->qk_rope_head_dim)
                 : 2.0 * static_cast<double>(config.head_dim);
  cost.attention_flops_per_key = 2 * heads * qk_vo * layers;
  return cost;
}

StepCost step_cost(const ModelCost& model, const StepShape& step) {
  StepCost cost;
  const double tokens = static_cast<double>(step.tokens);
  double experts_touched = 0;
  if (model.experts > 0) {
    const double e = static_cast<double>(model.experts);
    const double k = static_cast<double>(model.experts_per_token);
    experts_touched = e * (1 - std::pow(1 - k / e, tokens));
  }
  cost.bytes = model.layer_weight_bytes +
               experts_touched * model.expert_bytes * static_cast<double>(model.moe_layers) +
               tokens * model.embedding_row_bytes + (step.logit_rows > 0 ? model.head_bytes : 0.0) +
               static_cast<double>(step.context_tokens) * model.kv_bytes_per_token +
               tokens * model.kv_bytes_per_token;
  cost.flops = tokens * model.flops_per_token +
               static_cast<double>(step.logit_rows) * model.head_flops_per_row +
               step.attention_keys * model.attention_flops_per_key;
  return cost;
}

RooflineTotal roofline_total(const ModelCost& model, std::span<const StepShape> steps,
                             double read_bytes_per_s, double flops_per_s) {
  RooflineTotal total;
  for (const StepShape& shape : steps) {
    const StepCost cost = step_cost(model, shape);
    const double memory = cost.bytes / read_bytes_per_s, compute = cost.flops / flops_per_s;
    if (memory >= compute) {
      ++total.memory_bound_steps;
      total.memory_s += memory;
    } else {
      total.compute_s += compute;
    }
  }
  total.seconds = total.memory_s + total.compute_s;
  return total;
}

}  // namespace pagedattn::tools
