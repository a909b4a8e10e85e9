// Hot loops of the CPU backend (see cpu_simd.h). Vector extensions give 16-float chunks that the
// compiler maps to one zmm (AVX-512), two ymm (AVX2) or four xmm (baseline) registers; the
// target_clones attribute compiles each function for those targets and picks one at load time.
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

// Horizontal sum as a tree of halves: a few shuffles and adds instead of 15 dependent adds.
[[gnu::always_inline]] inline float sum(const Chunk& c) {
  const Chunk8 eight = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7) +
                       __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
  const Chunk4 four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) +
                      __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// exp(x) for x <= 0 (scores minus their running max) and -inf: Cody-Waite reduction to
// r in [-ln2/2, ln2/2], degree-6 polynomial, 2^n through the exponent bits. Relative error ~2 ulp;
// x < -87 (including -inf) gives exactly 0, so masked keys carry no weight.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float clamped = x < -87.0f ? -87.0f : x;
  const float shifted = clamped * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float poly = 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((exponent + 127) << 23);
  return x < -87.0f ? 0.0f : poly * scale;
}

// bf16 -> f32 of 16 elements: widen to 32 bits and shift into the high half (exact).
using Half16 = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
using Word16 = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
struct LoadBf16 {
  [[gnu::always_inline]] Chunk operator()(const char* row, int d) const {
    Half16 h;
    std::memcpy(&h, row + static_cast<int64_t>(d) * sizeof(uint16_t), sizeof(h));
    const Word16 w = __builtin_convertvector(h, Word16) << 16;
    Chunk c;
    std::memcpy(&c, &w, sizeof(c));
    return c;
  }
};
struct LoadF32 {
  [[gnu::always_inline]] Chunk operator()(const char* row, int d) const {
    return load(reinterpret_cast<const float*>(row) + d);
  }
};

// Scores of R rows for K keys starting at k[j0]: R x K accumulators live in registers, each
// converted K chunk feeds R FMAs.
template <int R, int K, class Load>
[[gnu::always_inline]] inline void score_keys(const float* __restrict q, const char* const* k,
                                              int j0, int dim, float* __restrict s, int s_stride,
                                              Load ld) {
  Chunk a[K][R] = {};
  for (int d = 0; d < dim; d += kLanes) {
    Chunk kc[K];
    for (int t = 0; t < K; ++t) kc[t] = ld(k[j0 + t], d);
    for (int r = 0; r < R; ++r) {
      const Chunk qc = load(q + static_cast<int64_t>(r) * dim + d);
      for (int t = 0; t < K; ++t) a[t][r] += qc * kc[t];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < K; ++t) s[static_cast<int64_t>(r) * s_stride + j0 + t] = sum(a[t][r]);
  }
}

template <int R, class Load>
[[gnu::always_inline]] inline void score_rows(const float* q, const char* const* k, int n, int dim,
                                              float* s, int s_stride, Load ld) {
  int j = 0;
  for (; j + 2 <= n; j += 2) score_keys<R, 2>(q, k, j, dim, s, s_stride, ld);
  if (j < n) score_keys<R, 1>(q, k, j, dim, s, s_stride, ld);
}

// acc columns [d0, d0 + C * kLanes) of R rows kept in registers while the block's V streams by.
template <int R, int C, class Load>
[[gnu::always_inline]] inline void accumulate_columns(float* __restrict acc, const float* alpha,
                                                      const float* __restrict p, int p_stride,
                                                      const char* const* v, int n, int dim, int d0,
                                                      Load ld) {
  Chunk c[R][C];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i) {
      c[r][i] = load(acc + static_cast<int64_t>(r) * dim + d0 + i * kLanes) * alpha[r];
    }
  }
  for (int j = 0; j < n; ++j) {
    Chunk vc[C];
    for (int i = 0; i < C; ++i) vc[i] = ld(v[j], d0 + i * kLanes);
    for (int r = 0; r < R; ++r) {
      const float w = p[static_cast<int64_t>(r) * p_stride + j];
      for (int i = 0; i < C; ++i) c[r][i] += w * vc[i];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i)
      store(acc + static_cast<int64_t>(r) * dim + d0 + i * kLanes, c[r][i]);
  }
}

template <int R, class Load>
[[gnu::always_inline]] inline void accumulate_rows(float* acc, const float* alpha, const float* p,
                                                   int p_stride, const char* const* v, int n,
                                                   int dim, Load ld) {
  constexpr int kC = R <= 4 ? 4 : 2;  // at most 16 accumulator registers
  int d = 0;
  for (; d + kC * kLanes <= dim; d += kC * kLanes) {
    accumulate_columns<R, kC>(acc, alpha, p, p_stride, v, n, dim, d, ld);
  }
  for (; d < dim; d += kLanes) accumulate_columns<R, 1>(acc, alpha, p, p_stride, v, n, dim, d, ld);
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

template <class Load>
[[gnu::always_inline]] inline void score_dispatch(const float* q, int rows, const char* const* k,
                                                  int n, int dim, float* s, int s_stride, Load ld) {
  with_rows(
      rows, [&](auto r) __attribute__((always_inline)) {
        score_rows<decltype(r)::value>(q, k, n, dim, s, s_stride, ld);
      });
}

template <class Load>
[[gnu::always_inline]] inline void accumulate_dispatch(float* acc, int rows, const float* alpha,
                                                       const float* p, int p_stride,
                                                       const char* const* v, int n, int dim,
                                                       Load ld) {
  with_rows(
      rows, [&](auto r) __attribute__((always_inline)) {
        accumulate_rows<decltype(r)::value>(acc, alpha, p, p_stride, v, n, dim, ld);
      });
}

// bf16 GEMV rows in the pair layout (see cpu_simd.h): a 64-byte load of W is 16 words of two
// bf16 each; the even elements are word << 16 and the odd ones word & 0xffff0000, both exact f32,
// with no lane shuffle (widening 16-bit lanes to 32 costs two cross-lane shuffles per 16 elements,
// which bound the loop before memory did). R x K accumulators stay in registers (one per row and
// W row: at R = 8 separate even / odd ones would take all 32 vector registers and spill).
template <int R, int K>
[[gnu::always_inline]] inline void pair_keys(const float* __restrict x, const char* const* w,
                                             int j0, int dim, float* __restrict y, int y_stride) {
  Chunk acc[K][R] = {};
  for (int d = 0; d < dim; d += 2 * kLanes) {
    Chunk we[K], wo[K];
    for (int t = 0; t < K; ++t) {
      Word16 words;
      std::memcpy(&words, w[j0 + t] + static_cast<int64_t>(d) * sizeof(uint16_t), sizeof(words));
      const Word16 lo = words << 16, hi = words & 0xffff0000u;
      std::memcpy(&we[t], &lo, sizeof(Chunk));
      std::memcpy(&wo[t], &hi, sizeof(Chunk));
    }
    for (int r = 0; r < R; ++r) {
      const Chunk xe = load(x + static_cast<int64_t>(r) * dim + d);
      const Chunk xo = load(x + static_cast<int64_t>(r) * dim + d + kLanes);
      for (int t = 0; t < K; ++t) {
        acc[t][r] += xe * we[t];  // two FMAs (a single expression would round xe * we first)
        acc[t][r] += xo * wo[t];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < K; ++t) y[static_cast<int64_t>(r) * y_stride + j0 + t] = sum(acc[t][r]);
  }
}

template <int R>
[[gnu::always_inline]] inline void pair_rows(const float* x, const char* const* w, int n, int dim,
                                             float* y, int y_stride) {
  // Few rows: four W rows at a time (more independent FMA chains and memory streams).
  constexpr int kKeys = R <= 2 ? 4 : 2;
  int j = 0;
  for (; j + kKeys <= n; j += kKeys) pair_keys<R, kKeys>(x, w, j, dim, y, y_stride);
  for (; j < n; ++j) pair_keys<R, 1>(x, w, j, dim, y, y_stride);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(PAGEDATTN_NO_TARGET_CLONES)
#define PA_HAVE_AVX2_GEMV 1
// The GEMV for AVX2 (16 ymm registers). GCC keeps a 16-float Chunk, which is two ymm there, in
// memory between iterations when it is an accumulator (GCC 12, x86-64-v3: every FMA's sum went
// through the stack, 2930 stack accesses in gemv_bf16_pairs against 73 in the AVX-512 clone), so
// this path holds each chunk as two 8-float halves, lanes 0-7 and 8-15, with the same lanes, FMAs
// and horizontal sum (`sum` adds the halves first): the same bits as pair_keys. Its blocking fits
// 16 registers: R x K <= 2 accumulators (4 ymm), W's even / odd halves (2 K x 2 ymm) and x's.
struct Halves {
  Chunk8 lo, hi;
};
using Word8 = uint32_t __attribute__((vector_size(8 * sizeof(uint32_t))));

[[gnu::always_inline]] inline Chunk8 load8(const float* p) {
  Chunk8 c;
  std::memcpy(&c, p, sizeof(c));
  return c;
}

template <int R, int K>
[[gnu::always_inline]] inline void pair_keys_avx2(const float* __restrict x, const char* const* w,
                                                  int j0, int dim, float* __restrict y,
                                                  int y_stride) {
  Halves acc[K][R] = {};
  for (int d = 0; d < dim; d += 2 * kLanes) {
    Halves we[K], wo[K];
    for (int t = 0; t < K; ++t) {
      const char* row = w[j0 + t] + static_cast<int64_t>(d) * sizeof(uint16_t);
      Word8 lo, hi;
      std::memcpy(&lo, row, sizeof(lo));
      std::memcpy(&hi, row + sizeof(lo), sizeof(hi));
      we[t].lo = reinterpret_cast<Chunk8>(lo << 16);
      we[t].hi = reinterpret_cast<Chunk8>(hi << 16);
      wo[t].lo = reinterpret_cast<Chunk8>(lo & 0xffff0000u);
      wo[t].hi = reinterpret_cast<Chunk8>(hi & 0xffff0000u);
    }
    for (int r = 0; r < R; ++r) {
      const float* xr = x + static_cast<int64_t>(r) * dim + d;
      const Chunk8 xe_lo = load8(xr), xe_hi = load8(xr + 8);
      const Chunk8 xo_lo = load8(xr + kLanes), xo_hi = load8(xr + kLanes + 8);
      for (int t = 0; t < K; ++t) {
        acc[t][r].lo += xe_lo * we[t].lo;  // the order of pair_keys: even, then odd
        acc[t][r].hi += xe_hi * we[t].hi;
        acc[t][r].lo += xo_lo * wo[t].lo;
        acc[t][r].hi += xo_hi * wo[t].hi;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < K; ++t) {
      const Chunk8 eight = acc[t][r].lo + acc[t][r].hi;
      const Chunk4 four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) +
                          __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
      y[static_cast<int64_t>(r) * y_stride + j0 + t] = (four[0] + four[2]) + (four[1] + four[3]);
    }
  }
}

template <int R>
[[gnu::always_inline]] inline void pair_rows_avx2(const float* x, const char* const* w, int n,
                                                  int dim, float* y, int y_stride) {
  constexpr int kKeys = R == 1 ? 2 : 1;
  int j = 0;
  for (; j + kKeys <= n; j += kKeys) pair_keys_avx2<R, kKeys>(x, w, j, dim, y, y_stride);
  for (; j < n; ++j) pair_keys_avx2<R, 1>(x, w, j, dim, y, y_stride);
}

__attribute__((target("arch=x86-64-v3"))) void gemv_bf16_pairs_avx2(const float* x_pairs, int rows,
                                                                    const char* const* w, int n,
                                                                    int dim, float* y,
                                                                    int y_stride) {
  int r = 0;
  for (; r + 2 <= rows; r += 2) {
    pair_rows_avx2<2>(x_pairs + static_cast<int64_t>(r) * dim, w, n, dim,
                      y + static_cast<int64_t>(r) * y_stride, y_stride);
  }
  if (r < rows) {
    pair_rows_avx2<1>(x_pairs + static_cast<int64_t>(r) * dim, w, n, dim,
                      y + static_cast<int64_t>(r) * y_stride, y_stride);
  }
}

// AVX2 and FMA without AVX-512: the CPUs gemv_bf16_pairs_avx2 is for (the AVX-512 clone keeps the
// 16-float chunks).
bool use_avx2_gemv() {
  __builtin_cpu_init();
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           !__builtin_cpu_supports("avx512f");
  return avx2;
}
#endif

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
    float block_max = kNegInf;
    for (int j = 0; j < n; ++j) block_max = sr[j] > block_max ? sr[j] : block_max;
    const float m_new = block_max > m[r] ? block_max : m[r];
    if (m_new == kNegInf) {  // nothing visible yet: p = 0, state unchanged
      for (int j = 0; j < n; ++j) sr[j] = 0.0f;
      alpha[r] = 1.0f;
      continue;
    }
    float total = 0;
    for (int j = 0; j < n; ++j) {
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

PA_SIMD_CLONES void score_rows_fused(const float* q, int rows, const char* const* k, KvElem elem,
                                     int n, int dim, float* s, int s_stride) {
  if (elem == KvElem::kBF16) {
    score_dispatch(q, rows, k, n, dim, s, s_stride, LoadBf16{});
  } else {
    score_dispatch(q, rows, k, n, dim, s, s_stride, LoadF32{});
  }
}

PA_SIMD_CLONES void accumulate_rows_fused(float* acc, int rows, const float* alpha, const float* p,
                                          int p_stride, const char* const* v, KvElem elem, int n,
                                          int dim) {
  if (elem == KvElem::kBF16) {
    accumulate_dispatch(acc, rows, alpha, p, p_stride, v, n, dim, LoadBf16{});
  } else {
    accumulate_dispatch(acc, rows, alpha, p, p_stride, v, n, dim, LoadF32{});
  }
}

// acc (R rows in the pair layout) = acc * alpha + sum_j p[r][j] * v[j], V rows bf16: blocks
// [b0, b0 + C) of 32 columns (each an even and an odd chunk) held in registers while V streams by.
template <int R, int C>
[[gnu::always_inline]] inline void pair_accumulate_blocks(float* __restrict acc, const float* alpha,
                                                          const float* __restrict p, int p_stride,
                                                          const char* const* v, int n, int dim,
                                                          int d0) {
  Chunk e[R][C], o[R][C];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < C; ++i) {
      const float* a = acc + static_cast<int64_t>(r) * dim + d0 + i * kPairBlock;
      e[r][i] = load(a) * alpha[r];
      o[r][i] = load(a + kLanes) * alpha[r];
    }
  }
  for (int j = 0; j < n; ++j) {
    Chunk ve[C], vo[C];
    for (int i = 0; i < C; ++i) {
      Word16 words;
      std::memcpy(&words, v[j] + static_cast<int64_t>(d0 + i * kPairBlock) * sizeof(uint16_t),
                  sizeof(words));
      const Word16 lo = words << 16, hi = words & 0xffff0000u;
      std::memcpy(&ve[i], &lo, sizeof(Chunk));
      std::memcpy(&vo[i], &hi, sizeof(Chunk));
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
      store(a, e[r][i]);
      store(a + kLanes, o[r][i]);
    }
  }
}

template <int R>
[[gnu::always_inline]] inline void pair_accumulate_rows(float* acc, const float* alpha,
                                                        const float* p, int p_stride,
                                                        const char* const* v, int n, int dim) {
  constexpr int kC = R <= 2 ? 4 : R <= 4 ? 2 : 1;  // 2 x R x C accumulator chunks: at most 16
  int d = 0;
  for (; d + kC * kPairBlock <= dim; d += kC * kPairBlock) {
    pair_accumulate_blocks<R, kC>(acc, alpha, p, p_stride, v, n, dim, d);
  }
  for (; d < dim; d += kPairBlock)
    pair_accumulate_blocks<R, 1>(acc, alpha, p, p_stride, v, n, dim, d);
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

PA_SIMD_CLONES void accumulate_bf16_pairs(float* acc_pairs, int rows, const float* alpha,
                                          const float* p, int p_stride, const char* const* v, int n,
                                          int dim) {
  with_rows(
      rows, [&](auto r) __attribute__((always_inline)) {
        pair_accumulate_rows<decltype(r)::value>(acc_pairs, alpha, p, p_stride, v, n, dim);
      });
}

namespace {
PA_SIMD_CLONES void gemv_bf16_pairs_cloned(const float* x_pairs, int rows, const char* const* w,
                                           int n, int dim, float* y, int y_stride) {
  with_rows(
      rows, [&](auto r) __attribute__((always_inline)) {
        pair_rows<decltype(r)::value>(x_pairs, w, n, dim, y, y_stride);
      });
}
}  // namespace

void gemv_bf16_pairs(const float* x_pairs, int rows, const char* const* w, int n, int dim, float* y,
                     int y_stride) {
#if defined(PA_HAVE_AVX2_GEMV)
  if (use_avx2_gemv()) {
    gemv_bf16_pairs_avx2(x_pairs, rows, w, n, dim, y, y_stride);
    return;
  }
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
