// Row sampling on the device (sampling.cu): the algorithm of include/pagedattn/sampling.h, one
// cluster of CUDA blocks per logits row, so that a step copies back one token per row instead of
// the row.
// Host launcher with plain C++ types; enqueues on `stream`, checks the launch, never synchronises.
#pragma once

#include <cstdint>

#include "pagedattn/sampling.h"

namespace pagedattn::model::cuda {

// One row's parameters as uploaded: the host-derived constants (ops::row_filter, so the device
// uses the same floats as the CPU reference) and whether the row is sampled at all.
struct DeviceRowSampling {
  ops::RowFilter filter;
  int32_t sample = 0;  // 0: the row is left to the host (its block returns at once)
  int32_t pad = 0;
};

// The largest vocabulary the kernel's 2^-40 fixed-point masses hold without overflow.
inline constexpr int64_t kMaxSampledVocab = int64_t{1} << 23;

// For r < rows with rows_spec[r].sample: out[r] = the token drawn from logits row r [rows, vocab]
// f32 (device) and its logprob under the raw logits; token -1 when every logit of a non-greedy row
// is -inf or NaN. rows_spec [rows] and out [rows] are device arrays; rows without sample are not
// written. vocab in [1, kMaxSampledVocab].
// cluster_size: CTAs per row (a thread-block cluster splitting passes 1 and 2 of the row: 1, 2, 4
// or 8; 0: sample_cluster_size's choice for this device). The token does not depend on it; the
// logprob's double sum of the denominator is ordered by it (last bits).
void sample_rows(const float* logits, int64_t rows, int64_t vocab,
                 const DeviceRowSampling* rows_spec, ops::SampledToken* out, void* stream,
                 int cluster_size = 0);
// The cluster size sample_rows takes for `rows` rows on `sm_count` SMs: up to 8 CTAs a row while
// the rows' CTAs fit two per SM (a decode step at batch 1 reads its 152k logits with 8 SMs instead
// of one), and at least one 128-id tile a CTA; 1 for a vocabulary that is not whole float4s.
int sample_cluster_size(int64_t rows, int64_t vocab, int sm_count);

}  // namespace pagedattn::model::cuda
