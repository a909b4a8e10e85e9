// The CUDA MLA kernel for requests of at most 16 query rows (H <= 16 decode), bf16 cache: the
// contract of kernel.cuh (one CTA per block of request rows and work item of the split-KV
// partition, masking, partials of split requests), shaped for a read-bound step. There the
// products are cheap (16 rows against each 1152-byte latent row) and the time goes to the cache
// read, so what counts is the bytes in flight per SM: the 16-row Q takes 18 KiB, leaving room for
// kStages = 5 stages of 32 tokens (36 KiB each, cp.async), so four tiles stream in while one is
// used (144 KiB in flight per SM; the 64-row kernel double-buffers 72 KiB).
//
// Per 32-token tile, 8 warps (mma.sync m16n8k16, bf16 in, f32 accumulate):
//   S [16 x 32] = Q K^T   warp w: tokens (w % 4) * 8 .. + 8, columns (w / 4) * 288 .. + 288
//                         (18 k16 steps); warps 4-7 hand their partial sums to warps 0-3 through
//                         shared memory;
//   softmax               warps 0-3 (online, base 2): row maxima of the four token groups meet in
//                         shared memory; P (bf16) to shared memory, alpha per row with it;
//   O [16 x 512] += P V   warp w: columns w * 64 .. + 64 (32 f32 accumulators per thread).
// Rows are 16-byte-chunk XOR-swizzled (chunk ^ row % 8) as in kernel.cuh, so the ldmatrix reads are
// conflict-free. Warp 4 translates the token positions of tile j + kStages into element offsets
// while warps 0-3 run the softmax of tile j (their pages loaded a tile earlier still); tokens past
// the range re-read the last one (real data, masked).
#pragma once

#include "cuda/mla/kernel.cuh"

namespace pagedattn::cuda::mla::small {

struct Tile {
  static constexpr int kRows = 16;
  static constexpr int kTokens = 32;
  static constexpr int kStages = 5;
  static constexpr int kChunks = kDimQk / 8;  // 72 16-byte chunks per row
  static constexpr int kRowBytes = kDimQk * 2;
  static constexpr int kPRowBytes = 128;  // P rows padded to 128 bytes (32 tokens used)
  static constexpr int kStageBytes = kTokens * kRowBytes;
  static constexpr int kQ = 0;                                       // [16][576] bf16
  static constexpr int kKv = kQ + kRows * kRowBytes;                 // [stages][32][576] bf16
  static constexpr int kP = kKv + kStages * kStageBytes;             // [16][64] bf16
  static constexpr int kPart = kP + kRows * kPRowBytes;              // f32 [4 warps][32 lanes][4]
  static constexpr int kOffsets = kPart + 4 * 32 * 16;               // int64 [stages][ckv|kpe][32]
  static constexpr int kRed = kOffsets + kStages * 2 * kTokens * 8;  // f32 [4 groups][16]
  static constexpr int kAlpha = kRed + 4 * kRows * 4;                // f32 [16]
  static constexpr int kBytes = kAlpha + kRows * 4;
  static_assert(kBytes <= 227 * 1024, "one CTA per SM must fit");
  static_assert(kTokens * kChunks % kThreads == 0);
};

// Gathers the 32 latent rows of a tile (bf16, offsets in elements) into a swizzled stage. Thread
// t copies row t / 8, chunks 8 b + t % 8 (b = 0..8): with the chunk XOR row % 8 swizzle inside
// each 128-byte run, the nine copies step by constants in both the cache and the stage.
__device__ __forceinline__ void load_tile(uint32_t stage, const __nv_bfloat16* ckv,
                                          const __nv_bfloat16* kpe, const int64_t* ckv_off,
                                          const int64_t* kpe_off) {
  static_assert(kThreads == 8 * Tile::kTokens);
  const int row = static_cast<int>(threadIdx.x) >> 3;
  const int part = static_cast<int>(threadIdx.x) & 7;
  const uint32_t dst = stage + swz<Tile::kRowBytes>(row, part);
  const __nv_bfloat16* src = ckv + ckv_off[row] + part * 8;
#pragma unroll
  for (int b = 0; b < kRank / 64; ++b) prefill::cp_async_16(dst + b * 128, src + b * 64);
  prefill::cp_async_16(dst + kRank / 64 * 128, kpe + kpe_off[row] + part * 8);
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The warp that translates token positions into cache offsets (a warp of the second S half).
inline constexpr int kOffsetWarp = 4;

__global__ void __launch_bounds__(kThreads, 1)
    mla_kernel_small(const __grid_constant__ MlaParams p) {
  using T = Tile;
  constexpr float kLn2 = 0.6931471805599453f;
  constexpr int kN = T::kTokens;
  constexpr int kRowBytes = T::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem + T::kQ);
  const uint32_t s_kv = smem_u32(smem + T::kKv);
  const uint32_t s_p = smem_u32(smem + T::kP);
  float4* s_part = reinterpret_cast<float4*>(smem + T::kPart);
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + T::kOffsets);
  float* s_red = reinterpret_cast<float*>(smem + T::kRed);
  float* s_alpha = reinterpret_cast<float*>(smem + T::kAlpha);

  const int item = static_cast<int>(blockIdx.y);
  if (item >= p.partition.info->num_items) return;
  const int request = p.partition.work_request[item];
  const int chunk = p.partition.work_chunk[item];
  const bool split = p.partition.merge_indptr[request + 1] - p.partition.merge_indptr[request] > 1;
  const int64_t chunk_tokens = int64_t{p.partition.info->chunk_pages} * p.page_size;

  const int q_begin = p.qo_indptr[request];
  const int q_len = p.qo_indptr[request + 1] - q_begin;
  const int H = p.num_heads;
  const int num_rows = q_len * H;
  const int page_begin = p.kv_indptr[request];
  const int num_pages = p.kv_indptr[request + 1] - page_begin;
  const int kv_len =
      num_pages > 0 ? (num_pages - 1) * p.page_size + p.kv_last_page_len[request] : 0;
  const int32_t* pages = p.kv_indices + page_begin;
  const int chunk_begin = static_cast<int>(min(int64_t{kv_len}, chunk * chunk_tokens));
  const int chunk_end = static_cast<int>(min(int64_t{kv_len}, (chunk + 1) * chunk_tokens));
  const int pos_shift = kv_len - q_len;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int group = warp & 3;  // S: tokens group * 8 .. + 8
  const int half = warp >> 2;  // S: k16 steps half * 18 .. + 18
  const auto* ckv = static_cast<const __nv_bfloat16*>(p.ckv);
  const auto* kpe = static_cast<const __nv_bfloat16*>(p.kpe);
  const auto* q_nope = static_cast<const __nv_bfloat16*>(p.q_nope);
  const auto* q_pe = static_cast<const __nv_bfloat16*>(p.q_pe);
  auto stage_of = [&](int tile) -> uint32_t { return s_kv + (tile % T::kStages) * T::kStageBytes; };
  auto offsets_of = [&](int tile) -> int64_t* { return s_off + (tile % T::kStages) * 2 * kN; };

  // Per-lane ldmatrix offsets (kernel.cuh): Q x4 (16 rows x 2 chunks), K x2 (8 tokens x 2 chunks,
  // lanes 0..15), V x4.trans, P x4.
  const uint32_t q_lane = swz<kRowBytes>(lane & 15, lane >> 4);
  const uint32_t k_lane = swz<kRowBytes>(group * 8 + (lane & 7), (lane >> 3) & 1);
  const uint32_t v_lane = swz<kRowBytes>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
  const uint32_t p_lane = swz<T::kPRowBytes>(lane & 15, lane >> 4);

  for (int rb = static_cast<int>(blockIdx.x); rb * T::kRows < num_rows;
       rb += static_cast<int>(gridDim.x)) {
    const int row0 = rb * T::kRows;
    int limit[2];  // this thread's S rows lane / 4 (+ 8): last visible key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + (lane >> 2) + 8 * h, num_rows - 1);
      limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
    }
    const int last_row = min(row0 + T::kRows, num_rows) - 1;
    const int block_end =
        p.causal ? min(chunk_end, max(chunk_begin, pos_shift + last_row / H + 1)) : chunk_end;
    const int num_tiles = (block_end - chunk_begin + kN - 1) / kN;

    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    }
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    int page_ahead = 0;  // warp kOffsetWarp: the page of its lane's token in tile + kStages

    if (num_tiles > 0) {
      // Q rows (zero past the request's rows); offsets of tiles 0 .. kStages - 1; tiles
      // 0 .. kStages - 2, one cp.async group each (Q with tile 0).
      for (int i = tid; i < T::kRows * T::kChunks; i += kThreads) {
        const int r = i / T::kChunks;
        const int c = i - r * T::kChunks;
        const int row = row0 + r;
        const bool valid = row < num_rows;
        const int tok = valid ? row / H : 0;
        const int head = valid ? row - tok * H : 0;
        const __nv_bfloat16* src = c < kRank / 8
                                       ? q_nope + (q_begin + tok) * p.q_nope_stride_token +
                                             head * p.q_nope_stride_head + c * 8
                                       : q_pe + (q_begin + tok) * p.q_pe_stride_token +
                                             head * p.q_pe_stride_head + (c - kRank / 8) * 8;
        prefill::cp_async_16(s_q + swz<kRowBytes>(r, c), valid ? src : q_nope, valid ? 16 : 0);
      }
      if (warp == kOffsetWarp) {
#pragma unroll 1
        for (int k = 0; k < T::kStages && k < num_tiles; ++k) {
          token_offsets(p, pages, chunk_begin + k * kN, block_end, offsets_of(k),
                        offsets_of(k) + kN, lane);
        }
        if (num_tiles > T::kStages) {
          page_ahead = token_page(p, pages, chunk_begin + T::kStages * kN, block_end, lane);
        }
      }
      __syncthreads();
#pragma unroll 1
      for (int k = 0; k + 1 < T::kStages; ++k) {
        if (k < num_tiles) load_tile(stage_of(k), ckv, kpe, offsets_of(k), offsets_of(k) + kN);
        prefill::cp_async_commit();
      }
    }

    for (int tile = 0; tile < num_tiles; ++tile) {
      const int n0 = chunk_begin + tile * kN;
      const uint32_t stage = opaque(stage_of(tile));
      cp_async_wait<T::kStages - 2>();  // every group but the newest kStages - 2: tile `tile`
      __syncthreads();  // tile visible; everyone is done with tile - 1, whose stage refills now
      if (tile + T::kStages - 1 < num_tiles) {
        const int next = tile + T::kStages - 1;
        load_tile(stage_of(next), ckv, kpe, offsets_of(next), offsets_of(next) + kN);
      }
      prefill::cp_async_commit();  // possibly empty: one group per tile keeps the count fixed

      // ---- partial S: rows 0..15, tokens group * 8 .., k16 steps half * 18 .. (three
      // independent accumulator chains of 6 steps, summed: a third of the MMA latency chain) ----
      float acc[3][4] = {};
      const uint32_t q_off = opaque(q_lane), k_off = opaque(k_lane);
#pragma unroll
      for (int ks = 0; ks < kDimQk / 32; ++ks) {
        const int k = half * (kDimQk / 32) + ks;  // k16 step: chunk pair 2 (k % 4) of block k / 4
        const uint32_t swizzle = (k & 3) << 5, column = (k >> 2) * 128;
        uint32_t a[4], b[2];
        ldmatrix_x4(a, s_q + (q_off ^ swizzle) + column);
        ldmatrix_x2(b, stage + (k_off ^ swizzle) + column);
        Bf16Mma::run(acc[ks % 3], a, b[0], b[1]);
      }
      float s[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = acc[0][e] + acc[1][e] + acc[2][e];
      if (half == 1) s_part[group * 32 + lane] = make_float4(s[0], s[1], s[2], s[3]);
      __syncthreads();

      // ---- warp kOffsetWarp (idle while warps 0-3 mask and reduce): offsets of tile
      // `tile` + kStages into the slot the load of tile `tile` read, kStages - 1 barriers ago ----
      if (warp == kOffsetWarp && tile + T::kStages < num_tiles) {
        const int next = tile + T::kStages;
        token_offsets(p, page_ahead, n0 + T::kStages * kN, block_end, offsets_of(next),
                      offsets_of(next) + kN, lane);
        if (next + 1 < num_tiles) {
          page_ahead = token_page(p, pages, n0 + (next + 1 - tile) * kN, block_end, lane);
        }
      }

      // ---- warps 0-3: whole S, mask, this group's row maxima ----
      if (half == 0) {
        const float4 other = s_part[group * 32 + lane];
        s[0] += other.x;
        s[1] += other.y;
        s[2] += other.z;
        s[3] += other.w;
        const bool needs_mask = n0 + kN > block_end || (p.causal && n0 + kN - 1 > limit[0]);
        if (needs_mask) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + group * 8 + 2 * (lane & 3) + (e & 1);
            if (key >= block_end || key > limit[e >> 1]) s[e] = -INFINITY;
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m = fmaxf(s[2 * h], s[2 * h + 1]);
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          if ((lane & 3) == 0) s_red[group * T::kRows + (lane >> 2) + 8 * h] = m * p.scale_log2;
        }
      }
      __syncthreads();

      // ---- warps 0-3: P = exp2(S * scale - max) to shared memory (bf16), alpha per row ----
      if (half == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = (lane >> 2) + 8 * h;
          float m_new = row_max[h];
#pragma unroll
          for (int g = 0; g < 4; ++g) m_new = fmaxf(m_new, s_red[g * T::kRows + row]);
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing seen yet
          const float alpha = fast_exp2(row_max[h] - m_use);
          row_max[h] = m_new;
          const float p0 = fast_exp2(fmaf(s[2 * h], p.scale_log2, -m_use));
          const float p1 = fast_exp2(fmaf(s[2 * h + 1], p.scale_log2, -m_use));
          row_sum[h] = row_sum[h] * alpha + (p0 + p1);
          *reinterpret_cast<uint32_t*>(smem + T::kP + swz<T::kPRowBytes>(row, group) +
                                       4 * (lane & 3)) = Bf16Mma::pack(p0, p1);
          if (group == 0 && (lane & 3) == 0) s_alpha[row] = alpha;
        }
      }
      __syncthreads();

      // ---- O = O * alpha + P V: rows 0..15, columns warp * 64 .. + 64 ----
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float alpha = s_alpha[(lane >> 2) + 8 * h];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          o[nt][2 * h] *= alpha;
          o[nt][2 * h + 1] *= alpha;
        }
      }
      const uint32_t p_off = opaque(p_lane), v_off = opaque(v_lane);
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, s_p + (p_off ^ (kk << 5)));
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, stage + kk * 16 * kRowBytes + (v_off ^ (dp << 5)) + warp * 128);
          Bf16Mma::run(o[2 * dp], a, b[0], b[1]);
          Bf16Mma::run(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }

    // ---- epilogue: row sums of the four token groups and the final max via shared memory ----
    __syncthreads();  // every warp is done reading s_red / s_alpha of the last tile
    if (half == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = (lane >> 2) + 8 * h;
        if ((lane & 3) == 0) {
          s_red[group * T::kRows + row] = l;
          if (group == 0) s_alpha[row] = row_max[h];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (lane >> 2) + 8 * h;
      const int row = row0 + r;
      if (row >= num_rows || (split && row >= p.partial_rows)) continue;
      float l = 0.0f;
#pragma unroll
      for (int g = 0; g < 4; ++g) l += s_red[g * T::kRows + r];
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      const float lse = l > 0.0f ? (s_alpha[r] + __log2f(l)) * kLn2 : -INFINITY;
      const int tok = row / H;
      const int head = row - tok * H;
      const int col = warp * 64 + 2 * (lane & 3);
      if (!split) {
        __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) +
                             (q_begin + tok) * p.out_stride_token + head * p.out_stride_head + col;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          *reinterpret_cast<uint32_t*>(dst + nt * 8) =
              Bf16Mma::pack(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
        }
        if (p.lse != nullptr && warp == 0 && (lane & 3) == 0) {
          p.lse[(q_begin + tok) * p.lse_stride_token + head * p.lse_stride_head] = lse;
        }
      } else {
        const int64_t slot = int64_t{item} * p.partial_rows + row;
        float* dst = p.partial_out + slot * kRank + col;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          *reinterpret_cast<float2*>(dst + nt * 8) =
              make_float2(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
        }
        if (warp == 0 && (lane & 3) == 0) p.partial_lse[slot] = lse;
      }
    }
    __syncthreads();  // shared memory is reused by the next row block
  }
}

}  // namespace pagedattn::cuda::mla::small
