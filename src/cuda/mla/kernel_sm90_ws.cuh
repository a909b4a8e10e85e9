// The warp-specialized Hopper (sm_90a) MLA kernel for blocks of 64 request rows: the work split,
// masking, gather and output contract of kernel.cuh (one CTA per row block and work item of the
// split-KV partition, partials for split requests), bf16 cache, one row block per CTA.
//
// Three warpgroups with their own jobs, meeting only at mbarriers:
//   WG 0 (softmax)   holds Q's latent blocks 0..6 as wgmma A fragments in registers (64 rows x
//                    448: 112 registers, loaded once; latent block 7 and the rope block stay in
//                    shared memory), computes S [64 x 32] = Q K^T of each 32-token tile (36 k16
//                    steps, m64n32k16, 28 of them with A from registers, so mostly only K is read
//                    from shared memory) into one of two accumulator sets, so that S of tile
//                    t + 1 runs on the tensor cores during the softmax of tile t; then the online
//                    softmax (base 2, lazy rescale) writes P (bf16) with each row's rescale
//                    factor into one of two P buffers;
//   WG 1, WG 2       each own 256 of the 512 output columns (128 f32 accumulators per thread):
//   (output)         rescale O when a row's reference max moved, O += P V (m64n256k16, P and V
//                    from shared memory), and gather the cache tiles (cp.async): WG 1 the blocks
//                    it reads (columns 0..255) plus the rope block, WG 2 columns 256..511, each
//                    refilling its part of a stage as soon as its own P V of that stage is done.
// No exchange of partial products and no CTA-wide barrier per tile; the tensor cores see S of tile
// t + 1 (WG 0) next to P V of tile t (WG 1, WG 2), and during the softmax of tile t.
//
// Memory: five tile stages of 36 KiB (32 tokens x nine 64-column blocks of 128 bytes, wgmma's
// 128-byte swizzle), two P buffers (64 rows x 128 bytes, 32 tokens used), Q's last latent block
// and its rope block, row factors, mbarriers. Q's latent blocks 0..6 pass through stages 3 and 4
// on their way to WG 0's registers. Registers: setmaxnreg moves the CTA's 3 x 168 per thread to
// 184 (WG 0) + 2 x 160. Barriers:
//   full[s]   (256 arrivals, cp.async.mbarrier.arrive) stage s holds its tile,
//   pfull[b]  (128: WG 0) P buffer b holds P of a tile and its row factors,
//   pempty[b] (256: WG 1, WG 2) both output warpgroups are done reading buffer b.
// Each thread of WG 1 / WG 2 gathers 2 token rows of a tile (8 lanes per 128-byte run); their
// attention pages are loaded one refill ahead. Tokens past the range re-read the last one (real
// data, masked). A gatherer that meets a page id outside the pool sets a shared flag; after
// barrier (3) the output warpgroups write the block's rows as 0 and WG 1 its lse (written by WG 0
// before the barrier) as -inf, or poisoned for a split request (kernel.cuh).
#pragma once

#include "cuda/mla/kernel.cuh"
#include "cuda/mla/sm90_ws.h"
#include "cuda/mla/wgmma.cuh"

namespace pagedattn::cuda::mla::sm90ws {

using namespace pagedattn::cuda::mla::sm90;  // wgmma.cuh: shapes, mbarriers, setmaxnreg

// S k16 steps [K0, K1) of a 32-token tile into d (stage descriptor b0): A from WG 0's registers
// below Ws::kRegSteps, else from shared memory (a_smem: Q's last latent block, then rope).
template <int K0, int K1>
__device__ __forceinline__ void issue_s_steps(float (&d)[16],
                                              const uint32_t (&qa)[Ws::kRegSteps][4],
                                              uint64_t a_smem, uint64_t b0) {
#pragma unroll
  for (int k = K0; k < K1; ++k) {
    const uint32_t kb = (k >> 2) * Ws::kKvBlockBytes + (k & 3) * 32;
    if (k < Ws::kRegSteps) {
      rs_m64n32k16_bf16(d, qa[k < Ws::kRegSteps ? k : 0], b0 + (kb >> 4), k > 0 ? 1 : 0);
    } else {
      const uint32_t qb = ((k - Ws::kRegSteps) >> 2) * Ws::kQBlockBytes + (k & 3) * 32;
      ss_m64n32k16_bf16(d, a_smem + (qb >> 4), b0 + (kb >> 4), 1);
    }
  }
}

__global__ void __launch_bounds__(Ws::kThreads, 1)
    mla_kernel_sm90_ws(const __grid_constant__ MlaParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using W = Ws;
  constexpr int kN = W::kTokens;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t base = aligned_smem(smem_raw, smem);
  const uint32_t s_kv = base + W::kKv;
  const uint32_t s_p = base + W::kP;
  const uint32_t s_qsmem = base + W::kQSmem;
  float* s_alpha = reinterpret_cast<float*>(smem + W::kAlpha);
  int* s_moved = reinterpret_cast<int*>(smem + W::kMoved);
  float* s_stats = reinterpret_cast<float*>(smem + W::kStats);
  // Set by a gathering thread that met a page id outside the pool (checked_page, kernel.cuh); read
  // by the output warpgroups after barrier (3): the block's rows then get 0 / -inf.
  int* s_bad_page = reinterpret_cast<int*>(smem + W::kBadPage);
  const uint32_t bar_full = base + W::kBars;          // + 8 s
  const uint32_t bar_pfull = bar_full + W::kStages * 8;  // + 8 b
  const uint32_t bar_pempty = bar_pfull + 2 * 8;         // + 8 b

  ItemWork work;
  if (!item_work(p, work)) return;
  const auto [item, request, split, q_begin, q_len, num_rows, kv_len, chunk_begin, chunk_end,
              pos_shift, pages] = work;
  const int H = p.num_heads;
  const int row0 = static_cast<int>(blockIdx.x) * W::kRows;
  if (row0 >= num_rows) return;
  const int block_end = row_block_end(p, work, row0, W::kRows);
  const int num_tiles = (block_end - chunk_begin + kN - 1) / kN;

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;
  const int t_in_wg = tid & 127;
  const int lane = tid & 31, warp = t_in_wg >> 5;  // warp in its warpgroup: rows 16 warp ..
  auto stage_of = [&](int tile) -> uint32_t { return s_kv + (tile % W::kStages) * W::kStageBytes; };

  if (tid == 0) {
    *s_bad_page = 0;
    for (int s = 0; s < W::kStages; ++s) mbarrier_init(bar_full + 8 * s, 256);
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(bar_pfull + 8 * b, 128);
      mbarrier_init(bar_pempty + 8 * b, 256);
    }
  }
  __syncthreads();  // (0) the barriers are initialised
  // Q rows (zero past the request's rows) into stages 3..4, every thread a share.
  {
    const uint32_t s_q = s_kv + W::kQStage * W::kStageBytes;
    for (int i = tid; i < W::kRows * (kDimQk / 8); i += W::kThreads) {
      const int r = i / (kDimQk / 8);
      const int c = i - r * (kDimQk / 8);
      int bytes;
      const __nv_bfloat16* src = q_chunk(p, work, row0 + r, c, bytes);
      const uint32_t dst = c < W::kSmemQChunk
                               ? s_q + tile_offset<W::kRows>(r, c)
                               : s_qsmem + tile_offset<W::kRows>(r, c - W::kSmemQChunk);
      prefill::cp_async_16(dst, src, bytes);
    }
    prefill::cp_async_commit();
  }

  if (wg == 0) {
    // ================= softmax warpgroup =================
    regs_increase<W::kSoftmaxRegs>();
    int limit[2];  // rows 16 warp + lane / 4 (+ 8): last visible key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + warp * 16 + (lane >> 2) + 8 * h, num_rows - 1);
      limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
    }
    cp_async_wait<0>();
    named_barrier_sync(3, W::kThreads);  // (1) Q landed (every thread's copies)
    // Q as A fragments: k16 step k of rows 16 warp .. + 16 (ldmatrix x4: rows lane % 16, chunk
    // 2 (k % 4) + lane / 16 of block k / 4).
    uint32_t qa[W::kRegSteps][4];
    {
      const uint32_t s_q = s_kv + W::kQStage * W::kStageBytes;
      const int r = warp * 16 + (lane & 15);
#pragma unroll
      for (int k = 0; k < W::kRegSteps; ++k) {
        ldmatrix_x4(qa[k], s_q + tile_offset<W::kRows>(r, 2 * k + (lane >> 4)));
      }
    }
    named_barrier_arrive(1, W::kThreads);  // (2) Q is in registers: stages 3, 4 free

    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    const uint64_t a_smem = descriptor(s_qsmem, 16, 1024);
    auto stage_ready = [&](int t) {  // tile t landed, visible to the tensor cores
      mbarrier_wait(bar_full + 8 * (t % W::kStages), (t / W::kStages) & 1);
      fence_proxy_async();
    };
    constexpr int kSteps = kDimQk / 16;
    // One tile: S of tile t is complete in `acc`; its softmax runs while S of tile t + 1 is
    // issued into `next` (kIssue), in four slices between the softmax's phases. (An RS wgmma
    // holds its warp for ~25 cycles at issue; the slices were meant to fill that time, but
    // measured the same as issuing all 36 first: bench/RESULTS.md, session 5, run 4.) P and the
    // row factors go into P buffer t % 2; the pfull arrival is left to the caller (see the loop).
    auto publish_p = [&](int t) { mbarrier_arrive(bar_pfull + 8 * (t & 1)); };
    auto step = [&]<bool kIssue>(float (&acc)[16], float (&next)[16], int t) {
      fence_registers(acc);
      // The softmax works on a copy: while a wgmma is in flight, ptxas wants no other
      // instruction to write registers that wgmmas accumulate into (else it serializes every
      // wgmma of the kernel).
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = acc[i];
      const int n0 = chunk_begin + t * kN;
      const bool needs_mask = n0 + kN > block_end || (p.causal && n0 + kN - 1 > limit[0]);
      if (needs_mask) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int key = n0 + (i >> 2) * 8 + 2 * (lane & 3) + (i & 1);
          if (key >= block_end || key > limit[(i >> 1) & 1]) s[i] = -INFINITY;
        }
      }
      uint64_t b0 = 0;
      if constexpr (kIssue) {
        stage_ready(t + 1);
        b0 = descriptor(stage_of(t + 1), 16, 1024);
        wgmma_fence();
        issue_s_steps<0, 9>(next, qa, a_smem, b0);
      }
      if (t > 0) publish_p(t - 1);  // once S of tile t + 1 is under way
      // The online softmax (kernel.cuh) in its three phases, between the slices.
      float m[2], m_use[2], alpha[2];
      softmax_local_max(s, p.scale_log2, m);
      if constexpr (kIssue) issue_s_steps<9, 18>(next, qa, a_smem, b0);
      const bool moved = softmax_move_reference(m, row_max, m_use, alpha);
      if constexpr (kIssue) issue_s_steps<18, 27>(next, qa, a_smem, b0);
      softmax_exp(s, p.scale_log2, m_use, alpha, row_sum);
      if constexpr (kIssue) {
        issue_s_steps<27, kSteps>(next, qa, a_smem, b0);
        wgmma_commit();
      }
      const bool warp_moved = __any_sync(0xffffffffu, moved);
      // Once P V of tile t - 2 is done with the buffer.
      const int b = t & 1;
      if (t >= 2) mbarrier_wait(bar_pempty + 8 * b, ((t - 2) >> 1) & 1);
      const uint32_t pbuf = s_p + b * W::kPBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + (lane >> 2) + 8 * h;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t addr = pbuf + r * 128 + ((j ^ (r & 7)) << 4) + 4 * (lane & 3);
          const uint32_t v = Bf16Mma::pack(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
        }
        if ((lane & 3) == 0) s_alpha[b * W::kRows + r] = alpha[h];
      }
      if (lane == 0) s_moved[b * 4 + warp] = warp_moved ? 1 : 0;
      fence_proxy_async();  // P, for the tensor cores of the output warpgroups
    };
    // Two sets of S accumulators (the loop is unrolled by two so that each stays in registers):
    // S of tile t + 1 is issued during the softmax of tile t and waited for after it. No wgmma
    // is in flight across the loop's edges (ptxas serializes all the kernel's wgmmas when one is).
    // P of tile t - 1 is published (pfull) only once S of tile t + 1 is under way: the output
    // warpgroups' P V then queues behind that S on the tensor cores instead of ahead of it, and
    // runs during the softmax of tile t rather than holding up WG 0's next wgmma issue.
    float s0[16], s1[16];
    if (num_tiles > 0) {
      stage_ready(0);
      const uint64_t b0 = descriptor(stage_of(0), 16, 1024);
      wgmma_fence();
      issue_s_steps<0, kSteps>(s0, qa, a_smem, b0);
      wgmma_commit();
      wgmma_wait<0>();
    }
    for (int t = 0; t < num_tiles; t += 2) {
      if (t + 1 < num_tiles) {
        step.template operator()<true>(s0, s1, t);
      } else {
        step.template operator()<false>(s0, s1, t);
      }
      wgmma_wait<0>();
      if (t + 1 >= num_tiles) break;
      if (t + 2 < num_tiles) {
        step.template operator()<true>(s1, s0, t + 1);
      } else {
        step.template operator()<false>(s1, s0, t + 1);
      }
      wgmma_wait<0>();
    }
    if (num_tiles > 0) publish_p(num_tiles - 1);
    // Row statistics for the output warpgroups' epilogue; this warpgroup writes lse.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = warp * 16 + (lane >> 2) + 8 * h;
      if ((lane & 3) == 0) {
        s_stats[r] = row_max[h];
        s_stats[W::kRows + r] = l;
      }
      const int row = row0 + r;
      if ((lane & 3) == 0 && row < num_rows && !(split && row >= p.partial_rows)) {
        if (float* slot = lse_slot(p, work, row)) {
          *slot = l > 0.0f ? (row_max[h] + __log2f(l)) * kLn2 : -INFINITY;
        }
      }
    }
    // (3) statistics written; the lse above is ordered before WG 1's rewrite of a bad block's.
    named_barrier_arrive(2, W::kThreads);
  } else {
    // ================= output warpgroups =================
    regs_decrease<W::kOutputRegs>();
    const int half = wg - 1;  // output columns 256 half ..; gathers blocks 4 half .. (+ rope)
    const auto* ckv = static_cast<const __nv_bfloat16*>(p.ckv);
    const auto* kpe = static_cast<const __nv_bfloat16*>(p.kpe);
    const int gather_part = t_in_wg & 7;
    const int gather_row = t_in_wg >> 3;  // and gather_row + 16
    // The pages of this thread's gather rows in tile t, and the copies of its blocks of tile t.
    PageGuard page_guard{false, reinterpret_cast<unsigned long long*>(smem + W::kNote), s_bad_page};
    auto tile_pages = [&](int t, int (&pg)[2]) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int key = min(chunk_begin + t * kN + gather_row + 16 * i, block_end - 1);
        pg[i] = load_page(p, pages, key);  // checked in load_tile
      }
    };
    auto load_tile = [&](int t, const int (&pg)[2]) {
      const uint32_t stage = stage_of(t);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = gather_row + 16 * i;
        const int key = min(chunk_begin + t * kN + row, block_end - 1);
        int64_t ckv_off, kpe_off;
        latent_offsets(p, checked_page(p, pages, key, pg[i], page_guard), key, ckv_off, kpe_off);
        const uint32_t dst = stage + tile_offset<W::kTokens>(row, gather_part) +
                             half * 4 * W::kKvBlockBytes;
        const __nv_bfloat16* src = ckv + ckv_off + half * 256 + gather_part * 8;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          prefill::cp_async_16(dst + b * W::kKvBlockBytes, src + b * 64);
        }
        if (half == 0) {
          prefill::cp_async_16(
              stage + 8 * W::kKvBlockBytes + tile_offset<W::kTokens>(row, gather_part),
              kpe + kpe_off + gather_part * 8);
        }
      }
      mbarrier_arrive_cp_async(bar_full + 8 * (t % W::kStages));
    };

    int pg_next[2] = {0, 0};  // pages of the next tile to load
    // Tiles 0..2 into stages 0..2 now; 3 and 4 once WG 0 has taken Q out of their stages.
    const int first_loads = min(num_tiles, W::kQStage);
    if (num_tiles > 0) tile_pages(0, pg_next);
    for (int t = 0; t < first_loads; ++t) {
      int pg[2] = {pg_next[0], pg_next[1]};
      if (t + 1 < num_tiles) tile_pages(t + 1, pg_next);
      load_tile(t, pg);
    }
    // Q's copies were committed as a group before these (which are tracked by the mbarriers, in
    // no group): wait_group 0 waits for Q alone.
    cp_async_wait<0>();
    named_barrier_sync(3, W::kThreads);  // (1) Q landed (every thread's copies)
    named_barrier_sync(1, W::kThreads);  // (2) stages 3, 4 free
    for (int t = W::kQStage; t < min(num_tiles, W::kStages); ++t) {
      int pg[2] = {pg_next[0], pg_next[1]};
      if (t + 1 < num_tiles) tile_pages(t + 1, pg_next);
      load_tile(t, pg);
    }

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    for (int t = 0; t < num_tiles; ++t) {
      const int b = t & 1;
      mbarrier_wait(bar_pfull + 8 * b, (t >> 1) & 1);  // P of tile t (its S read the stage)
      if (s_moved[b * 4 + warp] != 0) {
        const float a0 = s_alpha[b * W::kRows + warp * 16 + (lane >> 2)];
        const float a1 = s_alpha[b * W::kRows + warp * 16 + (lane >> 2) + 8];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a1 : a0;
      }
      const uint64_t a_desc = descriptor(s_p + b * W::kPBytes, 16, 1024);
      const uint64_t v_desc =
          descriptor(stage_of(t) + half * 4 * W::kKvBlockBytes, W::kKvBlockBytes, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        ss_m64n256k16_bf16(o, a_desc + ((kk * 32) >> 4), v_desc + ((kk * 16 * 128) >> 4));
      }
      wgmma_commit();
      wgmma_wait<0>();  // P V of tile t: P buffer t % 2 and this warpgroup's part of the stage
      fence_registers(o);
      // Every thread arrives (its reads of the row factors are done): one lane per warp after a
      // __syncwarp would be enough, but racecheck orders only each arriving thread's accesses.
      mbarrier_arrive(bar_pempty + 8 * b);
      const int next = t + W::kStages;  // into the stage of tile t
      if (next < num_tiles) {
        int pg[2] = {pg_next[0], pg_next[1]};
        if (next + 1 < num_tiles) tile_pages(next + 1, pg_next);
        load_tile(next, pg);
      }
    }
    named_barrier_sync(2, W::kThreads);  // (3) WG 0's statistics; every gatherer's s_bad_page
    const bool bad_page = *s_bad_page != 0;
    if (bad_page) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + 8 * h;
      const int row = row0 + r;
      if (row >= num_rows || (split && row >= p.partial_rows)) continue;
      const float l = bad_page ? 0.0f : s_stats[W::kRows + r];
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      if (bad_page && half == 0 && (lane & 3) == 0) {  // over WG 0's lse (before barrier (3))
        if (float* slot = lse_slot(p, work, row)) *slot = split ? poisoned_partial() : -INFINITY;
      }
      store_row<32>(p, work, row, half * 256 + 2 * (lane & 3), inv,
                    [&](int j) { return make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]); });
    }
    if (bad_page && t_in_wg == 0 && half == 0) {
      report_noted_page(p.guard, request, page_guard.note);
    }
  }
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cu)
#endif
}

}  // namespace pagedattn::cuda::mla::sm90ws
