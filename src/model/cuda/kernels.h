// The CUDA model's small kernels besides GEMM and attention (kernels.cu), host-side launchers with
// plain C++ types: device pointers, dtypes, a cudaStream_t as void*. Every launcher enqueues on
// `stream` and checks the launch; none synchronises.
//
// Activations: the residual stream and most GEMM outputs are f32 (qkv and gate_up may be in the
// compute dtype: layers.cpp); what feeds a GEMM is in the compute dtype (bf16 / f16 / f32), what
// feeds the attention in the KV pool's dtype. Rows are tokens.
#pragma once

#include <cstdint>
#include <span>

#include "pagedattn/dtype.h"
#include "pagedattn/sampling.h"

namespace pagedattn::model::cuda {

// out [rows, dim] f32 = table [vocab, dim] (table_dtype, contiguous) rows at ids [rows] (valid:
// checked on the host before). An id -(r + 1) is a pending token (overlap scheduling): the token
// at pending[r], which the previous step's sampling kernel wrote.
void embedding(const void* table, DType table_dtype, int64_t dim, const int32_t* ids, int64_t rows,
               const ops::SampledToken* pending, float* out, void* stream);

// The pre-norm residual step over rows of `dim` (one block per row):
//   residual[r] += add[r] (when add != null), then out[r] = weight ⊙ residual[r] / rms, written in
//   out_dtype (and again in f32 to out_f32 when not null).
// With `row_index` (gather mode, for the rows whose logits are asked for): row r reads residual
// and add at row_index[r] and leaves residual unchanged.
struct AddNormArgs {
  float* residual = nullptr;      // [*, dim] f32
  const float* add = nullptr;     // [*, dim] f32 or null
  const float* weight = nullptr;  // [dim] f32
  void* out = nullptr;            // [rows, dim] out_dtype
  DType out_dtype = DType::kBF16;
  float* out_f32 = nullptr;  // [rows, dim] or null
  const int32_t* row_index = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};
void add_rms_norm(const AddNormArgs& args, void* stream);

// A per-head transform of x [rows, heads, width] (strided; in place), a warp per (row, head) or,
// on the vector path over many rows, per (row, 2 or 4 heads):
//   x += bias[head * width + d]            (when bias)
//   x = weight ⊙ x / rms over the head    (when norm_weight: Qwen3's q/k norm, MLA's latent and
//                                          q_a norms as one-head rows)
//   RoPE over the first 2 * rotary_half elements at positions[row] (when cos): NeoX pairs
//   (i, i + half) or interleaved pairs (2i, 2i + 1), cos / sin tables [positions, half] f32
// then x is written back (f32; unless write_x is false: a q whose f32 copy nobody reads, where
// the write-back was a third of the kernel's traffic) and, when out is set, also to out
// (out_dtype, its own strides). x is f32, or bf16 / f16 (a GEMM's output in the compute dtype:
// read only, so write_x must be false); the arithmetic is f32 either way. Heads of width 128 with
// RoPE over the whole head or none (Llama, Qwen), every operand aligned to 4 elements, take a
// vector kernel (kernels.cu): a lane's 4 consecutive elements in one load, the NeoX partner by a
// shuffle; the norm's sum is then added in another order (f32 rounding apart, the same values).
struct HeadTransformArgs {
  void* x = nullptr;
  DType x_dtype = DType::kF32;
  int64_t x_stride_row = 0, x_stride_head = 0;
  int32_t heads = 0, width = 0;
  int64_t rows = 0;
  const float* bias = nullptr;
  const float* norm_weight = nullptr;
  float eps = 1e-6f;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int32_t rotary_half = 0;
  bool interleaved = false;
  const int32_t* positions = nullptr;
  void* out = nullptr;
  DType out_dtype = DType::kBF16;
  int64_t out_stride_row = 0, out_stride_head = 0;
  bool write_x = true;  // false needs out
  // With out_slots, out is a paged KV pool (the store fused into the transform): row r goes to
  // slot s = out_slots[r], at element (s / out_alloc_page) * out_stride_page + (s % out_alloc_page)
  // * out_stride_row + head * out_stride_head; a slot < 0 or >= out_num_slots is not written
  // (store_kv's rule without a status view), the same bits as store_kv from the f32 rows.
  const int64_t* out_slots = nullptr;
  int64_t out_alloc_page = 1, out_num_slots = 0, out_stride_page = 0;
};
void transform_heads(const HeadTransformArgs& args, void* stream);
// Several transforms (head groups: a layer's q, k and v, each with its own x, strides, bias, norm,
// RoPE on or off and out) in one launch, each head transformed exactly as the one-group launch
// does. The groups must not overlap in x or out, share one x_dtype, and
// those with an out share one out_dtype. At most kMaxHeadGroups groups.
constexpr int kMaxHeadGroups = 4;
void transform_heads(std::span<const HeadTransformArgs> groups, void* stream);

// out [rows, width] (out_dtype, row stride out_stride) = silu(gate) ⊙ up with gate_up [rows,
// 2 width] contiguous, f32 or the compute dtype (a GEMM's output), computed in f32. pair_block 0:
// gate = gate_up[:, :width], up = gate_up[:, width:]; else (a divisor of width) the columns come
// in blocks of pair_block gates then their pair_block ups (the MoE experts' interleaved gate_up
// weights: moe.h, kMoePairBlock).
void silu_mul(const void* gate_up, DType gate_up_dtype, int64_t rows, int64_t width, void* out,
              DType out_dtype, int64_t out_stride, void* stream, int64_t pair_block = 0);

// dst [rows, cols] = src [rows, cols], converting between f32 / f16 / bf16 (row strides in
// elements; the inner stride is 1).
void convert_rows(const void* src, DType src_dtype, int64_t src_stride, void* dst, DType dst_dtype,
                  int64_t dst_stride, int64_t rows, int64_t cols, void* stream);

// y [rows, cols] f32 (row stride y_stride) += bias [cols] f32.
void add_bias(float* y, int64_t y_stride, const float* bias, int64_t rows, int64_t cols,
              void* stream);

// MoE: dst[p] = src[source_row[p]] for p < rows (rows of `row_bytes`, a multiple of 2).
void gather_rows(const void* src, const int32_t* source_row, void* dst, int64_t rows,
                 int64_t row_bytes, void* stream);

// MoE: out[t] = sum_j weight[t, j] * expert_out[position[t, j]] (j = 0 .. top_k - 1, in order)
// + shared[t] (when shared), all f32 [*, hidden] contiguous.
void moe_combine(const float* expert_out, const int32_t* position, const float* weight,
                 const float* shared, int64_t tokens, int32_t top_k, int64_t hidden, float* out,
                 void* stream);

// The timeline's probe (Model::set_timeline): stamps[index] = the device's global nanosecond
// clock once the kernel before it in the stream has completed. One thread; launched with
// programmatic dependent launch like every kernel here, but it lets its successor launch before it
// waits (see kernels.cu), so a probe between two kernels delays the second by about the probe's
// own completion, not by a second launch.
void timeline_stamp(uint64_t* stamps, int64_t index, void* stream);

}  // namespace pagedattn::model::cuda
