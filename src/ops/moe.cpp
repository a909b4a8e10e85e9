// MoE routing and grouped expert GEMMs on the CPU (see include/pagedattn/moe.h for the maths).
#include "pagedattn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ops/rows.h"
#include "pagedattn/ops.h"

namespace pagedattn::ops {
namespace {

// Indices of the k largest values (ties: the lower index first), in descending order.
void top_k_indices(const float* values, int32_t n, int32_t k, int32_t* out) {
  thread_local std::vector<int32_t> order;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  std::copy(order.begin(), order.begin() + k, out);
}

void check_config(const MoeRouterConfig& c, int64_t experts) {
  PA_CHECK(c.num_experts == experts, "moe router: logits have {} experts, config says {}", experts,
           c.num_experts);
  PA_CHECK(c.top_k >= 1 && c.top_k <= c.num_experts,
           "moe router: num_experts_per_tok {} (expected 1..{})", c.top_k, c.num_experts);
  if (c.method != MoeRouting::kSoftmaxGreedy) {
    PA_CHECK(c.num_groups >= 1 && c.num_experts % c.num_groups == 0,
             "moe router: n_group {} does not divide n_routed_experts {}", c.num_groups,
             c.num_experts);
    PA_CHECK(c.topk_groups >= 1 && c.topk_groups <= c.num_groups,
             "moe router: topk_group {} (expected 1..n_group {})", c.topk_groups, c.num_groups);
  }
  if (c.method == MoeRouting::kSigmoidNoAuxTc) {
    PA_CHECK(c.num_experts / c.num_groups >= 2,
             "moe router: noaux_tc needs >= 2 experts per group (n_routed_experts {}, n_group {})",
             c.num_experts, c.num_groups);
  }
}

}  // namespace

void moe_route(const TensorView& logits, const MoeRouterConfig& config,
               const TensorView& correction_bias, MoeAssignment& assignment) {
  const detail::Rows rows = detail::rows_of("moe logits", logits, DType::kF32);
  PA_CHECK(logits.ndim == 2, "moe logits: shape {} (expected [tokens, experts])",
           logits.shape_str());
  const int32_t experts = static_cast<int32_t>(rows.dim);
  check_config(config, experts);
  std::vector<float> bias;
  if (config.method == MoeRouting::kSigmoidNoAuxTc) {
    PA_CHECK(correction_bias.defined(), "moe router: noaux_tc needs e_score_correction_bias");
    bias = detail::weight_vector("e_score_correction_bias", correction_bias, experts);
  }
  const int32_t tokens = static_cast<int32_t>(rows.count), k = config.top_k;
  assignment.tokens = tokens;
  assignment.top_k = k;
  assignment.experts.assign(static_cast<size_t>(tokens) * k, 0);
  assignment.weights.assign(static_cast<size_t>(tokens) * k, 0.0f);
  const int32_t groups = config.num_groups, per_group = experts / std::max(1, groups);

#pragma omp parallel for if (tokens > 16)
  for (int32_t t = 0; t < tokens; ++t) {
    float* scores = rows.row<float>(t);
    std::vector<float> choice(scores, scores + experts);
    if (config.method == MoeRouting::kSigmoidNoAuxTc) {
      for (int32_t e = 0; e < experts; ++e) {
        scores[e] = 1.0f / (1.0f + std::exp(-scores[e]));
        choice[static_cast<size_t>(e)] = scores[e] + bias[static_cast<size_t>(e)];
      }
    } else {
      float max = -INFINITY;
      for (int32_t e = 0; e < experts; ++e) max = std::max(max, scores[e]);
      float sum = 0.0f;
      for (int32_t e = 0; e < experts; ++e) sum += (scores[e] = std::exp(scores[e] - max));
      for (int32_t e = 0; e < experts; ++e) choice[static_cast<size_t>(e)] = (scores[e] /= sum);
    }
    if (config.method != MoeRouting::kSoftmaxGreedy) {
      std::vector<float> group_score(static_cast<size_t>(groups));
      for (int32_t g = 0; g < groups; ++g) {
        const float* c = choice.data() + g * per_group;
        if (config.method == MoeRouting::kSoftmaxGroupLimited) {
          group_score[static_cast<size_t>(g)] = *std::max_element(c, c + per_group);
        } else {
          int32_t best[2];
          top_k_indices(c, per_group, 2, best);
          group_score[static_cast<size_t>(g)] = c[best[0]] + c[best[1]];
        }
      }
      std::vector<int32_t> kept(static_cast<size_t>(config.topk_groups));
      top_k_indices(group_score.data(), groups, config.topk_groups, kept.data());
      std::vector<char> keep(static_cast<size_t>(groups), 0);
      for (int32_t g : kept) keep[static_cast<size_t>(g)] = 1;
      for (int32_t e = 0; e < experts; ++e) {
        // transformers 5.17: V2 sets the other groups' scores to 0 (softmax scores are > 0, so
        // they are never chosen), V3 to -inf (sigmoid + a negative bias can be < 0).
        if (!keep[static_cast<size_t>(e / per_group)]) {
          choice[static_cast<size_t>(e)] =
              config.method == MoeRouting::kSigmoidNoAuxTc ? -INFINITY : 0.0f;
        }
      }
    }
    int32_t* ids = assignment.experts.data() + static_cast<size_t>(t) * k;
    float* weights = assignment.weights.data() + static_cast<size_t>(t) * k;
    top_k_indices(choice.data(), experts, k, ids);
    float sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) sum += (weights[j] = scores[ids[j]]);
    const bool normalize =
        config.norm_topk_prob && (config.method == MoeRouting::kSigmoidNoAuxTc || k > 1);
    const float denominator = config.method == MoeRouting::kSigmoidNoAuxTc ? sum + 1e-20f : sum;
    for (int32_t j = 0; j < k; ++j) {
      if (normalize) weights[j] /= denominator;
      weights[j] *= config.routed_scaling_factor;
    }
  }
}

MoeExperts::MoeExperts(std::vector<Linear> gate_up, std::vector<Linear> down)
    : gate_up_(std::move(gate_up)), down_(std::move(down)) {
  PA_CHECK(!down_.empty() && gate_up_.size() == down_.size(),
           "moe experts: {} gate/up and {} down projections (expected the same number, >= 1)",
           gate_up_.size(), down_.size());
  hidden_ = gate_up_[0].in_features();
  intermediate_ = down_[0].in_features();
  for (size_t e = 0; e < down_.size(); ++e) {
    PA_CHECK(gate_up_[e].in_features() == hidden_ &&
                 gate_up_[e].out_features() == 2 * intermediate_ &&
                 down_[e].in_features() == intermediate_ && down_[e].out_features() == hidden_,
             "moe expert {}: gate_up [{}, {}] and down [{}, {}] (expected [{}, {}] and [{}, {}])",
             e, gate_up_[e].out_features(), gate_up_[e].in_features(), down_[e].out_features(),
             down_[e].in_features(), 2 * intermediate_, hidden_, hidden_, intermediate_);
  }
}

int64_t MoeExperts::owned_bytes() const {
  int64_t bytes = 0;
  for (size_t e = 0; e < down_.size(); ++e)
    bytes += gate_up_[e].owned_bytes() + down_[e].owned_bytes();
  return bytes;
}

void MoeExperts::forward(const TensorView& x, const MoeAssignment& assignment,
                         const TensorView& out) const {
  check_tensor("moe x", x, {assignment.tokens, hidden_}, DType::kF32, Device::cpu());
  check_tensor("moe out", out, {assignment.tokens, hidden_}, DType::kF32, Device::cpu());
  check_inner_contiguous("moe x", x);
  check_inner_contiguous("moe out", out);
  const int32_t tokens = assignment.tokens, k = assignment.top_k, experts = num_experts();
  const int64_t pairs = static_cast<int64_t>(tokens) * k;
  // Counting sort of the (token, slot) pairs by expert: position[pair] is the pair's row in the
  // expert-sorted buffers.
  std::vector<int64_t> start(static_cast<size_t>(experts) + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = assignment.experts[static_cast<size_t>(p)];
    PA_CHECK(e >= 0 && e < experts, "moe: expert id {} outside [0, {})", e, experts);
    ++start[static_cast<size_t>(e) + 1];
  }
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<int64_t> fill(start.begin(), start.end() - 1), position(static_cast<size_t>(pairs));
  std::vector<float> sorted_x(static_cast<size_t>(pairs * hidden_));
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = fill[static_cast<size_t>(assignment.experts[static_cast<size_t>(p)])]++;
    position[static_cast<size_t>(p)] = row;
    std::memcpy(sorted_x.data() + row * hidden_, x.data_as<const float>() + (p / k) * x.strides[0],
                static_cast<size_t>(hidden_) * sizeof(float));
  }
  std::vector<float> gate_up(static_cast<size_t>(pairs * 2 * intermediate_));
  std::vector<float> act(static_cast<size_t>(pairs * intermediate_));
  std::vector<float> sorted_y(static_cast<size_t>(pairs * hidden_));
  for (int32_t e = 0; e < experts; ++e) {
    const int64_t begin = start[static_cast<size_t>(e)],
                  n = start[static_cast<size_t>(e) + 1] - begin;
    if (n == 0) continue;
    const auto view = [](float* data, int64_t rows, int64_t cols) {
      return TensorView::contiguous(data, DType::kF32, {rows, cols});
    };
    gate_up_[static_cast<size_t>(e)].forward(
        view(sorted_x.data() + begin * hidden_, n, hidden_),
        view(gate_up.data() + begin * 2 * intermediate_, n, 2 * intermediate_));
    silu_mul(view(gate_up.data() + begin * 2 * intermediate_, n, 2 * intermediate_),
             view(act.data() + begin * intermediate_, n, intermediate_));
    down_[static_cast<size_t>(e)].forward(
        view(act.data() + begin * intermediate_, n, intermediate_),
        view(sorted_y.data() + begin * hidden_, n, hidden_));
  }
  auto* o = out.data_as<float>();
#pragma omp parallel for if (int64_t{tokens} * hidden_ >= (int64_t{1} << 16))
  for (int32_t t = 0; t < tokens; ++t) {
    float* row = o + t * out.strides[0];
    std::fill(row, row + hidden_, 0.0f);
    for (int32_t j = 0; j < k; ++j) {
      const size_t p = static_cast<size_t>(t) * k + j;
      const float w = assignment.weights[p];
      const float* y = sorted_y.data() + position[p] * hidden_;
      for (int64_t i = 0; i < hidden_; ++i) row[i] += w * y[i];
    }
  }
}

}  // namespace pagedattn::ops
