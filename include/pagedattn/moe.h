// Mixture-of-experts for DeepSeek-V2 / V3: the router (which experts each token goes to, with
// what weight) and the routed experts run as grouped GEMMs over the tokens sorted by expert.
//
// Routing matches transformers' DeepseekV2Moe / DeepseekV3TopkRouter, in f32 over the router
// logits [T, E] (gate weight · x, computed by the caller with a Linear):
//   kSoftmaxGreedy          softmax over E, top-k
//   kSoftmaxGroupLimited    softmax; group score = max of the group; keep the topk_group best
//                           groups (others' scores read as 0); top-k
//   kSigmoidNoAuxTc (V3)    s = sigmoid; choice = s + e_score_correction_bias; group score = sum
//                           of the group's two best choices; keep topk_group groups (others read
//                           -inf: never chosen); top-k of choice; weights are s (without the bias)
// then, if norm_topk_prob: weights /= (sum + 1e-20) (V3 always adds the 1e-20; V2 as DeepSeek's
// reference and vLLM do, where transformers' V2 ignores the flag: DeepSeek-V2 checkpoints set it
// false), and weights *= routed_scaling_factor.
//
// Experts: expert e is gate_up_e [2 I, H] (gate rows then up rows) and down_e [H, I]. The tokens
// are counted and sorted by expert (a counting sort of the T·k assignments); each expert with
// tokens runs gate_up as one GEMM over its gathered rows, SiLU·mul, down as one GEMM, and the rows
// are scattered back, scaled by their weights, into out (summed over a token's k experts in a
// fixed order, so the result does not depend on thread timing).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/linear.h"
#include "pagedattn/tensor.h"

namespace pagedattn::ops {

enum class MoeRouting : uint8_t { kSoftmaxGreedy, kSoftmaxGroupLimited, kSigmoidNoAuxTc };

struct MoeRouterConfig {
  MoeRouting method = MoeRouting::kSoftmaxGreedy;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t num_groups = 1;   // n_group (grouped methods)
  int32_t topk_groups = 1;  // topk_group
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// The routing of T tokens: expert ids and weights, [T, top_k] row-major.
struct MoeAssignment {
  int32_t tokens = 0;
  int32_t top_k = 0;
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// logits [T, E] f32 (modified: scores are computed in place); correction_bias [E] (any float
// dtype) for kSigmoidNoAuxTc, absent otherwise. Throws Error on an inconsistent config (E not a
// multiple of the groups, top_k > experts in the kept groups, ...).
void moe_route(const TensorView& logits, const MoeRouterConfig& config,
               const TensorView& correction_bias, MoeAssignment& assignment);

// The routed experts of one layer.
class MoeExperts {
 public:
  MoeExperts() = default;
  // gate_up[e]: the stacked gate/up Linear of expert e ([2 I, H]); down[e]: [H, I].
  MoeExperts(std::vector<Linear> gate_up, std::vector<Linear> down);
  int32_t num_experts() const { return static_cast<int32_t>(down_.size()); }
  int64_t owned_bytes() const;

  // out [T, H] = Σ_k weight[t, k] · expert_{e[t, k]}(x[t]); out is overwritten. x, out: f32.
  void forward(const TensorView& x, const MoeAssignment& assignment, const TensorView& out) const;

 private:
  std::vector<Linear> gate_up_, down_;
  int64_t hidden_ = 0, intermediate_ = 0;
};

}  // namespace pagedattn::ops
