// RoPE (ops.h): cos/sin tables computed once in float64 from the config's float64 inverse
// frequencies (YaRN / llama3 / linear scaling are already folded into them by the config API),
// and the in-place rotation of each head's first rotary_dim elements.
//
// NeoX pairs element i with i + d/2; interleaved pairs 2i with 2i + 1. Both rotate pair i by
// angle position · inv_freq[i]. (transformers' DeepSeek-V3 "interleave" path first de-interleaves
// q and k and then rotates halves, so its rotated vectors are a fixed permutation of ours; q·k and
// therefore attention are the same, and the cache only ever meets its own layout.)
#include <cmath>

#include "ops/rows.h"
#include "pagedattn/ops.h"

namespace pagedattn::ops {

RopeTable::RopeTable(std::span<const double> inv_freq, double attention_factor,
                     int64_t max_positions)
    : half_(static_cast<int32_t>(inv_freq.size())), max_positions_(max_positions) {
  PA_CHECK(!inv_freq.empty(), "rope: no inverse frequencies");
  PA_CHECK(max_positions > 0, "rope: max_positions {} (expected > 0)", max_positions);
  cos_.resize(static_cast<size_t>(max_positions * half_));
  sin_.resize(cos_.size());
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int32_t i = 0; i < half_; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(p * half_ + i)] =
          static_cast<float>(std::cos(angle) * attention_factor);
      sin_[static_cast<size_t>(p * half_ + i)] =
          static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
}

void apply_rope(const TensorView& x, std::span<const int32_t> positions, const RopeTable& table,
                RopeStyle style) {
  const detail::Rows rows = detail::rows_of("rope x", x, DType::kF32);
  const int64_t tokens = x.shape[0];
  PA_CHECK(static_cast<int64_t>(positions.size()) == tokens, "rope: {} positions for {} rows",
           positions.size(), tokens);
  const int32_t half = table.rotary_dim() / 2;
  PA_CHECK(table.rotary_dim() > 0 && table.rotary_dim() <= rows.dim,
           "rope: rotary_dim {} with head dimension {}", table.rotary_dim(), rows.dim);
  for (int64_t t = 0; t < tokens; ++t) {
    PA_CHECK(positions[static_cast<size_t>(t)] >= 0 &&
                 positions[static_cast<size_t>(t)] < table.max_positions(),
             "rope: position {} of row {} is outside the table [0, {})",
             positions[static_cast<size_t>(t)], t, table.max_positions());
  }
#pragma omp parallel for if (rows.count * half >= (int64_t{1} << 15))
  for (int64_t r = 0; r < rows.count; ++r) {
    float* v = rows.row<float>(r);
    const int64_t position = positions[static_cast<size_t>(r / rows.heads)];
    const float* c = table.cos_row(position);
    const float* s = table.sin_row(position);
    if (style == RopeStyle::kNeox) {
      for (int32_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    } else {
      for (int32_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace pagedattn::ops
