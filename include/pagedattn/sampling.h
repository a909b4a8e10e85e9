// Sampling one row of logits: the algorithm shared by the engine's CPU sampler, the CPU model and
// the CUDA model's sampling kernel (src/model/cuda/sampling.cu), and its CPU reference here.
//
// A row of f32 logits [vocab] and a RowSampling give one token:
//   greedy (temperature below 1e-5): the argmax, lowest id on ties, NaN never (unless every
//   logit is NaN: the last id). Else logits *= float(1 / temperature) (an f32 multiply), then
//   min-p keeps tokens whose scaled logit is at least max + float(log(min_p)) (and > -inf, so
//   never NaN), top-k keeps tokens whose scaled logit is at least the k-th largest of those
//   (ties at the boundary kept), top-p keeps, over what is left, the fewest most-probable tokens
//   in the order (scaled logit descending, id ascending) whose mass reaches top_p of the mass
//   left (at least one); then one uniform number u = sampling_uniform(seed, choice, position)
//   (splitmix64, 53 bits) picks, over the kept tokens with weights exp(scaled - max) in double,
//   the first whose cumulative weight exceeds u * total, in the draw order: (scaled logit
//   descending, id ascending) when top_p < 1 (the order top-p found them in), else id ascending.
// The token's logprob is that of the raw logits (log-softmax in double), whatever filtered.
//
// Both implementations compute the same f32 values (the temperature multiply, the min-p floor,
// the top-k threshold are exact comparisons of the same floats: identical kept sets before
// top-p); the masses are sums of doubles on the CPU and of 2^-40 fixed-point weights on the
// GPU, so the top-p cut and the draw can differ only when top_p * total or u * total falls
// within ~1e-9 (relative to the kept mass) of a cumulative boundary. RowDraw::margin says how far
// the CPU reference's were, for tests that compare the two.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagedattn::ops {

// How one logits row is turned into a token. `sample` false: the row is left to the caller
// (a model returns its logits); true: the model draws the token with these parameters.
// temperature >= 0 (below 1e-5: greedy), top_k <= 0: off, top_p in (0, 1], min_p in [0, 1].
struct RowSampling {
  bool sample = false;
  double temperature = 1.0;
  int32_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
  uint64_t seed = 0;
  uint64_t choice = 0;    // siblings of one seed draw different numbers
  uint64_t position = 0;  // output position of the token being drawn
};

// A token drawn by a model (token -1: the row was left to the caller) and its logprob under the
// raw logits.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
};

// The uniform number in [0, 1) that the draw for (seed, choice, position) uses.
double sampling_uniform(uint64_t seed, uint64_t choice, uint64_t position);

inline bool is_greedy(double temperature) { return temperature < 1e-5; }

// The per-row constants both implementations derive from a RowSampling, computed once on the
// host so that the CPU and the device use the same float values. Plain data, uploaded as is.
struct RowFilter {
  int32_t greedy = 0;                // 1: argmax (the rest unused)
  int32_t top_k = 0;                 // <= 0: off
  float inverse_temperature = 1.0f;  // float(1 / temperature)
  float log_min_p = 0.0f;            // float(log(min_p)) when has_min_p
  int32_t has_min_p = 0;             // min_p > 0
  int32_t sorted_draw = 0;           // top_p < 1: top-p runs and the draw goes in value order
  double top_p = 1.0;
  double uniform = 0.0;  // sampling_uniform(seed, choice, position)
};
RowFilter row_filter(const RowSampling& spec);

// The CPU reference: filter, draw and logprob of one row. Throws Error when no token can be drawn
// (every logit -inf or NaN) or for parameters outside the ranges above.
struct RowDraw {
  int32_t token = -1;
  float logprob = 0.0f;
  // The smallest distance, relative to the mass it is compared with, between top_p * total or
  // u * kept total and a cumulative boundary of the draw order (1 for greedy): below ~1e-9 a
  // device's different summation may cut or draw differently.
  double margin = 1.0;
};

// argmax, lowest id on ties, NaN only when every value is NaN (then the last id).
int32_t greedy_token(std::span<const float> logits);
// log(sum(exp(logits))) in double (the max subtracted first).
double log_sum_exp(std::span<const float> logits);

class RowSampler {
 public:
  // The token of `logits` under `spec` (spec.sample is ignored), with its logprob and margin.
  RowDraw sample(std::span<const float> logits, const RowSampling& spec);

  // The stages, for a caller that changes the logits first (the engine's bias and penalties):
  // temperature, min-p, top-k and top-p over `logits` in place (the dropped tokens set to -inf);
  // candidates() then holds the kept tokens in draw order. Not for greedy filters.
  void filter(std::span<float> logits, const RowFilter& filter);
  // The draw over candidates() of the last filter() on these `logits`.
  int32_t draw(std::span<const float> logits, double uniform);
  std::span<const int32_t> candidates() const { return candidates_; }
  // margin (RowDraw) of the last filter() and draw().
  double margin() const { return margin_; }

 private:
  std::vector<float> work_;
  std::vector<int32_t> candidates_;
  std::vector<double> weights_;  // exp(logit - max) per token id (valid for the candidates)
  std::vector<float> scratch_;
  float max_ = 0.0f;
  double filter_margin_ = 1.0;  // top-p's part of margin_
  double margin_ = 1.0;
};

}  // namespace pagedattn::ops
