// A float64 reference of row sampling written from the definition in include/pagedattn/sampling.h
// (full stable sorts, plain prefix sums; no code shared with src/ops/sampling.cpp), and random
// rows for the tests that compare the CPU reference, the engine's sampler and the CUDA kernel:
// continuous logits, logits on a coarse grid (many ties), rows with -inf and NaN entries, and
// parameters over every filter combination with the edge values (top_k 1 and vocab, top_p tiny
// and 1, min_p 1).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/sampling.h"

namespace pagedattn::testing {

struct SamplingSpec {
  double temperature = 1.0;  // < 1e-5: greedy
  int32_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
  uint64_t seed = 0, choice = 0, position = 0;
};

struct SamplingReference {
  bool greedy = false;
  std::vector<int32_t> kept;    // the kept tokens in draw order (greedy: the argmax alone)
  std::vector<double> weights;  // exp(scaled - max) of each kept token
  double top_p_margin = 1.0;    // |top_p * total - nearest prefix boundary| / total
  double uniform = 0.0;         // the draw's number (splitmix64, written here)
  int32_t token = -1;           // the token for `uniform`
  double draw_margin = 1.0;     // |u * kept total - nearest boundary| / kept total
  double logprob = 0.0;         // of the token under the raw logits
  // The token for another number u, and its margin.
  int32_t draw(double u, double* margin = nullptr) const;
};

SamplingReference sampling_reference(const std::vector<float>& logits, const SamplingSpec& spec);

// splitmix64 three times over (seed, choice, position), 53 bits: the generator's definition.
double reference_uniform(uint64_t seed, uint64_t choice, uint64_t position);

// A random row of `vocab` logits: kind 0 normal (scale 1..6), 1 on a 0.5 grid (ties), 2 normal
// with some -inf and NaN entries, 3 one dominant logit.
std::vector<float> random_sampling_row(std::mt19937_64& rng, int64_t vocab, int kind);
// Random parameters over every filter combination and edge value (greedy one time in six).
SamplingSpec random_sampling_spec(std::mt19937_64& rng, int64_t vocab);

// The same parameters as the library's row spec (sample set), for the code under test.
inline ops::RowSampling to_row_sampling(const SamplingSpec& spec) {
  ops::RowSampling row;
  row.sample = true;
  row.temperature = spec.temperature;
  row.top_k = spec.top_k;
  row.top_p = spec.top_p;
  row.min_p = spec.min_p;
  row.seed = spec.seed;
  row.choice = spec.choice;
  row.position = spec.position;
  return row;
}

}  // namespace pagedattn::testing
