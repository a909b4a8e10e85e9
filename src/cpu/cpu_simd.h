// The CPU backend's hot loops: dtype conversion of KV/query rows to f32, the score block
// (Q tile x K block dot products), the online-softmax update, and the P x V accumulation.
//
// Each is compiled for several instruction sets with runtime dispatch (GCC target_clones on
// x86-64: x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA), baseline), so the default build runs on
// any x86-64 and builds unchanged elsewhere (one portable version). The loops are written on
// 16-float chunks with GCC vector extensions; head dims are multiples of 16 (supports() says so).
#pragma once

#include <cstdint>

namespace pagedattn::cpu::simd {

inline constexpr int kLanes = 16;  // floats per chunk; every dim passed here is a multiple

// dst[i] = float(src[i]) * scale, for the storage formats of the KV cache and queries.
void convert_f32(const float* src, float* dst, int n, float scale);
void convert_bf16(const uint16_t* src, float* dst, int n, float scale);
void convert_f16(const uint16_t* src, float* dst, int n, float scale);
void convert_fp8(const uint8_t* src, float* dst, int n, float scale);

// dst[i] = round(src[i] * scale) in bf16 / f16.
void store_bf16(const float* src, uint16_t* dst, int n, float scale);
void store_f16(const float* src, uint16_t* dst, int n, float scale);

// s[r * s_stride + j] = dot(q[r * dim ...], k[j * dim ...]) for r < rows, j < n.
void score_block(const float* q, int rows, const float* k, int n, int dim, float* s, int s_stride);

// Online softmax over one block of scores per row (masked scores are -inf): with
// m_new = max(m[r], max_j s[r][j]) it writes p = exp(s - m_new) into s, sets alpha[r] =
// exp(m[r] - m_new) (1 while a row has seen nothing), l[r] = l[r] * alpha[r] + sum_j p, m[r] =
// m_new.
void softmax_block(float* s, int rows, int n, int s_stride, float* m, float* l, float* alpha);

// acc[r] = acc[r] * alpha[r] + sum_j p[r][j] * v[j] (rows of `dim` floats; v rows v_stride apart).
void accumulate_block(float* acc, int rows, const float* alpha, const float* p, int p_stride,
                      const float* v, int v_stride, int n, int dim);

// Decode path for few query rows (a GQA group): K and V rows are read in their storage format
// through per-token pointers and converted inside the FMA loops, so each block is streamed once
// for all rows (no f32 copy of the block re-read per row). The query rows stay in L1 and the
// partial sums of all rows for two keys stay in registers. `rows` <= kMaxFusedRows.
inline constexpr int kMaxFusedRows = 8;
enum class KvElem { kF32, kBF16 };
// As score_block, K row j at k[j] (dim elements of `elem`).
void score_rows_fused(const float* q, int rows, const char* const* k, KvElem elem, int n, int dim,
                      float* s, int s_stride);
// As accumulate_block, V row j at v[j] (dim elements of `elem`).
void accumulate_rows_fused(float* acc, int rows, const float* alpha, const float* p, int p_stride,
                           const char* const* v, KvElem elem, int n, int dim);

// A GEMV over bf16 rows for the model's linear layers at decode (ops::Linear; Debian's OpenBLAS
// has no bf16 kernels): y[r * y_stride + j] = dot(x[r], w[j]) for r < rows <= kMaxFusedRows,
// j < n, with W row j at w[j] (dim bf16 elements, dim a multiple of kPairBlock) and x's rows given
// in the pair layout that pair_layout() writes: per block of 32 elements, the 16 even ones, then
// the 16 odd ones (dim floats per row, rows packed). The layout lets each 64-byte load of W become
// two f32 chunks with a shift and a mask (no lane shuffles). f32 accumulation.
inline constexpr int kPairBlock = 2 * kLanes;
void pair_layout(const float* x, int dim, float* out);
void unpair_layout(const float* pairs, int dim, float* out);  // the inverse
void gemv_bf16_pairs(const float* x_pairs, int rows, const char* const* w, int n, int dim, float* y,
                     int y_stride);
// Decode attention's two halves over bf16 K / V in the pair layout (dims multiples of kPairBlock):
// the scores are gemv_bf16_pairs of the query rows (in the pair layout) against the K rows; the
// accumulation is accumulate_rows_fused with acc's rows kept in the pair layout (unpair_layout
// gives the natural order at the end).
void accumulate_bf16_pairs(float* acc_pairs, int rows, const float* alpha, const float* p,
                           int p_stride, const char* const* v, int n, int dim);

// The instruction set the dispatcher picked// The instruction set the dispatcher picked on this
// machine ("avx512", "avx2", "baseline").
const char* active_isa();

}  // namespace pagedattn::cpu::simd
