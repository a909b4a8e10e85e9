// MoE routing (DeepSeek-V2 softmax greedy / group-limited greedy, V3 sigmoid noaux_tc) against a
// float64 re-statement of transformers' DeepseekV2Moe / DeepseekV3TopkRouter written here, and the
// grouped expert GEMMs against a naive per-token float64 loop; every element checked.
#include "pagedattn/moe.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/test_util.h"
#include "pagedattn/error.h"

namespace pagedattn::ops {
namespace {

using testing::compare;
using testing::to_doubles;

// Indices of the k largest, descending.
std::vector<int> top(const std::vector<double>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  idx.resize(k);
  return idx;
}

// Returns (expert, weight) pairs of one token, sorted by expert id.
std::vector<std::pair<int, double>> reference_route(std::vector<double> logits,
                                                    const MoeRouterConfig& c,
                                                    const std::vector<double>& bias) {
  const int e_count = c.num_experts, per = e_count / c.num_groups;
  std::vector<double> scores(e_count), choice(e_count);
  if (c.method == MoeRouting::kSigmoidNoAuxTc) {
    for (int e = 0; e < e_count; ++e) {
      scores[e] = 1 / (1 + std::exp(-logits[e]));
      choice[e] = scores[e] + bias[e];
    }
  } else {
    const double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int e = 0; e < e_count; ++e) sum += std::exp(logits[e] - max);
    for (int e = 0; e < e_count; ++e) choice[e] = scores[e] = std::exp(logits[e] - max) / sum;
  }
  if (c.method != MoeRouting::kSoftmaxGreedy) {
    std::vector<double> group(c.num_groups);
    for (int g = 0; g < c.num_groups; ++g) {
      std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group[g] =
          c.method == MoeRouting::kSoftmaxGroupLimited ? members[0] : members[0] + members[1];
    }
    const auto kept = top(group, c.topk_groups);
    for (int e = 0; e < e_count; ++e) {
      if (std::find(kept.begin(), kept.end(), e / per) == kept.end()) {
        choice[e] = c.method == MoeRouting::kSigmoidNoAuxTc ? -INFINITY : 0.0;
      }
    }
  }
  const auto chosen = top(choice, c.top_k);
  double sum = 0;
  for (int e : chosen) sum += scores[e];
  std::vector<std::pair<int, double>> out;
  for (int e : chosen) {
    double w = scores[e];
    if (c.norm_topk_prob) w /= sum;
    out.push_back({e, w * c.routed_scaling_factor});
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct RouteCase {
  MoeRouting method;
  int experts, top_k, groups, topk_groups;
  bool norm;
  float scale;
  const char* name;
};

class MoeRouteTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(MoeRouteTest, MatchesFloat64) {
  const RouteCase rc = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const MoeRouterConfig config{rc.method,      rc.experts, rc.top_k, rc.groups,
                               rc.topk_groups, rc.norm,    rc.scale};
  const int tokens = 37;
  HostTensor logits(DType::kF32, {tokens, rc.experts}), bias(DType::kF32, {rc.experts});
  testing::fill_uniform(logits.view(), rng, -3.0f, 3.0f);
  testing::fill_uniform(bias.view(), rng, -0.3f, 0.3f);
  const auto logit_d = to_doubles(logits.view());
  const auto bias_d = to_doubles(bias.view());
  MoeAssignment assignment;
  moe_route(logits.view(), config,
            rc.method == MoeRouting::kSigmoidNoAuxTc ? bias.view() : TensorView{}, assignment);
  ASSERT_EQ(assignment.tokens, tokens);
  ASSERT_EQ(assignment.top_k, rc.top_k);
  for (int t = 0; t < tokens; ++t) {
    const auto expected =
        reference_route(std::vector<double>(logit_d.begin() + t * rc.experts,
                                            logit_d.begin() + (t + 1) * rc.experts),
                        config, bias_d);
    std::vector<std::pair<int, double>> got;
    for (int j = 0; j < rc.top_k; ++j) {
      got.push_back({assignment.experts[t * rc.top_k + j], assignment.weights[t * rc.top_k + j]});
    }
    std::sort(got.begin(), got.end());
    for (int j = 0; j < rc.top_k; ++j) {
      EXPECT_EQ(got[j].first, expected[j].first) << "token " << t << " slot " << j;
      EXPECT_NEAR(got[j].second, expected[j].second,
                  1e-6 * std::max(1.0, std::abs(expected[j].second)))
          << "token " << t << " expert " << got[j].first;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, MoeRouteTest,
    ::testing::Values(
        RouteCase{MoeRouting::kSoftmaxGreedy, 16, 4, 1, 1, false, 1.0f, "v2_greedy"},
        RouteCase{MoeRouting::kSoftmaxGreedy, 16, 3, 1, 1, true, 2.5f, "v2_greedy_norm"},
        RouteCase{MoeRouting::kSoftmaxGroupLimited, 32, 6, 8, 3, false, 16.0f, "v2_group_limited"},
        RouteCase{MoeRouting::kSigmoidNoAuxTc, 32, 8, 4, 2, true, 2.5f, "v3_noaux_tc"},
        // Every expert of the one kept group: a kept choice below 0 (sigmoid + a negative bias)
        // must still beat the masked groups.
        RouteCase{MoeRouting::kSigmoidNoAuxTc, 16, 4, 4, 1, true, 1.0f, "v3_all_of_one_group"},
        RouteCase{MoeRouting::kSigmoidNoAuxTc, 16, 4, 1, 1, false, 1.5f,
                  "v3_one_group_unnormalized"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MoeRoute, BadConfigNamesTheField) {
  HostTensor logits(DType::kF32, {2, 12});
  MoeRouterConfig c{MoeRouting::kSoftmaxGroupLimited, 12, 2, 5, 2, false, 1.0f};
  MoeAssignment a;
  try {
    moe_route(logits.view(), c, {}, a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_group 5"), std::string::npos) << e.what();
  }
  c = {MoeRouting::kSigmoidNoAuxTc, 12, 2, 1, 1, true, 1.0f};
  EXPECT_THROW(moe_route(logits.view(), c, {}, a), Error);  // no correction bias
}

TEST(MoeExperts, GroupedGemmsMatchPerTokenFloat64) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const int experts = 6, hidden = 32, inter = 24, tokens = 11, k = 3;
  std::vector<HostTensor> gate_up_w, down_w;
  std::vector<Linear> gate_up, down;
  for (int e = 0; e < experts; ++e) {
    gate_up_w.emplace_back(DType::kBF16, std::initializer_list<int64_t>{2 * inter, hidden});
    down_w.emplace_back(DType::kBF16, std::initializer_list<int64_t>{hidden, inter});
    testing::fill_uniform(gate_up_w.back().view(), rng);
    testing::fill_uniform(down_w.back().view(), rng);
    // gate and up as two parts of one Linear, as a checkpoint stores them.
    TensorView gate = gate_up_w.back().view(), up = gate;
    gate.shape[0] = up.shape[0] = inter;
    up.data = gate_up_w.back().data<uint16_t>() + inter * hidden;
    const std::vector<LinearPart> parts = {{gate, {}}, {up, {}}};
    gate_up.emplace_back(fmt::format("expert{}.gate_up", e), parts);
    const std::vector<LinearPart> down_part = {{down_w.back().view(), {}}};
    down.emplace_back(fmt::format("expert{}.down", e), down_part);
  }
  const MoeExperts moe(std::move(gate_up), std::move(down));
  HostTensor x(DType::kF32, {tokens, hidden}), out(DType::kF32, {tokens, hidden});
  testing::fill_uniform(x.view(), rng);
  testing::poison(out.view());
  MoeAssignment a{tokens, k, {}, {}};
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> ids(experts);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int j = 0; j < k; ++j) {
      a.experts.push_back(t == 0 ? j : ids[j]);  // token 0 fixes experts 0..2; expert 5 may idle
      a.weights.push_back(weight(rng));
    }
  }
  moe.forward(x.view(), a, out.view());
  const auto xd = to_doubles(x.view());
  std::vector<double> expected(tokens * hidden, 0.0);
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const int e = a.experts[t * k + j];
      const auto gu = to_doubles(gate_up_w[e].view());
      const auto dw = to_doubles(down_w[e].view());
      std::vector<double> act(inter);
      for (int i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int h = 0; h < hidden; ++h) {
          g += gu[i * hidden + h] * xd[t * hidden + h];
          u += gu[(inter + i) * hidden + h] * xd[t * hidden + h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int h = 0; h < hidden; ++h) {
        double y = 0;
        for (int i = 0; i < inter; ++i) y += dw[h * inter + i] * act[i];
        expected[t * hidden + h] += a.weights[t * k + j] * y;
      }
    }
  }
  EXPECT_EQ(compare(to_doubles(out.view()), expected, {1e-4, 1e-5}, "moe out"), "");
}

}  // namespace
}  // namespace pagedattn::ops
