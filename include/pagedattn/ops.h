// The model's small operations besides GEMM and attention: RMSNorm (fused with the residual add),
// RoPE over precomputed tables, SiLU·mul, embedding gather, (log-)softmax over logits.
//
// Activations are f32 on the CPU; weights (norm weights, embedding tables) are read in the dtype
// the checkpoint stores (f32, f16, bf16). Every entry point takes TensorViews and dispatches on
// their device: the CPU implementation is here, a CUDA one slots in behind the same calls (until
// then a CUDA view gets an Error saying so). Views are [rows, dim] or [rows, heads, dim] with any
// outer strides and a unit inner stride; "rows" are tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn::ops {

// out = weight ⊙ x / sqrt(mean(x²) + eps) over the last dimension, for every row (and head, for
// 3-D views: Qwen3's per-head q_norm / k_norm). Computed in f32 as transformers does; out may be x.
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out);

// The pre-norm residual step: residual += x (in place), then out = rms_norm(residual). x may be
// absent (the first layer: residual already holds the embeddings).
void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight,
                  float eps, const TensorView& out);

// residual += x, elementwise over [rows, dim].
void add_inplace(const TensorView& residual, const TensorView& x);

// out [rows, I] = silu(gate_up[:, :I]) ⊙ gate_up[:, I:] with gate_up [rows, 2 I] (a stacked
// gate/up projection). out may not overlap gate_up's up half.
void silu_mul(const TensorView& gate_up, const TensorView& out);

// out [rows, dim] = table [vocab, dim] rows at ids (table in f32/f16/bf16). Throws Error naming
// the first id outside [0, vocab).
void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out);

// Row-wise, in place, over [rows, vocab] f32 logits.
void softmax_rows(const TensorView& x);
void log_softmax_rows(const TensorView& x);

// ---- RoPE ----

enum class RopeStyle : uint8_t {
  kNeox,         // rotate-half: pairs (i, i + d/2)  (Llama, Qwen)
  kInterleaved,  // GPT-J pairs (2i, 2i + 1)         (DeepSeek)
};

// cos / sin of position · inv_freq[i] (times attention_factor, YaRN's magnitude correction), for
// positions [0, max_positions): [max_positions, rotary_dim / 2] f32, computed in float64 from the
// config's float64 inverse frequencies.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(std::span<const double> inv_freq, double attention_factor, int64_t max_positions);
  int32_t rotary_dim() const { return half_ * 2; }
  int64_t max_positions() const { return max_positions_; }
  const float* cos_row(int64_t position) const { return cos_.data() + position * half_; }
  const float* sin_row(int64_t position) const { return sin_.data() + position * half_; }

 private:
  int32_t half_ = 0;
  int64_t max_positions_ = 0;
  std::vector<float> cos_, sin_;
};

// Rotates, in place, the first rotary_dim elements of each head of x [rows, heads, dim] (f32) at
// positions[row]. Throws Error naming a position outside the table.
void apply_rope(const TensorView& x, std::span<const int32_t> positions, const RopeTable& table,
                RopeStyle style);

}  // namespace pagedattn::ops
