// The Hopper (sm_90a) MLA kernel: the work split, masking, gather and output contract of
// kernel.cuh (64 request rows per CTA, one work item of the split-KV partition, partials for split
// requests), with both products on wgmma. bf16 cache only (fp8 and blocks of 16 rows run the
// mma.sync kernel).
//
// Two warpgroups share each 32-token latent tile (K = the 576-wide row [ckv, kpe], V = its first
// 512 columns, gathered once):
//   S [64 x 32] = Q K^T   warpgroup w: the partial product over the k16 steps 2 i + w (18 steps,
//                         m64n32k16, Q and K from shared memory); the two partials
//                         meet in shared memory (thread t of each warpgroup holds the same
//                         elements, so each adds the other's 16 values) and both hold the whole S,
//   softmax               the same in both warpgroups (online, base 2, one quad of lanes per row),
//   O [64 x 256] += P V   warpgroup w: output columns [256 w, 256 w + 256), P from registers (the
//                         S accumulators packed in place), V N-major from the shared tile
//                         (m64n256k16, 2 k16 steps); 128 f32 accumulators per thread.
// The split of S over the reduction keeps both warpgroups busy on every product with no P round
// trip through shared memory. The tiles are software-pipelined: S of tile j + 1 is issued before
// P V of tile j, so the exchange and softmax of tile j + 1 run on the ALUs while P V of tile j runs
// on the tensor cores (wgmma groups complete in order: wait_group 1 returns S j + 1 with P V j
// still running); O is rescaled by tile j + 1's alpha and P j + 1 packed once P V j is done.
//
// Memory (one CTA per SM): Q 72 KiB, three tile stages of 36 KiB (cp.async: tile j is read by
// P V, tile j + 1 by S, tile j + 2 streams in; a stage is refilled after the barrier that follows
// the P V that read it), the S exchange 16 KiB, gather offsets. Tiles use wgmma's 128-byte swizzle
// in 64-column blocks (prefill/kernel_sm90.cuh: tile_offset, descriptor): Q is 9 blocks of 64 rows
// x 128 bytes, a stage 9 blocks of 32 tokens x 128 bytes. Threads 0..31 translate the token
// positions of tile j + 3 into element offsets while tile j is used (their pages loaded one tile
// earlier still); tokens past the range re-read the last one (real data, masked).
#pragma once

#include "cuda/mla/kernel.cuh"
#include "cuda/mla/wgmma.cuh"

namespace pagedattn::cuda::mla::sm90 {

struct Tile {
  static constexpr int kThreads = 256;  // two warpgroups
  static constexpr int kRows = 64;
  static constexpr int kTokens = 32;  // per KV tile
  static constexpr int kStages = 3;
  static constexpr int kChunks = kDimQk / 8;           // 72 16-byte chunks per row
  static constexpr int kQBlockBytes = kRows * 128;     // one 64-column block of Q
  static constexpr int kKvBlockBytes = kTokens * 128;  // ... of a KV tile
  static constexpr int kQBytes = kDimQk / 64 * kQBlockBytes;
  static constexpr int kStageBytes = kDimQk / 64 * kKvBlockBytes;
  static constexpr int kSteps = kDimQk / 16 / 2;  // k16 steps of S per warpgroup
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + kQBytes;
  static constexpr int kExchange = kKv + kStages * kStageBytes;  // f32 [2][4][128 threads][4]
  static constexpr int kOffsets = kExchange + 2 * 16 * 128 * 4;  // int64 [stages][ckv|kpe][32]
  static constexpr int kBytes = kOffsets + kStages * 2 * kTokens * 8;
  // + 1024: the dynamic shared memory is aligned up to 1024 bytes inside the kernel.
  static constexpr int kSmemBytes = kBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
  static_assert(kTokens * kChunks % kThreads == 0 && kRows * kChunks % kThreads == 0);
};

// Gathers the 32 latent rows of a tile (bf16, offsets in elements) into a swizzled stage. Thread
// t copies row t / 8, 16-byte chunk t % 8 of each of the nine 64-column blocks: one offset read and
// one swizzled position per thread, the nine copies step by constants (64 elements in the cache,
// one block in the stage), and eight lanes read 128 contiguous bytes of a row.
__device__ __forceinline__ void load_tile(uint32_t stage, const __nv_bfloat16* ckv,
                                          const __nv_bfloat16* kpe, const int64_t* ckv_off,
                                          const int64_t* kpe_off) {
  static_assert(Tile::kThreads == 8 * Tile::kTokens);
  const int row = static_cast<int>(threadIdx.x) >> 3;
  const int part = static_cast<int>(threadIdx.x) & 7;
  const uint32_t dst = stage + tile_offset<Tile::kTokens>(row, part);
  const __nv_bfloat16* src = ckv + ckv_off[row] + part * 8;
#pragma unroll
  for (int b = 0; b < kRank / 64; ++b) {
    prefill::cp_async_16(dst + b * Tile::kKvBlockBytes, src + b * 64);
  }
  prefill::cp_async_16(dst + kRank / 64 * Tile::kKvBlockBytes, kpe + kpe_off[row] + part * 8);
}

__global__ void __launch_bounds__(Tile::kThreads, 1)
    mla_kernel_sm90(const __grid_constant__ MlaParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Tile;
  constexpr int kN = T::kTokens;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t base = aligned_smem(smem_raw, smem);
  const uint32_t s_q = base + T::kQ;
  const uint32_t s_kv = base + T::kKv;
  float4* s_x = reinterpret_cast<float4*>(smem + T::kExchange);
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + T::kOffsets);

  ItemWork work;
  if (!item_work(p, work)) return;
  const auto [item, request, split, q_begin, q_len, num_rows, kv_len, chunk_begin, chunk_end,
              pos_shift, pages] = work;
  const int H = p.num_heads;

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;        // warpgroup: S reduction half, O column half
  const int t_in_wg = tid & 127;  // thread in the warpgroup
  const int lane = tid & 31, warp = t_in_wg >> 5;
  const auto* ckv = static_cast<const __nv_bfloat16*>(p.ckv);
  const auto* kpe = static_cast<const __nv_bfloat16*>(p.kpe);
  auto stage_of = [&](int tile) -> uint32_t { return s_kv + (tile % T::kStages) * T::kStageBytes; };
  auto offsets_of = [&](int tile) -> int64_t* { return s_off + (tile % T::kStages) * 2 * kN; };

  for (int rb = static_cast<int>(blockIdx.x); rb * T::kRows < num_rows;
       rb += static_cast<int>(gridDim.x)) {
    const int row0 = rb * T::kRows;
    int limit[2];  // this thread's rows 16 * warp + lane / 4 (+ 8): last visible key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + warp * 16 + (lane >> 2) + 8 * h, num_rows - 1);
      limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
    }
    const int block_end = row_block_end(p, work, row0, T::kRows);
    const int num_tiles = (block_end - chunk_begin + kN - 1) / kN;

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    int page_ahead = 0;  // threads < 32: the page of their token in tile + 3

    if (num_tiles > 0) {
      // Q rows (zero past the request's rows); offsets of tiles 0..2; tiles 0 and 1.
#pragma unroll 2
      for (int i = tid; i < T::kRows * T::kChunks; i += T::kThreads) {
        const int r = i / T::kChunks;
        const int c = i - r * T::kChunks;
        int bytes;
        const __nv_bfloat16* src = q_chunk(p, work, row0 + r, c, bytes);
        prefill::cp_async_16(s_q + tile_offset<T::kRows>(r, c), src, bytes);
      }
      if (tid < kN) {
#pragma unroll 1
        for (int k = 0; k < T::kStages && k < num_tiles; ++k) {
          token_offsets(p, pages, chunk_begin + k * kN, block_end, offsets_of(k),
                        offsets_of(k) + kN);
        }
        if (num_tiles > T::kStages) {
          page_ahead = token_page(p, pages, chunk_begin + T::kStages * kN, block_end);
        }
      }
      __syncthreads();
      load_tile(stage_of(0), ckv, kpe, offsets_of(0), offsets_of(0) + kN);
      prefill::cp_async_commit();
      if (num_tiles > 1) load_tile(stage_of(1), ckv, kpe, offsets_of(1), offsets_of(1) + kN);
      prefill::cp_async_commit();
    }

    // S of tile t: this warpgroup's partial product over its 288 columns, issued (not waited).
    float s[16];
    auto issue_s = [&](int t) {
      const uint32_t stage = stage_of(t);
      // Warpgroup wg takes the k16 steps 2 ks + wg: step ks lies in block ks / 2 at byte
      // 64 (ks % 2) + 32 wg, so every descriptor is the warpgroup's first plus a constant.
      const uint64_t a0 = descriptor(s_q + 32 * wg, 16, 1024);
      const uint64_t b0 = descriptor(stage + 32 * wg, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < T::kSteps; ++ks) {
        const uint32_t qa = (ks >> 1) * T::kQBlockBytes + (ks & 1) * 64;
        const uint32_t kb = (ks >> 1) * T::kKvBlockBytes + (ks & 1) * 64;
        ss_m64n32k16_bf16(s, a0 + (qa >> 4), b0 + (kb >> 4), ks > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // S = S_0 + S_1 through shared memory (the same sum, bit for bit, in both warpgroups), then
    // the mask and the online softmax (base 2) of tile t: P in s (f32), alpha (the rescale of O)
    // per row, `moved` when some row's max moved.
    auto softmax = [&](int t, float(&alpha)[2], bool& moved) {
      const int n0 = chunk_begin + t * kN;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s_x[(wg * 4 + i) * 128 + t_in_wg] =
            make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = s_x[((1 - wg) * 4 + i) * 128 + t_in_wg];
        s[4 * i] += v.x;
        s[4 * i + 1] += v.y;
        s[4 * i + 2] += v.z;
        s[4 * i + 3] += v.w;
      }
      const bool needs_mask = n0 + kN > block_end || (p.causal && n0 + kN - 1 > limit[0]);
      if (needs_mask) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int key = n0 + (i >> 2) * 8 + 2 * (lane & 3) + (i & 1);
          if (key >= block_end || key > limit[(i >> 1) & 1]) s[i] = -INFINITY;
        }
      }
      moved = online_softmax(s, p.scale_log2, row_max, row_sum, alpha);
    };
    // P as the A fragments of P V (bf16 pairs).
    uint32_t pa[kN / 16][4];
    auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
          pa[kk][r] = Bf16Mma::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
      }
    };

    // Software pipeline: while P V of tile j runs on the tensor cores, the softmax of tile j + 1
    // runs on the ALUs (its S was issued just before P V of tile j; wgmma groups complete in
    // order, so S j + 1 goes first). The rescale of O by tile j + 1's alpha waits for P V j.
    if (num_tiles > 0) {
      cp_async_wait<1>();   // tile 0 and Q landed (tile 1 may be in flight)
      fence_proxy_async();  // ... visible to the tensor cores (async proxy)
      __syncthreads();      // ... for every thread's copies
      issue_s(0);
      wgmma_wait<0>();
      fence_registers(s);
      float alpha[2];
      bool moved;
      softmax(0, alpha, moved);  // O is zero: nothing to rescale
      pack_p();
    }
    // ---- O += P V of tile t over this warpgroup's 256 columns (4 blocks of 64), issued ----
    auto pv_descriptors = [&](int t, uint64_t(&desc)[kN / 16]) {
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        desc[kk] = descriptor(stage_of(t) + wg * 4 * T::kKvBlockBytes + kk * 16 * 128,
                              T::kKvBlockBytes, 1024);
      }
    };
    auto issue_pv = [&](const uint64_t(&desc)[kN / 16], bool fence) {
      if (fence) wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) rs_m64n256k16_bf16(o, pa[kk], desc[kk]);
      wgmma_commit();
    };
    for (int tile = 0; tile + 1 < num_tiles; ++tile) {
      cp_async_wait<0>();   // tile + 1 landed (this thread's copies)
      fence_proxy_async();  // ... visible to the tensor cores
      __syncthreads();      // ... every thread's; both warpgroups finished P V of tile - 1
      uint64_t desc[kN / 16];
      pv_descriptors(tile, desc);
      issue_s(tile + 1);
      issue_pv(desc, false);  // the fence of issue_s covers o and pa
      // While the tensor cores work: tile + 2 into the stage P V of tile - 1 read; the offsets
      // of tile + 3 into the slot the load of tile `tile` read (two barriers ago).
      if (tile + 2 < num_tiles) {
        load_tile(stage_of(tile + 2), ckv, kpe, offsets_of(tile + 2), offsets_of(tile + 2) + kN);
      }
      prefill::cp_async_commit();
      if (tile + 3 < num_tiles && tid < kN) {
        token_offsets(p, page_ahead, chunk_begin + (tile + 3) * kN, block_end, offsets_of(tile + 3),
                      offsets_of(tile + 3) + kN);
        if (tile + 4 < num_tiles) {
          page_ahead = token_page(p, pages, chunk_begin + (tile + 4) * kN, block_end);
        }
      }
      wgmma_wait<1>();  // S of tile + 1 (P V of tile may still run)
      fence_registers(s);
      float alpha[2];
      bool moved;
      softmax(tile + 1, alpha, moved);
      wgmma_wait<0>();  // P V of tile: o and pa are free
      fence_registers(o);
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) fence_registers(pa[kk]);
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      pack_p();
    }
    if (num_tiles > 0) {
      uint64_t desc[kN / 16];
      pv_descriptors(num_tiles - 1, desc);
      issue_pv(desc, true);
      wgmma_wait<0>();
      fence_registers(o);
    }

    // ---- epilogue: both warpgroups hold the whole row statistics; each writes its columns ----
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row0 + warp * 16 + (lane >> 2) + 8 * h;
      if (row >= num_rows || (split && row >= p.partial_rows)) continue;
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      const float lse = l > 0.0f ? (row_max[h] + __log2f(l)) * kLn2 : -INFINITY;
      store_row<32>(p, work, row, wg * 256 + 2 * (lane & 3), inv,
                    [&](int j) { return make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]); });
      if (wg == 0 && (lane & 3) == 0) {
        if (float* slot = lse_slot(p, work, row)) *slot = lse;
      }
    }
    __syncthreads();  // shared memory is reused by the next row block
  }
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cu)
#endif
}

}  // namespace pagedattn::cuda::mla::sm90
