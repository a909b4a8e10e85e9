// Batch prefill / extend on Hopper (sm_90a): the same algorithm, work split and K/V gather as
// kernel.cuh, with the two products on wgmma. One warpgroup (4 warps) per CTA owns 64 packed query
// rows; S = Q K^T takes Q and K from shared memory (both K-major), O += P V takes P from registers
// (the S accumulators turned into A fragments in place) and V from shared memory (N-major, the
// transposed-B form), so no operand is re-read per warp as with mma.sync and the accumulators stay
// small (64 x 64 S and 64 x Dvo O per warpgroup): three CTAs fit on an SM and overlap each other's
// softmax with their products.
//
// Shared tiles use wgmma's 128-byte swizzle: a tile of R rows x D columns is D / 64 blocks of
// R x 64 (128 bytes a row), 16-byte chunk c of row r at r * 128 + ((c ^ r % 8) * 16) in its
// block, blocks 1024-byte aligned. Descriptors: K-major (Q, K) step 32 bytes per k16 inside a
// block, 8-row groups 1024 bytes apart; N-major V has 64-column blocks R * 128 bytes apart
// (leading offset) and 8-key groups 1024 bytes apart (stride offset).
//
// An fp8 e4m3 cache (KV = __nv_fp8_e4m3) is gathered and widened in place as in kernel.cuh
// (fp8_tile.cuh), between the cp.async wait and the proxy fence that hands each tile to wgmma.
#pragma once

#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/wgmma.cuh"

namespace pagedattn::cuda::prefill::sm90 {

template <int kHeadDimQk, int kHeadDimVo, int kBlockKeys = 64>
struct Config {
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kBlockKeys;
  static constexpr int kQBlockBytes = kBlockM * 128;   // one 64-column block of the Q tile
  static constexpr int kKvBlockBytes = kBlockN * 128;  // ... of a K or V tile
  static constexpr int kQBytes = kHeadDimQk / 64 * kQBlockBytes;
  static constexpr int kKBytes = kHeadDimQk / 64 * kKvBlockBytes;
  static constexpr int kVBytes = kHeadDimVo / 64 * kKvBlockBytes;
  static constexpr int kOffsetBytes = 2 * 2 * kBlockN * 8;
  // + 1024: the dynamic shared memory is aligned up to 1024 bytes inside the kernel.
  static constexpr int kSmemBytes = 1024 + kQBytes + kKBytes + kVBytes + kOffsetBytes;
  static constexpr int kMinBlocks = kHeadDimVo <= 128 && kBlockN <= 64 ? 3 : 2;
  static_assert(kHeadDimQk % 64 == 0 && kHeadDimVo % 64 == 0);
  static_assert(kBlockN % 64 == 0 && kBlockN <= kThreads);
};

// The dynamic shared memory aligned up to 1024 bytes (the 128-byte swizzle pattern repeats every
// 1024, and descriptors assume it starts there): its shared-window address and a generic pointer
// (callers ask for 1024 bytes more than they use).
__device__ __forceinline__ uint32_t aligned_smem(unsigned char* raw_smem, unsigned char*& smem) {
  const uint32_t raw = smem_u32(raw_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  smem = raw_smem + (base - raw);
  return base;
}

// Gathers kRows rows of kChunks 16-byte chunks (byte offsets from key_offsets) into a swizzled
// tile. An fp8 cache (1-byte KV): copy c of a row lands in tile chunk 2c (load_kv_tile's rule).
template <int kChunks, int kRows, class KV>
__device__ __forceinline__ void load_tile(uint32_t tile, const KV* base, const int64_t* offsets) {
  constexpr int kThreads = 128;
  constexpr int kStep = 2 / static_cast<int>(sizeof(KV));  // tile chunks per copy: 1, fp8 2
  constexpr int kCopies = kChunks / kStep;                 // copies per row
  const char* bytes = reinterpret_cast<const char*>(base);
  if constexpr (kThreads % kCopies == 0 && (kThreads / kCopies) % 8 == 0) {
    constexpr int kRowsPerPass = kThreads / kCopies;
    const int row = static_cast<int>(threadIdx.x) / kCopies;
    const int copy = static_cast<int>(threadIdx.x) % kCopies;
    const uint32_t dst = tile + tile_offset<kRows>(row, copy * kStep);
    const char* src = bytes + copy * 16;
#pragma unroll
    for (int it = 0; it < kRows / kRowsPerPass; ++it) {
      cp_async_16(dst + it * kRowsPerPass * 128, src + offsets[it * kRowsPerPass + row]);
    }
  } else {
    static_assert(kRows * kCopies % kThreads == 0);
#pragma unroll
    for (int it = 0; it < kRows * kCopies / kThreads; ++it) {
      const int i = it * kThreads + static_cast<int>(threadIdx.x);
      const int row = i / kCopies, copy = i % kCopies;
      cp_async_16(tile + tile_offset<kRows>(row, copy * kStep), bytes + offsets[row] + copy * 16);
    }
  }
}

template <class T>
struct Ops;
template <>
struct Ops<__nv_bfloat16> {
  __device__ __forceinline__ static void qk(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    ss_m64n64k16_bf16(d, a, b, acc);
  }
  __device__ __forceinline__ static void qk(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    ss_m64n128k16_bf16(d, a, b, acc);
  }
  __device__ __forceinline__ static void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n64k16_bf16(d, a, b);
  }
  __device__ __forceinline__ static void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n128k16_bf16(d, a, b);
  }
  __device__ __forceinline__ static void pv(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n256k16_bf16(d, a, b);
  }
};
template <>
struct Ops<__half> {
  __device__ __forceinline__ static void qk(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    ss_m64n64k16_f16(d, a, b, acc);
  }
  __device__ __forceinline__ static void qk(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    ss_m64n128k16_f16(d, a, b, acc);
  }
  __device__ __forceinline__ static void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n64k16_f16(d, a, b);
  }
  __device__ __forceinline__ static void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n128k16_f16(d, a, b);
  }
  __device__ __forceinline__ static void pv(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    rs_m64n256k16_f16(d, a, b);
  }
};

// ---- the steps both Hopper prefill kernels share (this file's and kernel_sm90_ws.cuh's) ----

// Q's rows [row0, row0 + kRows) of the tile into a swizzled tile at s_q (rows past num_rows
// zero-filled), by threads 0..127 (cp.async, uncommitted). Row r is token r / g of the request,
// query head kv_head * g + r % g (kernel.cuh's packing).
template <class T, int kRows, int kHeadDim>
__device__ __forceinline__ void load_q_rows(const PrefillParams& p, uint32_t s_q, int row0,
                                            int num_rows, int q_begin, int kv_head) {
  constexpr int kChunks = kHeadDim / 8;
  const int g = p.group_size;
  const T* q = static_cast<const T*>(p.q);
#pragma unroll 4
  for (int it = 0; it < kRows * kChunks / 128; ++it) {
    const int i = it * 128 + static_cast<int>(threadIdx.x);
    const int r = i / kChunks, chunk = i % kChunks;
    const int row = row0 + r;
    const bool valid = row < num_rows;
    const int token = valid ? row / g : 0;
    const int head = kv_head * g + (valid ? row - token * g : 0);
    const T* src = q + (q_begin + token) * p.q_stride_token + head * p.q_stride_head + chunk * 8;
    cp_async_16(s_q + tile_offset<kRows>(r, chunk), src, valid ? 16 : 0);
  }
}

// The online softmax (base 2) of a warpgroup's 64 x kBlockN S tile of keys n0 .. (the wgmma
// accumulator layout: register i holds row row_pos[(i / 2) % 2], key n0 + 8 (i / 4) +
// 2 (lane % 4) + i % 2): soft cap, then the mask where the tile needs one (keys at or past hi /
// key_end, the causal diagonal past first_pos, the window before last_pos - window_left), then
// P = 2^(S scale - max) in place, each row's max and sum moved on and alpha, O's factor. Returns
// whether O must be scaled (a max of the warp moved).
template <int kBlockN>
__device__ __forceinline__ bool softmax_tile(const PrefillParams& p, float (&s)[kBlockN / 2],
                                             int n0, int hi, int key_end, int first_pos,
                                             int last_pos, const int (&row_pos)[2],
                                             float (&row_max)[2], float (&row_sum)[2],
                                             float (&alpha)[2]) {
  constexpr int kSRegs = kBlockN / 2;
  constexpr float kLog2e = 1.4426950408889634f;
  const int lane = static_cast<int>(threadIdx.x & 31);
  float mul = p.sm_scale * kLog2e;
  if (p.logits_soft_cap > 0.0f) {
    const float cap_inv = p.sm_scale / p.logits_soft_cap;
    const float cap_log2 = p.logits_soft_cap * kLog2e;
    mul = 1.0f;
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] = cap_log2 * tanhf(s[i] * cap_inv);
  }
  const bool needs_mask = n0 + kBlockN > hi || (p.causal && n0 + kBlockN - 1 > first_pos) ||
                          (p.window_left >= 0 && n0 < last_pos - p.window_left);
  if (needs_mask) {
    // Element i holds key n0 + 2 (lane % 4) + c, c = 8 (i / 4) + i % 2, of row h = (i / 2) % 2:
    // visible when c lies in [lo[h], hi[h]], the row's first and last visible keys less the
    // thread's first key (two compares an element, against constants).
    const int key0 = n0 + 2 * (lane & 3);
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      hi[h] = (p.causal ? min(key_end - 1, row_pos[h]) : key_end - 1) - key0;
      lo[h] = p.window_left >= 0 ? row_pos[h] - p.window_left - key0 : 0;
    }
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) {
      const int c = (i >> 2) * 8 + (i & 1);
      const int h = (i >> 1) & 1;
      if (c > hi[h] || c < lo[h]) s[i] = -INFINITY;
    }
  }
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = s[2 * h];
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j)
      m = fmaxf(m, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    m = fmaxf(row_max[h], m * mul);
    const float m_use = m == -INFINITY ? 0.0f : m;
    alpha[h] = fast_exp2(row_max[h] - m_use);
    moved |= m != row_max[h];
    row_max[h] = m;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j) {
      s[4 * j + 2 * h] = fast_exp2(fmaf(s[4 * j + 2 * h], mul, -m_use));
      s[4 * j + 2 * h + 1] = fast_exp2(fmaf(s[4 * j + 2 * h + 1], mul, -m_use));
      sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    }
    row_sum[h] = row_sum[h] * alpha[h] + sum;
  }
  return __any_sync(0xffffffffu, moved);
}

// P (f32, the S layout) as the A fragments of kBlockN / 16 k16 steps of O += P V.
template <class T, int kBlockN>
__device__ __forceinline__ void pack_p(const float (&s)[kBlockN / 2],
                                       uint32_t (&pa)[kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = Mma<T>::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  }
}

// The sum of a row's values over the quad of lanes that holds it (the accumulators' layout).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Packed row `row` of a query tile of KV head kv_head (group query heads a token): its token,
// counted from the request's first, and its query head.
struct RowDest {
  int token, head;
};
__device__ __forceinline__ RowDest row_dest(int row, int group, int kv_head) {
  const int token = row / group;
  return {token, kv_head * group + (row - token * group)};
}

// A row's lse (natural log) into p.lse, from its running max (log2 units) and sum l: -inf when l
// is 0 (no visible key).
__device__ __forceinline__ void write_lse(const PrefillParams& p, int q_begin, RowDest d,
                                          float row_max, float l) {
  constexpr float kLog2e = 1.4426950408889634f;
  p.lse[(q_begin + d.token) * p.lse_stride_token + d.head * p.lse_stride_head] =
      l > 0.0f ? (row_max + __log2f(l)) / kLog2e : -INFINITY;
}

// A warpgroup's 64 rows from wg_row0 on: O / l (times out_scale: an fp8 cache's V scale) to out
// and lse, or the f32 partials of a split chunk (params.h); a CTA that met a page id outside the
// pool (bad_page) writes 0 / -inf, or a poisoned partial lse (kernel.cuh).
template <class T, int kHeadDimVo>
__device__ __forceinline__ void write_rows(const PrefillParams& p, float (&o)[kHeadDimVo / 2],
                                           float (&row_sum)[2], const float (&row_max)[2],
                                           int wg_row0, int num_rows, int q_begin, int kv_head,
                                           float out_scale, bool bad_page) {
  constexpr int kORegs = kHeadDimVo / 2;
  const int lane = static_cast<int>(threadIdx.x & 31),
            warp = static_cast<int>(threadIdx.x >> 5) & 3;
  if (bad_page) {
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    row_sum[0] = row_sum[1] = 0.0f;
  }
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(row_sum[h]);
    const int row = wg_row0 + warp * 16 + (lane >> 2) + h * 8;
    if (row >= num_rows) continue;
    const auto [token, head] = row_dest(row, p.group_size, kv_head);
    const float inv = l > 0.0f ? out_scale / l : 0.0f;
    if (p.num_kv_chunks > 1) {
      const int64_t index = partial_index(p, q_begin + token, head);
      float* part = p.partial_out + index * kHeadDimVo + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        *reinterpret_cast<float2*>(part + j * 8) =
            make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      }
      if ((lane & 3) == 0) {
        p.partial_lse[index] = bad_page   ? poisoned_partial()
                               : l > 0.0f ? row_max[h] + __log2f(l)
                                          : -INFINITY;
      }
      continue;
    }
    T* dst =
        out + (q_begin + token) * p.out_stride_token + head * p.out_stride_head + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      *reinterpret_cast<uint32_t*>(dst + j * 8) =
          Mma<T>::pack(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
    if (p.lse != nullptr && (lane & 3) == 0) write_lse(p, q_begin, {token, head}, row_max[h], l);
  }
}

// T: q, out and the MMA inputs (bf16 / f16); KV: the cache, T or __nv_fp8_e4m3 (widened to T).
template <class T, int kHeadDimQk, int kHeadDimVo, int kBlockKeys = 64, class KV = T>
__global__ void __launch_bounds__(128, Config<kHeadDimQk, kHeadDimVo, kBlockKeys>::kMinBlocks)
    prefill_kernel_sm90(const __grid_constant__ PrefillParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kFp8 = std::is_same_v<KV, __nv_fp8_e4m3>;
  static_assert(kFp8 || std::is_same_v<KV, T>, "KV: the q dtype or fp8 e4m3");
  using C = Config<kHeadDimQk, kHeadDimVo, kBlockKeys>;
  constexpr int kBlockM = C::kBlockM;
  constexpr int kBlockN = C::kBlockN;
  constexpr int kSRegs = kBlockN / 2;     // 64 x kBlockN f32 over 128 threads
  constexpr int kORegs = kHeadDimVo / 2;  // 64 x Dvo

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t s_q = aligned_smem(smem_raw, smem);
  const uint32_t s_k = s_q + C::kQBytes;
  const uint32_t s_v = s_k + C::kKBytes;
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + C::kQBytes + C::kKBytes + C::kVBytes);

  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  int request, tile;
  if (!find_tile<kBlockM, 128>(p, static_cast<int>(blockIdx.x / p.num_kv_heads), request, tile)) {
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = p.group_size;
  const TileWork w = tile_work<kBlockM, kBlockN>(p, request, tile, kv_head);  // kernel.cuh
  const int q_begin = w.q_begin, num_rows = w.num_rows, row0 = w.row0;
  const int kv_len = w.kv_len, pos_shift = w.pos_shift;
  const int32_t* pages = w.pages;

  int row_pos[2];  // this thread's rows: 16 * warp + lane / 4 (+ 8)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + warp * 16 + (lane >> 2) + h * 8;
    row_pos[h] = pos_shift + min(row, num_rows - 1) / g;
  }
  const int first_pos = w.first_pos, last_pos = w.last_pos;
  const int cta_lo = w.lo, cta_hi = w.hi, key_end = w.end, num_blocks = w.num_blocks;

  const KV* k_base = static_cast<const KV*>(p.k) + kv_head * p.k_stride_head;
  const KV* v_base = static_cast<const KV*>(p.v) + kv_head * p.v_stride_head;

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  if (num_blocks > 0) {
    load_q_rows<T, kBlockM, kHeadDimQk>(p, s_q, row0, num_rows, q_begin, kv_head);
    if (threadIdx.x < kBlockN) key_offsets<KV>(p, pages, kv_len, cta_lo, s_off, s_off + kBlockN);
    __syncthreads();
    load_tile<kHeadDimQk / 8, kBlockN>(s_k, k_base, s_off);
    cp_async_commit();
  }

  for (int block = 0; block < num_blocks; ++block) {
    const int n0 = cta_lo + block * kBlockN;
    const int64_t* offsets = s_off + (block & 1) * 2 * kBlockN;
    cp_async_wait_all();   // K_j (and Q)
    if constexpr (kFp8) {  // this thread's copies of K_j, widened in place (fp8_tile.cuh)
      widen_e4m3_tile<T, kHeadDimQk / 8, kBlockN, 128>(
          s_k, [](int row, int chunk) { return tile_offset<kBlockN>(row, chunk); });
    }
    fence_proxy_async();  // ... visible to the tensor cores' (async proxy) reads
    __syncthreads();      // ... of every thread's copies; every thread is done with V_{j-1}
    load_tile<kHeadDimVo / 8, kBlockN>(s_v, v_base, offsets + kBlockN);
    cp_async_commit();

    // S = Q K^T: Dqk / 16 steps of k16, 32 bytes apart inside a 64-column block; each 64 keys of
    // the tile are one m64n64 product into their 32 accumulators.
    float s[kSRegs];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDimQk / 16; ++ks) {
      const uint32_t column = (ks & 3) * 32;
      const uint64_t a = descriptor(s_q + (ks >> 2) * C::kQBlockBytes + column, 16, 1024);
#pragma unroll
      for (int half = 0; half < kBlockN / 64; ++half) {
        const uint32_t b = s_k + (ks >> 2) * C::kKvBlockBytes + half * 64 * 128 + column;
        Ops<T>::qk(*reinterpret_cast<float(*)[32]>(s + 32 * half), a, descriptor(b, 16, 1024),
                   ks > 0 ? 1 : 0);
      }
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(s);

    float alpha[2];
    if (softmax_tile<kBlockN>(p, s, n0, cta_hi, key_end, first_pos, last_pos, row_pos, row_max,
                              row_sum, alpha)) {
#pragma unroll
      for (int i = 0; i < kORegs; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    uint32_t pa[kBlockN / 16][4];
    pack_p<T, kBlockN>(s, pa);

    const bool has_next = block + 1 < num_blocks;
    if (has_next && threadIdx.x < kBlockN) {
      int64_t* next = s_off + ((block + 1) & 1) * 2 * kBlockN;
      key_offsets<KV>(p, pages, kv_len, n0 + kBlockN, next, next + kBlockN);
    }
    cp_async_wait_all();   // V_j
    if constexpr (kFp8) {  // ... of V_j
      widen_e4m3_tile<T, kHeadDimVo / 8, kBlockN, 128>(
          s_v, [](int row, int chunk) { return tile_offset<kBlockN>(row, chunk); });
    }
    fence_proxy_async();
    __syncthreads();  // every thread is done with K_j; the next offsets are visible
    if (has_next) {
      load_tile<kHeadDimQk / 8, kBlockN>(s_k, k_base, s_off + ((block + 1) & 1) * 2 * kBlockN);
      cp_async_commit();
    }

    // O += P V: kBlockN / 16 steps of 16 keys (2048 bytes of V each).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      Ops<T>::pv(o, pa[kk], descriptor(s_v + kk * 16 * 128, C::kKvBlockBytes, 1024));
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(o);
  }

  // A page id outside the pool (kernel.cuh's key_offsets): the rows get 0 / -inf (a poisoned
  // partial when split).
  const bool bad_page = cta_met_bad_page();
  write_rows<T, kHeadDimVo>(p, o, row_sum, row_max, row0, num_rows, q_begin, kv_head,
                            kFp8 ? p.v_scale : 1.0f, bad_page);
  if (bad_page && threadIdx.x == 0) report_cta_bad_page(p, request);
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cuh)
#endif
}

}  // namespace pagedattn::cuda::prefill::sm90
