// Hot loops of the CPU backend (see cpu_simd.h). Vector extensions give 16-float chunks that the
// compiler maps to one zmm (AVX-512), two ymm (AVX2) or four xmm (baseline) registers; the
// target_clones attribute compiles each function for those targets and picks one at load time.
// The fused loops (scores, accumulation, the bf16 GEMV) are templates over their vector type: on
// AVX2 without AVX-512 they run as functions of their own over two 8-float halves (Halves, below).
// exp() is a branch-free polynomial so that the softmax vectorizes (no libm call in the loop).
#include "cpu/cpu_simd.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "pagedattn/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(PAGEDATTN_NO_TARGET_CLONES)
#define PA_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PA_SIMD_CLONES
#endif

// The 64-byte vector helpers below are always inlined into the clones; GCC's note that passing
// such vectors by value changes the ABI between targets does not apply to them.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace pagedattn::cpu::simd {
namespace {

using Chunk = float __attribute__((vector_size(kLanes * sizeof(float))));

[[gnu::always_inline]] inline Chunk load(const float* p) {
  Chunk c;
  std::memcpy(&c, p, sizeof(c));
  return c;
}
[[gnu::always_inline]] inline void store(float* p, const Chunk& c) {
  std::memcpy(p, &c, sizeof(c));
}
using Chunk8 = float __attribute__((vector_size(8 * sizeof(float))));
using Chunk4 = float __attribute__((vector_size(4 * sizeof(float))));
using Word8 = uint32_t __attribute__((vector_size(8 * sizeof(uint32_t))));

// Horizontal sum as a tree of halves: a few shuffles and adds instead of 15 dependent adds.
[[gnu::always_inline]] inline float sum8(const Chunk8& eight) {
  const Chunk4 four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) +
                      __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
  return (four[0] + four[2]) + (four[1] + four[3]);
}
[[gnu::always_inline]] inline float sum(const Chunk& c) {
  return sum8(__builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15));
}

// The loops below are templates over their vector type V of 16 floats: Chunk (one vector: a zmm
// register with AVX-512), or Halves, the same 16 lanes as two 8-float vectors (lanes 0-7, 8-15),
// for AVX2. With AVX2 a Chunk is two ymm registers, and GCC (12) keeps a Chunk accumulator in
// memory between iterations: the x86-64-v3 clones stored and reloaded every FMA's sum in 64-bit
// pieces (2930 stack accesses in gemv_bf16_pairs against 73 in the AVX-512 clone; 6216-15811 in
// the fused attention loops). Halves keep each sum in two registers. Both types do the same
// lane-wise FMAs and the same horizontal sum (vsum adds the halves first, as sum does), so the
// results are the same bits. With Halves the loops block for AVX2's 16 registers (kNarrow).
struct Halves {
  Chunk8 lo, hi;
};
[[gnu::always_inline]] inline Halves operator*(const Halves& a, const Halves& b) {
  return {a.lo * b.lo, a.hi * b.hi};
}
[[gnu::always_inline]] inline Halves operator*(float s, const Halves& b) {
  return {s * b.lo, s * b.hi};
}
[[gnu::always_inline]] inline Halves operator*(const Halves& a, float s) {
  return {a.lo * s, a.hi * s};
}
[[gnu::always_inline]] inline Halves& operator+=(Halves& a, const Halves& b) {
  a.lo += b.lo;
  a.hi += b.hi;
  return a;
}
template <class V>
inline constexpr bool kNarrow = std::is_same_v<V, Halves>;

template <class V>
[[gnu::always_inline]] inline V vload(const float* p) {
  if constexpr (kNarrow<V>) {
    Halves h;
    std::memcpy(&h.lo, p, sizeof(h.lo));
    std::memcpy(&h.hi, p + 8, sizeof(h.hi));
    return h;
  } else {
    return load(p);
  }
}
[[gnu::always_inline]] inline void vstore(float* p, const Chunk& c) { store(p, c); }
[[gnu::always_inline]] inline void vstore(float* p, const Halves& h) {
  std::memcpy(p, &h.lo, sizeof(h.lo));
  std::memcpy(p + 8, &h.hi, sizeof(h.hi));
}
[[gnu::always_inline]] inline float vsum(const Chunk& c) { return sum(c); }
[[gnu::always_inline]] inline float vsum(const Halves& h) { return sum8(h.lo + h.hi); }

// exp(x) for x <= 0 (scores minus their running max) and -inf: Cody-Waite reduction to
// r in [-ln2/2, ln2/2], degree-6 polynomial, 2^n through the exponent bits. Relative error ~2 ulp;
// x < -87 (including -inf) gives exactly 0, so masked keys carry no weight. F is float, or Chunk8
// for eight lanes at once, step for step (the softmax's loop vectorised by hand: GCC leaves a loop
// that sums into one float scalar without -ffast-math).
using Int8 = int32_t __attribute__((vector_size(8 * sizeof(int32_t))));
template <class F>
using IntLanes = std::conditional_t<std::is_same_v<F, float>, int32_t, Int8>;
template <class F>
[[gnu::always_inline]] inline F exp_nonpositive(const F& x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const F zero = {};
  const auto tiny = x < -87.0f;
  const F clamped = tiny ? zero - 87.0f : x;
  const F shifted = clamped * kLog2e + kRound;
  const F n = shifted - kRound;
  const IntLanes<F> exponent = std::bit_cast<IntLanes<F>>(shifted) - std::bit_cast<int32_t>(kRound);
  const F r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  F poly = zero + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const F scale = std::bit_cast<F>(IntLanes<F>((exponent + 127) << 23));
  return tiny ? zero : poly * scale;
}
[[gnu::always_inline]] inline Chunk8 load8(const float* p) {
  Chunk8 c;
  std::memcpy(&c, p, sizeof(c));
  return c;
}
[[gnu::always_inline]] inline float max8(const Chunk8& c) {
  const Chunk4 a = __builtin_shufflevector(c, c, 0, 1, 2, 3),
               b = __builtin_shufflevector(c, c, 4, 5, 6, 7);
  const Chunk4 four = a > b ? a : b;
  const float x = four[0] > four[2] ? four[0] : four[2];
  const float y = four[1] > four[3] ? four[1] : four[3];
  return x > y ? x : y;
}

// bf16 -> f32 of 16 elements: widen to 32 bits and shift into the high half (exact).
using Half16 = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
using Half8 = uint16_t __attribute__((vector_size(8 * sizeof(uint16_t))));
using Word16 = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
template <class V>
struct LoadBf16 {
  [[gnu::always_inline]] V operator()(const char* row, int d) const {
    const char* src = row + static_cast<int64_t>(d) * sizeof(uint16_t);
    if constexpr (kNarrow<V>) {
      Half8 lo, hi;
      std::memcpy(&lo, src, sizeof(lo));
      std::memcpy(&hi, src + sizeof(lo), sizeof(hi));
      Halves c;
      const Word8 wl = __builtin_convertvector(lo, Word8) << 16,
                  wh = __builtin_convertvector(hi, Word8) << 16;
      std::memcpy(&c.lo, &wl, sizeof(c.lo));
      std::memcpy(&c.hi, &wh, sizeof(c.hi));
      return c;
    } else {
      Half16 h;
      std::memcpy(&h, src, sizeof(h));
      const Word16 w = __builtin_convertvector(h, Word16) << 16;
      Chunk c;
      std::memcpy(&c, &w, sizeof(c));
      return c;
    }
  }
};
template <class V>
struct LoadF32 {
  [[gnu::always_inline]] V operator()(const char* row, int d) const {
    return vload<V>(reinterpret_cast<const float*>(row) + d);
  }
};

// 32 bf16 elements in the pair layout's order (pair_layout, cpu_simd.h) as two exact f32 vectors:
// the 64 bytes are 16 words of two bf16 each; the even elements are word << 16 and the odd ones
// word & 0xffff0000, with no lane shuffle (widening 16-bit lanes to 32 costs two cross-lane
// shuffles per 16 elements, which bound the loop before memory did).
template <class V>
[[gnu::always_inline]] inline void split_pairs(const char* src, V& even, V& odd) {
  if constexpr (kNarrow<V>) {
    Word8 lo, hi;
    std::memcpy(&lo, src, sizeof(lo));
    std::memcpy(&hi, src + sizeof(lo), sizeof(hi));
    const Word8 el = lo << 16, eh = hi << 16, ol = lo & 0xffff0000u, oh = hi & 0xffff0000u;
    std::memcpy(&even.lo, &el, sizeof(el));
    std::memcpy(&even.hi, &eh, sizeof(eh));
    std::memcpy(&odd.lo, &ol, sizeof(ol));
    std::memcpy(&odd.hi, &oh, sizeof(oh));
  } else {
    Word16 words;
    std::memcpy(&words, src, sizeof(words));
    const Word16 e = words << 16, o = words & 0xffff0000u;
    std::memcpy(&even, &e, sizeof(Chunk));
    std::memcpy(&odd, &o, sizeof(Chunk));
  }
}

// Scores of R rows for K keys starting at k[j0]: R x K accumulators live in registers, each
// converted K chunk feeds R FMAs.
template <class V, int R, int K, class Load>
[[gnu::always_inline]] inline void score_keys(const float* __restrict q, const char* const* k,
                                              int j0, int dim, float* __restrict s, int s_stride,
                                              Load ld) {
  V a[K][R] = {};
  for (int d = 0; d < dim; d += kLanes) {
    V kc[K];
    for (int t = 0; t < K; ++t) kc[t] = ld(k[j0 + t], d);
    for (int r = 0; r < R; ++r) {
      const V qc = vload<V>(q + static_cast<int64_t>(r) * dim + d);
      for (int t = 0; t < K; ++t) a[t][r] += qc * kc[t];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < K; ++t) s[static_cast<int64_t>(r) * s_stride + j0 + t] = vsum(a[t][r]);
  }
}

template <class V, int R, class Load>
[[gnu::always_inline]] inline void score_rows(const float* q, const char* const* k, int n, int dim,
                                              float* s, int s_stride, Load ld) {
  int j = 0;
  for (; j + 2 <= n; j += 2) score_keys<V, R, 2>(q, k, j, dim, s, s_stride, ld);
  if (j < n) score_keys<V, R, 1>(q, k, j, dim, s, s_stride, ld);
}

// acc columns [d0, d0 + C * kLanes) of R rows kept in registers while the block's V streams by.
template <class V, int R, int C, class Load>
[[gnu::always_inline]] inline void accumulate_columns(float* __restrict acc, const float* alpha,
                                                      const float* __restrict p, int p_stride,
                                                      const char* const* v, int n, int dim, int d0,
                                                      Load ld) {
  V c[R][C];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i) {
      c[r][i] = vload<V>(acc + static_cast<int64_t>(r) * dim + d0 + i * kLanes) * alpha[r];
    }
  }
  for (int j = 0; j < n; ++j) {
    V vc[C];
    for (int i = 0; i < C; ++i) vc[i] = ld(v[j], d0 + i * kLanes);
    for (int r = 0; r < R; ++r) {
      const float w = p[static_cast<int64_t>(r) * p_stride + j];
      for (int i = 0; i < C; ++i) c[r][i] += w * vc[i];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i)
      vstore(acc + static_cast<int64_t>(r) * dim + d0 + i * kLanes, c[r][i]);
  }
}

template <class V, int R, class Load>
[[gnu::always_inline]] inline void accumulate_rows(float* acc, const float* alpha, const float* p,
                                                   int p_stride, const char* const* v, int n,
                                                   int dim, Load ld) {
  // At most 16 accumulator chunks (4 with Halves: 8 of AVX2's 16 registers).
  constexpr int kC = kNarrow<V> ? 2 : R <= 4 ? 4 : 2;
  int d = 0;
  for (; d + kC * kLanes <= dim; d += kC * kLanes) {
    accumulate_columns<V, R, kC>(acc, alpha, p, p_stride, v, n, dim, d, ld);
  }
  for (; d < dim; d += kLanes) {
    accumulate_columns<V, R, 1>(acc, alpha, p, p_stride, v, n, dim, d, ld);
  }
}

// Calls f(std::integral_constant<int, R>{}) with R = rows for 1 <= rows <= 8 (8 for more): the
// loops below are instantiated per row count so that their accumulators live in registers. f is
// inlined into the caller, so it is compiled for the caller's target clone.
template <class F>
[[gnu::always_inline]] inline void with_rows(int rows, F&& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// Calls f(first_row, std::integral_constant<int, R>{}) over the rows: one pass of all of them (at
// most 8) with Chunk, passes of at most 2 rows with Halves (AVX2's 16 registers hold the partial
// sums of 2). The rows are independent, so the passes change no result.
template <class V, class F>
[[gnu::always_inline]] inline void with_row_passes(int rows, F&& f) {
  if constexpr (kNarrow<V>) {
    int r0 = 0;
    for (; r0 + 2 <= rows; r0 += 2) f(r0, std::integral_constant<int, 2>{});
    if (r0 < rows) f(r0, std::integral_constant<int, 1>{});
  } else {
    with_rows(
        rows, [&](auto r) __attribute__((always_inline)) { f(0, r); });
  }
}

template <class V, class Load>
[[gnu::always_inline]] inline void score_dispatch(const float* q, int rows, const char* const* k,
                                                  int n, int dim, float* s, int s_stride, Load ld) {
  with_row_passes<V>(
      rows, [&](int r0, auto r) __attribute__((always_inline)) {
        score_rows<V, decltype(r)::value>(q + static_cast<int64_t>(r0) * dim, k, n, dim,
                                          s + static_cast<int64_t>(r0) * s_stride, s_stride, ld);
      });
}

template <class V, class Load>
[[gnu::always_inline]] inline void accumulate_dispatch(float* acc, int rows, const float* alpha,
                                                       const float* p, int p_stride,
                                                       const char* const* v, int n, int dim,
                                                       Load ld) {
  with_row_passes<V>(
      rows, [&](int r0, auto r) __attribute__((always_inline)) {
        accumulate_rows<V, decltype(r)::value>(acc + static_cast<int64_t>(r0) * dim, alpha + r0,
                                               p + static_cast<int64_t>(r0) * p_stride, p_stride,
                                               v, n, dim, ld);
      });
}

// bf16 GEMV rows in the pair layout (see cpu_simd.h and split_pairs). R x K accumulators stay in
// registers (one per row and W row: at R = 8 separate even / odd ones would take all 32 vector
// registers and spill).
template <class V, int R, int K>
[[gnu::always_inline]] inline void pair_keys(const float* __restrict x, const char* const* w,
                                             int j0, int dim, float* __restrict y, int y_stride) {
  V acc[K][R] = {};
  for (int d = 0; d < dim; d += 2 * kLanes) {
    V we[K], wo[K];
    for (int t = 0; t < K; ++t) {
      split_pairs(w[j0 + t] + static_cast<int64_t>(d) * sizeof(uint16_t), we[t], wo[t]);
    }
    for (int r = 0; r < R; ++r) {
      const V xe = vload<V>(x + static_cast<int64_t>(r) * dim + d);
      const V xo = vload<V>(x + static_cast<int64_t>(r) * dim + d + kLanes);
      for (int t = 0; t < K; ++t) {
        acc[t][r] += xe * we[t];  // two FMAs (a single expression would round xe * we first)
        acc[t][r] += xo * wo[t];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < K; ++t) y[static_cast<int64_t>(r) * y_stride + j0 + t] = vsum(acc[t][r]);
  }
}

template <class V, int R>
[[gnu::always_inline]] inline void pair_rows(const float* x, const char* const* w, int n, int dim,
                                             float* y, int y_stride) {
  // Few rows: four W rows at a time (more independent FMA chains and memory streams). Halves:
  // R x K <= 2 accumulators beside W's even / odd chunks (AVX2's 16 registers).
  constexpr int kKeys = kNarrow<V> ? (R == 1 ? 2 : 1) : R <= 2 ? 4 : 2;
  int j = 0;
  for (; j + kKeys <= n; j += kKeys) pair_keys<V, R, kKeys>(x, w, j, dim, y, y_stride);
  for (; j < n; ++j) pair_keys<V, R, 1>(x, w, j, dim, y, y_stride);
}

}  // namespace

PA_SIMD_CLONES void convert_f32(const float* src, float* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

PA_SIMD_CLONES void convert_bf16(const uint16_t* src, float* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t{src[i]} << 16) * scale;
}

PA_SIMD_CLONES void convert_f16(const uint16_t* src, float* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) dst[i] = half_to_float(src[i]) * scale;
}

// e4m3 by arithmetic (the loop vectorises; a table lookup per element does not): a normal code
// (exponent field e >= 1, bias 7) is the f32 with exponent field e + 120 (bias 127) and the
// mantissa's 3 bits on top; a subnormal code is m * 2^-9; 0x7f / 0xff are NaN; the sign bit goes
// to the f32's. The same values as fp8e4m3_to_float. No branch or select: both forms are computed
// and one kept by masks (random signs and exponents made a branchy loop mispredict at every other
// element, and GCC leaves a loop with selects unvectorised).
PA_SIMD_CLONES void convert_fp8(const uint8_t* src, float* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) {
    const uint32_t b = src[i];
    const uint32_t e = (b >> 3) & 15u, m = b & 7u, sign = (b & 0x80u) << 24;
    const uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
    const uint32_t subnormal =
        sign | std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(m)) * 0x1p-9f);
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(e == 0);  // all ones or zero
    const uint32_t is_nan = 0u - static_cast<uint32_t>((b & 0x7fu) == 0x7fu);
    uint32_t bits = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    bits = (0x7fc00000u & is_nan) | (bits & ~is_nan);
    dst[i] = std::bit_cast<float>(bits) * scale;
  }
}

PA_SIMD_CLONES void store_bf16(const float* src, uint16_t* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i] * scale);
}

void store_f16(const float* src, uint16_t* dst, int n, float scale) {
  for (int i = 0; i < n; ++i) dst[i] = float_to_half(src[i] * scale);
}

PA_SIMD_CLONES void score_block(const float* __restrict q, int rows, const float* __restrict k,
                                int n, int dim, float* __restrict s, int s_stride) {
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + static_cast<int64_t>(r) * dim;
    float* sr = s + static_cast<int64_t>(r) * s_stride;
    int j = 0;
    // Four keys at a time: four independent FMA chains share each query chunk load.
    for (; j + 4 <= n; j += 4) {
      const float* k0 = k + static_cast<int64_t>(j) * dim;
      Chunk a0{}, a1{}, a2{}, a3{};
      for (int d = 0; d < dim; d += kLanes) {
        const Chunk qc = load(qr + d);
        a0 += qc * load(k0 + d);
        a1 += qc * load(k0 + dim + d);
        a2 += qc * load(k0 + 2 * dim + d);
        a3 += qc * load(k0 + 3 * dim + d);
      }
      sr[j] = sum(a0);
      sr[j + 1] = sum(a1);
      sr[j + 2] = sum(a2);
      sr[j + 3] = sum(a3);
    }
    for (; j < n; ++j) {
      const float* kj = k + static_cast<int64_t>(j) * dim;
      Chunk a{};
      for (int d = 0; d < dim; d += kLanes) a += load(qr + d) * load(kj + d);
      sr[j] = sum(a);
    }
  }
}

PA_SIMD_CLONES void softmax_block(float* __restrict s, int rows, int n, int s_stride,
                                  float* __restrict m, float* __restrict l,
                                  float* __restrict alpha) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rows; ++r) {
    float* sr = s + static_cast<int64_t>(r) * s_stride;
    // Eight lanes at a time (the max is exact in any order), the rest one by one.
    const Chunk8 zero = {};
    Chunk8 lanes_max = zero + kNegInf;
    int j8 = 0;
    for (; j8 + 8 <= n; j8 += 8) {
      const Chunk8 x = load8(sr + j8);
      lanes_max = x > lanes_max ? x : lanes_max;
    }
    float block_max = max8(lanes_max);
    for (int j = j8; j < n; ++j) block_max = sr[j] > block_max ? sr[j] : block_max;
    const float m_new = block_max > m[r] ? block_max : m[r];
    if (m_new == kNegInf) {  // nothing visible yet: p = 0, state unchanged
      for (int j = 0; j < n; ++j) sr[j] = 0.0f;
      alpha[r] = 1.0f;
      continue;
    }
    // p = exp(s - m_new) eight lanes at a time, summed in eight lanes, then the rest.
    Chunk8 lanes_total = zero;
    for (int j = 0; j < j8; j += 8) {
      const Chunk8 p = exp_nonpositive(load8(sr + j) - m_new);
      std::memcpy(sr + j, &p, sizeof(p));
      lanes_total += p;
    }
    float total = sum8(lanes_total);
    for (int j = j8; j < n; ++j) {
      const float p = exp_nonpositive(sr[j] - m_new);
      sr[j] = p;
      total += p;
    }
    alpha[r] = m[r] == kNegInf ? 0.0f : exp_nonpositive(m[r] - m_new);
    l[r] = l[r] * alpha[r] + total;
    m[r] = m_new;
  }
}

PA_SIMD_CLONES void accumulate_block(float* __restrict acc, int rows, const float* __restrict alpha,
                                     const float* __restrict p, int p_stride,
                                     const float* __restrict v, int v_stride, int n, int dim) {
  for (int r = 0; r < rows; ++r) {
    float* ar = acc + static_cast<int64_t>(r) * dim;
    const float* pr = p + static_cast<int64_t>(r) * p_stride;
    const float a = alpha[r];
    int d = 0;
    // Four chunks of the output row stay in registers while the block's values stream by.
    for (; d + 4 * kLanes <= dim; d += 4 * kLanes) {
      Chunk c0 = load(ar + d) * a, c1 = load(ar + d + kLanes) * a;
      Chunk c2 = load(ar + d + 2 * kLanes) * a, c3 = load(ar + d + 3 * kLanes) * a;
      for (int j = 0; j < n; ++j) {
        const float* vj = v + static_cast<int64_t>(j) * v_stride + d;
        const float w = pr[j];
        c0 += w * load(vj);
        c1 += w * load(vj + kLanes);
        c2 += w * load(vj + 2 * kLanes);
        c3 += w * load(vj + 3 * kLanes);
      }
      store(ar + d, c0);
      store(ar + d + kLanes, c1);
      store(ar + d + 2 * kLanes, c2);
      store(ar + d + 3 * kLanes, c3);
    }
    for (; d < dim; d += kLanes) {
      Chunk c = load(ar + d) * a;
      for (int j = 0; j < n; ++j) c += pr[j] * load(v + static_cast<int64_t>(j) * v_stride + d);
      store(ar + d, c);
    }
  }
}

namespace {

// acc (R rows in the pair layout) = acc * alpha + sum_j p[r][j] * v[j], V rows bf16: blocks
// [b0, b0 + C) of 32 columns (each an even and an odd chunk) held in registers while V streams by.
template <class V, int R, int C>
[[gnu::always_inline]] inline void pair_accumulate_blocks(float* __restrict acc, const float* alpha,
                                                          const float* __restrict p, int p_stride,
                                                          const char* const* v, int n, int dim,
                                                          int d0) {
  V e[R][C], o[R][C];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i) {
      const float* a = acc + static_cast<int64_t>(r) * dim + d0 + i * kPairBlock;
      e[r][i] = vload<V>(a) * alpha[r];
      o[r][i] = vload<V>(a + kLanes) * alpha[r];
    }
  }
  for (int j = 0; j < n; ++j) {
    V ve[C], vo[C];
    for (int i = 0; i < C; ++i) {
      split_pairs(v[j] + static_cast<int64_t>(d0 + i * kPairBlock) * sizeof(uint16_t), ve[i],
                  vo[i]);
    }
    for (int r = 0; r < R; ++r) {
      const float w = p[static_cast<int64_t>(r) * p_stride + j];
      for (int i = 0; i < C; ++i) {
        e[r][i] += w * ve[i];
        o[r][i] += w * vo[i];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i) {
      float* a = acc + static_cast<int64_t>(r) * dim + d0 + i * kPairBlock;
      vstore(a, e[r][i]);
      vstore(a + kLanes, o[r][i]);
    }
  }
}

template <class V, int R>
[[gnu::always_inline]] inline void pair_accumulate_rows(float* acc, const float* alpha,
                                                        const float* p, int p_stride,
                                                        const char* const* v, int n, int dim) {
  // 2 x R x C accumulator chunks: at most 16 (4 with Halves).
  constexpr int kC = kNarrow<V> ? 1 : R <= 2 ? 4 : R <= 4 ? 2 : 1;
  int d = 0;
  for (; d + kC * kPairBlock <= dim; d += kC * kPairBlock) {
    pair_accumulate_blocks<V, R, kC>(acc, alpha, p, p_stride, v, n, dim, d);
  }
  for (; d < dim; d += kPairBlock) {
    pair_accumulate_blocks<V, R, 1>(acc, alpha, p, p_stride, v, n, dim, d);
  }
}

// The four fused loops for one vector type: Chunk in the target clones, Halves for AVX2.
template <class V>
[[gnu::always_inline]] inline void score_rows_fused_v(const float* q, int rows,
                                                      const char* const* k, KvElem elem, int n,
                                                      int dim, float* s, int s_stride) {
  if (elem == KvElem::kBF16) {
    score_dispatch<V>(q, rows, k, n, dim, s, s_stride, LoadBf16<V>{});
  } else {
    score_dispatch<V>(q, rows, k, n, dim, s, s_stride, LoadF32<V>{});
  }
}

template <class V>
[[gnu::always_inline]] inline void accumulate_rows_fused_v(float* acc, int rows, const float* alpha,
                                                           const float* p, int p_stride,
                                                           const char* const* v, KvElem elem,
                                                           int n, int dim) {
  if (elem == KvElem::kBF16) {
    accumulate_dispatch<V>(acc, rows, alpha, p, p_stride, v, n, dim, LoadBf16<V>{});
  } else {
    accumulate_dispatch<V>(acc, rows, alpha, p, p_stride, v, n, dim, LoadF32<V>{});
  }
}

template <class V>
[[gnu::always_inline]] inline void accumulate_bf16_pairs_v(float* acc_pairs, int rows,
                                                           const float* alpha, const float* p,
                                                           int p_stride, const char* const* v,
                                                           int n, int dim) {
  with_row_passes<V>(
      rows, [&](int r0, auto r) __attribute__((always_inline)) {
        pair_accumulate_rows<V, decltype(r)::value>(
            acc_pairs + static_cast<int64_t>(r0) * dim, alpha + r0,
            p + static_cast<int64_t>(r0) * p_stride, p_stride, v, n, dim);
      });
}

template <class V>
[[gnu::always_inline]] inline void gemv_bf16_pairs_v(const float* x_pairs, int rows,
                                                     const char* const* w, int n, int dim,
                                                     float* y, int y_stride) {
  with_row_passes<V>(
      rows, [&](int r0, auto r) __attribute__((always_inline)) {
        pair_rows<V, decltype(r)::value>(x_pairs + static_cast<int64_t>(r0) * dim, w, n, dim,
                                         y + static_cast<int64_t>(r0) * y_stride, y_stride);
      });
}

PA_SIMD_CLONES void score_rows_fused_cloned(const float* q, int rows, const char* const* k,
                                            KvElem elem, int n, int dim, float* s, int s_stride) {
  score_rows_fused_v<Chunk>(q, rows, k, elem, n, dim, s, s_stride);
}
PA_SIMD_CLONES void accumulate_rows_fused_cloned(float* acc, int rows, const float* alpha,
                                                 const float* p, int p_stride,
                                                 const char* const* v, KvElem elem, int n,
                                                 int dim) {
  accumulate_rows_fused_v<Chunk>(acc, rows, alpha, p, p_stride, v, elem, n, dim);
}
PA_SIMD_CLONES void accumulate_bf16_pairs_cloned(float* acc_pairs, int rows, const float* alpha,
                                                 const float* p, int p_stride,
                                                 const char* const* v, int n, int dim) {
  accumulate_bf16_pairs_v<Chunk>(acc_pairs, rows, alpha, p, p_stride, v, n, dim);
}
PA_SIMD_CLONES void gemv_bf16_pairs_cloned(const float* x_pairs, int rows, const char* const* w,
                                           int n, int dim, float* y, int y_stride) {
  gemv_bf16_pairs_v<Chunk>(x_pairs, rows, w, n, dim, y, y_stride);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(PAGEDATTN_NO_TARGET_CLONES)
#define PA_AVX2_HALVES 1
#define PA_AVX2 __attribute__((target("arch=x86-64-v3")))
// AVX2 and FMA without AVX-512: where the Halves functions below run instead of the clones.
bool avx2_halves() {
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           !__builtin_cpu_supports("avx512f");
  }();
  return avx2;
}
PA_AVX2 void score_rows_fused_avx2(const float* q, int rows, const char* const* k, KvElem elem,
                                   int n, int dim, float* s, int s_stride) {
  score_rows_fused_v<Halves>(q, rows, k, elem, n, dim, s, s_stride);
}
PA_AVX2 void accumulate_rows_fused_avx2(float* acc, int rows, const float* alpha, const float* p,
                                        int p_stride, const char* const* v, KvElem elem, int n,
                                        int dim) {
  accumulate_rows_fused_v<Halves>(acc, rows, alpha, p, p_stride, v, elem, n, dim);
}
PA_AVX2 void accumulate_bf16_pairs_avx2(float* acc_pairs, int rows, const float* alpha,
                                        const float* p, int p_stride, const char* const* v, int n,
                                        int dim) {
  accumulate_bf16_pairs_v<Halves>(acc_pairs, rows, alpha, p, p_stride, v, n, dim);
}
PA_AVX2 void gemv_bf16_pairs_avx2(const float* x_pairs, int rows, const char* const* w, int n,
                                  int dim, float* y, int y_stride) {
  gemv_bf16_pairs_v<Halves>(x_pairs, rows, w, n, dim, y, y_stride);
}
#endif

}  // namespace

void score_rows_fused(const float* q, int rows, const char* const* k, KvElem elem, int n, int dim,
                      float* s, int s_stride) {
#if defined(PA_AVX2_HALVES)
  if (avx2_halves()) return score_rows_fused_avx2(q, rows, k, elem, n, dim, s, s_stride);
#endif
  score_rows_fused_cloned(q, rows, k, elem, n, dim, s, s_stride);
}

void accumulate_rows_fused(float* acc, int rows, const float* alpha, const float* p, int p_stride,
                           const char* const* v, KvElem elem, int n, int dim) {
#if defined(PA_AVX2_HALVES)
  if (avx2_halves()) {
    return accumulate_rows_fused_avx2(acc, rows, alpha, p, p_stride, v, elem, n, dim);
  }
#endif
  accumulate_rows_fused_cloned(acc, rows, alpha, p, p_stride, v, elem, n, dim);
}

void pair_layout(const float* x, int dim, float* out) {
  for (int d = 0; d < dim; d += 2 * kLanes) {
    for (int i = 0; i < kLanes; ++i) {
      out[d + i] = x[d + 2 * i];
      out[d + kLanes + i] = x[d + 2 * i + 1];
    }
  }
}

void unpair_layout(const float* pairs, int dim, float* out) {
  for (int d = 0; d < dim; d += 2 * kLanes) {
    for (int i = 0; i < kLanes; ++i) {
      out[d + 2 * i] = pairs[d + i];
      out[d + 2 * i + 1] = pairs[d + kLanes + i];
    }
  }
}

void accumulate_bf16_pairs(float* acc_pairs, int rows, const float* alpha, const float* p,
                           int p_stride, const char* const* v, int n, int dim) {
#if defined(PA_AVX2_HALVES)
  if (avx2_halves()) return accumulate_bf16_pairs_avx2(acc_pairs, rows, alpha, p, p_stride, v, n, dim);
#endif
  accumulate_bf16_pairs_cloned(acc_pairs, rows, alpha, p, p_stride, v, n, dim);
}

void gemv_bf16_pairs(const float* x_pairs, int rows, const char* const* w, int n, int dim, float* y,
                     int y_stride) {
#if defined(PA_AVX2_HALVES)
  if (avx2_halves()) return gemv_bf16_pairs_avx2(x_pairs, rows, w, n, dim, y, y_stride);
#endif
  gemv_bf16_pairs_cloned(x_pairs, rows, w, n, dim, y, y_stride);
}

const char* active_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return "avx512";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "baseline";
#else
  return "portable";
#endif
}

}  // namespace pagedattn::cpu::simd
