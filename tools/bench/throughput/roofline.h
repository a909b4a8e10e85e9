// The throughput benchmark's roofline: what one engine step must at least read and compute, from
// the model's shape and the step's plan, and the step's floor time against two ceilings measured
// in the same run (a streaming memory read, a large GEMM).
//
// Per step:
//   bytes = every decoder-layer weight once (as stored: bf16 for the random shapes), MoE layers
//           only the routed experts the step's T tokens touch in expectation if routing were
//           uniform (E (1 - (1 - k/E)^T) of E), + the embedding rows gathered, + final norm and
//           lm_head when a row wants logits, + the KV of every scheduled sequence (its whole
//           context, cached + new) read once, + the new tokens' KV written;
//   flops = 2 x the linear parameters each token runs through (attention projections, dense MLP
//           or router + shared + k routed experts), + 2 x vocab x hidden per logits row, + the
//           attention's QK and PV products over each new token's causal context (MLA: absorbed,
//           576-wide keys, 512-wide values);
//   floor = max(bytes / read ceiling, flops / GEMM ceiling).
// Activations, norms' arithmetic and sampling are left out (small beside weights and KV), so the
// floor is a lower bound on the step's time and the roofline an upper bound on tokens/s.
#pragma once

#include <cstdint>
#include <span>

#include "pagedattn/dtype.h"
#include "pagedattn/engine_model_runner.h"
#include "pagedattn/model_config.h"

namespace pagedattn::tools {

// What the roofline needs of one step (engine::StepPlan, summarised).
struct StepShape {
  int64_t tokens = 0;  // new tokens
  int32_t sequences = 0;
  int32_t decodes = 0;  // single-token decode sequences
  int32_t logit_rows = 0;
  int64_t context_tokens = 0;  // sum over sequences of cached + new tokens (the KV read)
  double attention_keys = 0;   // sum over new tokens of the keys each attends (causal)
  bool decode_only() const { return decodes == sequences; }
};
StepShape shape_of(const engine::StepPlan& plan);

// The model's per-step costs, from expected_tensors(config) (the tensors a checkpoint of the
// config holds; `bytes_per_weight` their element size as stored) and the KV pool's bytes per token.
struct ModelCost {
  double layer_weight_bytes = 0;  // decoder layers, less the routed experts
  double expert_bytes = 0;        // one routed expert of one MoE layer (gate + up + down)
  int64_t moe_layers = 0, experts = 0, experts_per_token = 0;
  double embedding_row_bytes = 0;
  double head_bytes = 0;               // final norm + lm_head (the embedding when tied)
  double kv_bytes_per_token = 0;       // all layers
  double flops_per_token = 0;          // 2 x linear parameters per token, routed experts included
  double head_flops_per_row = 0;       // 2 x vocab x hidden
  double attention_flops_per_key = 0;  // per (query token, key) over all layers and heads
  double all_weight_bytes = 0;         // every tensor once (the tied lm_head once)
};
ModelCost model_cost(const model::ModelConfig& config, double bytes_per_weight, DType kv_dtype);
// Parameters of every tensor once (the tied lm_head once).
double parameter_count(const model::ModelConfig& config);

struct StepCost {
  double bytes = 0;
  double flops = 0;
};
StepCost step_cost(const ModelCost& model, const StepShape& step);

// The roofline of a run: the sum over its steps of max(bytes / read rate, flops / compute rate).
struct RooflineTotal {
  double seconds = 0;
  double memory_s = 0;   // the part from memory-bound steps
  double compute_s = 0;  // the part from compute-bound steps
  int64_t memory_bound_steps = 0;
};
RooflineTotal roofline_total(const ModelCost& model, std::span<const StepShape> steps,
                             double read_bytes_per_s, double flops_per_s);

}  // namespace pagedattn::tools
