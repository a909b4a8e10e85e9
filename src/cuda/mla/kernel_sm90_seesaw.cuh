// The two-sided Hopper (sm_90a) MLA kernel for blocks of 64 request rows: 64-token tiles, Q in
// shared memory, O split by columns between two math warpgroups that take the tiles' S in turn.
// Same work split, masking, gather and output contract as kernel.cuh and kernel_sm90_ws.cuh (one
// CTA per row block and work item of the split-KV partition, partials for split requests), bf16
// cache.
//
// Why: the warp-specialized kernel's softmax warpgroup computes every tile's S alone, 36 wgmmas
// of m64n32k16 with A from registers, and at 32 tokens a tile those issue no faster than ~22
// cycles each: the tensor cores wait on one warpgroup's issue and on its softmax. Here a tile is
// 64 tokens (m64n64k16, both operands in shared memory: 32 cycles of work a step) and the two
// warpgroups that own O's halves compute S of alternate tiles, so each one's softmax runs while the
// other's products keep the tensor cores busy.
//
// Roles (384 threads):
//   WG 0 (gather)  fills two 64-token stages, one group of columns at a time as the math
//                  warpgroups release them: the rope block (released by the S that read it),
//                  columns 0..255 (released by the left warpgroup's P V), 256..511 (the right's);
//                  a whole tile on one page (P a multiple of 64, launch.cu's tensor maps) by the
//                  copy engine (one box of 64 tokens x 64 columns a block, issued by one thread),
//                  any other tile with cp.async (8 threads a 128-byte row);
//   WG 1 (left)    O[:, 0..255]; S of even tiles;
//   WG 2 (right)   O[:, 256..511]; S of odd tiles.
// A pair of tiles (t0 = 2 i, t1 = 2 i + 1), with m the running reference max both sides hold:
//   left:  S0 = Q K0^T; m0 = ref(m, max S0) -> shared; P0 = 2^(S0 - m0); O_L = O_L a0 + P0 V0_L
//          (P0 from registers); then, with m1 from the right, P0 a1 -> shared (the right's
//          P0 V0_R) and O_L = O_L a1 + P1 V1_L (P1 from shared memory);
//   right: S1 = Q K1^T; with m0: m1 = ref(m0, max S1) -> shared; P1 = 2^(S1 - m1);
//          O_R = O_R a0 a1 + P1 V1_R (registers), then O_R += (P0 a1) V0_R, then P1 -> shared;
// where a0 = 2^(m - m0), a1 = 2^(m0 - m1): the online softmax over the two tiles, in base 2 with
// kernel.cuh's lazy reference (it moves only past kRescaleSlack). Each side keeps its part of the
// row sums, rescaled alike (l_L = (l_L a0 + sum P0) a1, l_R = l_R a0 a1 + sum P1), added at the
// end. One P buffer serves both directions: P0 is read before P1 is written, and P1 before the
// next pair's P0.
//
// Memory (one CTA an SM): Q 72 KiB (nine 64-column blocks of 64 rows x 128 bytes, wgmma's 128-byte
// swizzle), two stages of 72 KiB (the same layout, 64 tokens), P 8 KiB, the exchanged maxima, the
// row sums, mbarriers. Barriers: full[s][g] (128 gather threads' arrivals: cp.async's, or 127 plain
// ones and the copy engine's issuer's with the group's bytes as its transaction count) and
// empty[s][g] (the 128 threads of the warpgroup that releases group g) per stage s and column group
// g; one mbarrier per exchange between the math warpgroups (m0, m1, P0, P1: 128 arrivals, every
// thread of the writing side, phase = pair % 2; named barriers' arrive / sync pairs here were
// reported as races by racecheck). Registers: setmaxnreg moves the CTA's 3 x 168 per thread to 56
// (gather) + 2 x 224, with no spills (ptxas).
// Tokens past the range re-read the last one (real data, masked). A gatherer that meets a page id
// outside the pool sets a shared flag; after the last barrier the block's rows are written as 0
// and its lse as -inf, or poisoned for a split request (kernel.cuh).
#pragma once

#include "cuda/mla/kernel.cuh"
#include "cuda/mla/wgmma.cuh"

namespace pagedattn::cuda::mla::seesaw {

using namespace pagedattn::cuda::mla::sm90;  // NOLINT: wgmma.cuh (shapes, mbarriers, setmaxnreg)
using prefill::sm90::pack_p;
using prefill::sm90::rs_m64n256k16_bf16;
using prefill::sm90::ss_m64n64k16_bf16;

struct Layout {
  static constexpr int kThreads = 384;  // three warpgroups
  static constexpr int kRows = 64;
  static constexpr int kTokens = 64;
  static constexpr int kBlocks = kDimQk / 64;   // 9 column blocks (8 latent + 1 rope)
  static constexpr int kBlockBytes = 64 * 128;  // one 64-column block of 64 rows / tokens
  static constexpr int kTileBytes = kBlocks * kBlockBytes;
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + kTileBytes;         // two stages
  static constexpr int kP = kKv + 2 * kTileBytes;     // bf16 [64 rows][64 tokens], swizzled
  static constexpr int kMax = kP + kRows * 128;       // f32 [m0 | m1][64]
  static constexpr int kSum = kMax + 2 * kRows * 4;   // f32 [left | right][64]
  static constexpr int kBars = kSum + 2 * kRows * 4;  // u64 full[2][3], empty[2][3], m0 m1 p0 p1
  static constexpr int kNote = kBars + (2 * 2 * 3 + 4) * 8;  // u64: a bad page id (guard.cuh)
  static constexpr int kBadPage = kNote + 8;                 // int: a gatherer met one
  static constexpr int kBytes = kBadPage + 8;
  static constexpr int kSmemBytes = kBytes + 1024;  // aligned up to 1024 inside the kernel
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
  // Column groups of a stage, in the gather's order of each tile's use.
  static constexpr int kGroupLeft = 0;   // blocks 0..3: V columns 0..255
  static constexpr int kGroupRight = 1;  // blocks 4..7: V columns 256..511
  static constexpr int kGroupRope = 2;   // block 8
  static constexpr int kGatherRegs = 56, kMathRegs = 224;
  static_assert(kGatherRegs + 2 * kMathRegs <= 3 * (65536 / kThreads / 8 * 8));
};

// Named barriers (0 is __syncthreads): between the math warpgroups (256 threads) ...
inline constexpr int kBarQ = 1;  // Q landed (every math thread's copies)
// ... and of the whole CTA: every gather issued (s_bad_page final), both row sums written.
inline constexpr int kBarEnd = 2;
// The exchanges of a pair, mbarriers of 128 arrivals (every thread of the side that writes),
// phase = pair % 2: m0 (left -> right), m1 (right -> left), P0 and P1 in the P buffer.
inline constexpr int kXm0 = 0, kXm1 = 1, kXp0 = 2, kXp1 = 3;

__device__ __forceinline__ int group_first_block(int group) { return group * 4; }

__global__ void __launch_bounds__(Layout::kThreads, 1)
    mla_kernel_sm90_seesaw(const __grid_constant__ MlaParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout;
  constexpr int kN = L::kTokens;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t base = aligned_smem(smem_raw, smem);
  const uint32_t s_q = base + L::kQ;
  const uint32_t s_kv = base + L::kKv;
  const uint32_t s_p = base + L::kP;
  // The exchanged maxima: f32 [m0 | m1][64] at shared-window address s_max (32-bit addresses: no
  // 64-bit generic pointer held over the loop).
  const uint32_t s_max = base + L::kMax;
  auto put_max = [](uint32_t addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
  };
  auto get_max = [](uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
  };
  float* s_sum = reinterpret_cast<float*>(smem + L::kSum);
  int* s_bad_page = reinterpret_cast<int*>(smem + L::kBadPage);
  const uint32_t bar_full = base + L::kBars;            // + 8 (3 stage + group)
  const uint32_t bar_empty = bar_full + 2 * 3 * 8;      // + 8 (3 stage + group)
  const uint32_t bar_exchange = bar_empty + 2 * 3 * 8;  // + 8 kX..
  auto full = [&](int tile, int group) { return opaque(bar_full) + 8 * (3 * (tile & 1) + group); };
  auto empty = [&](int tile, int group) {
    return opaque(bar_empty) + 8 * (3 * (tile & 1) + group);
  };
  auto stage_of = [&](int tile) -> uint32_t { return s_kv + (tile & 1) * L::kTileBytes; };

  if (threadIdx.x == 0) {
    *s_bad_page = 0;
    for (int i = 0; i < 6; ++i) {
      mbarrier_init(bar_full + 8 * i, 128);
      mbarrier_init(bar_empty + 8 * i, 128);
    }
    for (int i = 0; i < 4; ++i) mbarrier_init(bar_exchange + 8 * i, 128);
  }
  __syncthreads();  // the barriers are initialised

  ItemWork work;
  if (!item_work(p, work)) return;
  const auto [item, request, split, q_begin, q_len, num_rows, kv_len, chunk_begin, chunk_end,
              pos_shift, pages] = work;
  const int H = p.num_heads;
  const int row0 = static_cast<int>(blockIdx.x) * L::kRows;
  if (row0 >= num_rows) return;
  const int block_end = row_block_end(p, work, row0, L::kRows);
  const int num_tiles = (block_end - chunk_begin + kN - 1) / kN;

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;
  const int t_in_wg = tid & 127;
  const int lane = tid & 31, warp = t_in_wg >> 5;  // warp in its warpgroup: rows 16 warp ..

  if (wg == 0) {
    // ================= gather warpgroup =================
    regs_decrease<L::kGatherRegs>();
    const auto* ckv = static_cast<const __nv_bfloat16*>(p.ckv);
    const auto* kpe = static_cast<const __nv_bfloat16*>(p.kpe);
    // A thread copies 16-byte chunk `part` of each 128-byte block row of tokens row_set + 16 i
    // (i < 4): eight threads a row, so each copy instruction of a warp reads four whole lines.
    const int part = t_in_wg & 7;
    const int row_set = t_in_wg >> 3;
    PageGuard page_guard{false, reinterpret_cast<unsigned long long*>(smem + L::kNote), s_bad_page};
    auto key_of = [&](int t, int i) {
      return min(chunk_begin + t * kN + row_set + 16 * i, block_end - 1);
    };
    int page_next[4] = {0, 0, 0, 0};
    if (num_tiles > 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) page_next[i] = load_page(p, pages, key_of(0, i));
    }
    for (int t = 0; t < num_tiles; ++t) {
      int64_t ckv_off[4], kpe_off[4];
      int page0 = 0;  // the checked id of this thread's first token (key_of(t, 0))
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = key_of(t, i);
        const int page = checked_page(p, pages, key, page_next[i], page_guard);
        if (i == 0) page0 = page;
        latent_offsets(p, page, key, ckv_off[i], kpe_off[i]);
      }
      // The fast path (p.tma: P a multiple of 64): a whole tile of 64 tokens starting on a
      // multiple of 64, so on one page, comes in by the copy engine, a box of 64 tokens x 64
      // columns a block, issued by thread 0 (whose first token is the tile's first); the other
      // gatherers only arrive. Else (the last, partial tile; a KV chunk not 64-aligned) cp.async.
      const int key0 = chunk_begin + t * kN;
      const bool fast = p.tma != 0 && (key0 & (kN - 1)) == 0 && key0 + kN <= block_end;
      int tma_alloc = 0, tma_token = 0;  // box coordinates of the tile (thread 0)
      if (fast && t_in_wg == 0) {
        tma_alloc = page0 / p.pages_per_alloc;
        tma_token = (page0 - tma_alloc * p.pages_per_alloc) * p.page_size +
                    (key0 - page_slot(p, key0) * p.page_size);
      }
      if (t + 1 < num_tiles) {  // a tile ahead
#pragma unroll
        for (int i = 0; i < 4; ++i) page_next[i] = load_page(p, pages, key_of(t + 1, i));
      }
      const uint32_t stage = stage_of(t);
      // The order of the tile's use: rope first (the S of either side starts there), then the
      // group the previous tile of this stage released first (the S side's own P V).
      const int second = (t & 1) == 0 ? L::kGroupLeft : L::kGroupRight;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        const int group = g == 0 ? L::kGroupRope : g == 1 ? second : 1 - second;
        if (t >= 2) mbarrier_wait(empty(t, group), ((t >> 1) - 1) & 1);
        if (fast) {
          if (t_in_wg == 0) {
            // This stage's earlier contents came by cp.async (generic proxy) in some tiles: order
            // those writes before the copy engine's.
            fence_proxy_async();
            const bool rope = group == L::kGroupRope;  // block 8, from kpe; else 4 of ckv
            const int block0 = rope ? 8 : group_first_block(group);
            const int blocks = rope ? 1 : 4;
            mbarrier_arrive_expect_tx(full(t, group), blocks * L::kBlockBytes);
            for (int b = block0; b < block0 + blocks; ++b) {
              tma_load_3d(stage + b * L::kBlockBytes, rope ? p.tma_kpe : p.tma_ckv,
                          rope ? 0 : 64 * b, tma_token, tma_alloc, full(t, group));
            }
          } else {
            mbarrier_arrive(full(t, group));
          }
          continue;
        }
        if (group == L::kGroupRope) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            prefill::cp_async_16(stage + tile_offset<kN>(row_set + 16 * i, 8 * 8 + part),
                                 kpe + kpe_off[i] + part * 8);
          }
        } else {
          const int block0 = group_first_block(group);
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int chunk = 8 * (block0 + b) + part;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              prefill::cp_async_16(stage + tile_offset<kN>(row_set + 16 * i, chunk),
                                   ckv + ckv_off[i] + chunk * 8);
            }
          }
        }
        mbarrier_arrive_cp_async(full(t, group));
      }
    }
    // Every copy landed before the thread leaves (the mbarriers count its arrivals on them).
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    named_barrier_arrive(kBarEnd, L::kThreads);
    return;
  }

  // ================= math warpgroups =================
  regs_increase<L::kMathRegs>();
  const int side = wg - 1;  // 0: left (O columns 0..255, even tiles), 1: right (256.., odd)
  // Q rows (zero past the request's rows), every math thread a share.
  for (int i = tid - 128; i < L::kRows * (kDimQk / 8); i += 256) {
    const int r = i / (kDimQk / 8);
    const int c = i - r * (kDimQk / 8);
    int bytes;
    const __nv_bfloat16* src = q_chunk(p, work, row0 + r, c, bytes);
    prefill::cp_async_16(s_q + tile_offset<L::kRows>(r, c), src, bytes);
  }
  prefill::cp_async_commit();
  const float scale_log2 = p.scale_log2;
  cp_async_wait<0>();
  fence_proxy_async();
  named_barrier_sync(kBarQ, 256);  // Q landed, visible to the tensor cores

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float ref[2] = {-INFINITY, -INFINITY};  // the running reference max (log2 units), both sides
  float sum[2] = {0.0f, 0.0f};            // this side's part of the row sums
  // Descriptors made where used from an opaque copy of the base (kernel.cuh: not hoisted into
  // registers for the whole loop, where the math warpgroups have none to spare).
  auto q_descriptor = [&] { return descriptor(opaque(s_q), 16, 1024); };
  auto p_descriptor = [&] { return descriptor(opaque(s_p), 16, 1024); };
  const uint32_t v_half = side * 4 * L::kBlockBytes;  // this side's V columns in a stage

  // S of tile t (this side's turn) into s, one column group at a time as the gather lands it.
  auto compute_s = [&](float(&s)[32], int t) {
    const uint32_t stage = stage_of(t);
    const uint64_t k_desc = descriptor(stage, 16, 1024);
    const uint64_t q_desc = q_descriptor();
    const int second = side == 0 ? L::kGroupLeft : L::kGroupRight;
    mbarrier_wait(full(t, L::kGroupRope), (t >> 1) & 1);
    fence_proxy_async();
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = 8 * L::kBlockBytes + k * 32;
      ss_m64n64k16_bf16(s, q_desc + (off >> 4), k_desc + (off >> 4), k > 0 ? 1 : 0);
    }
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int group = g == 0 ? second : 1 - second;
      mbarrier_wait(full(t, group), (t >> 1) & 1);
      fence_proxy_async();
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const uint32_t off =
            group_first_block(group) * L::kBlockBytes + (k >> 2) * L::kBlockBytes + (k & 3) * 32;
        ss_m64n64k16_bf16(s, q_desc + (off >> 4), k_desc + (off >> 4), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);
    mbarrier_arrive(empty(t, L::kGroupRope));
    // Masked keys -> -inf (key 8 j + 2 (lane % 4) + e of element 4 j + 2 h + e, row h).
    const int n0 = chunk_begin + t * kN;
    // (Rarely taken: the row limits are worked out here, not kept in registers.)
    if (n0 + kN > block_end || (p.causal && n0 + kN - 1 > pos_shift + row0 / H)) {
      int limit[2];  // rows 16 warp + lane / 4 (+ 8): last visible key
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(row0 + warp * 16 + (lane >> 2) + 8 * h, num_rows - 1);
        limit[h] = p.causal ? pos_shift + row / H : kv_len - 1;
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int key = n0 + (i >> 2) * 8 + 2 * (lane & 3) + (i & 1);
        if (key >= block_end || key > limit[(i >> 1) & 1]) s[i] = -INFINITY;
      }
    }
  };
  // The reference after tile S (log2 units): moves to the rows' new max only past the slack
  // (kernel.cuh's phases 1 and 2).
  auto new_reference = [&](const float(&s)[32], const float(&from)[2], float(&to)[2]) {
    float m[2];
    softmax_local_max(s, scale_log2, m);
#pragma unroll
    for (int h = 0; h < 2; ++h) to[h] = quad_reference(m[h], from[h]);
  };
  auto use_of = [](float m) { return m == -INFINITY ? 0.0f : m; };  // nothing seen yet
  // P = 2^(S scale - m_use) in place; returns nothing, adds the rows' sums into `add`.
  auto exponentiate = [&](float(&s)[32], const float(&m)[2], float(&add)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) add[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = fast_exp2(fmaf(s[i], scale_log2, -use_of(m[h])));
      add[h] += s[i];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      add[h] += __shfl_xor_sync(0xffffffffu, add[h], 1);
      add[h] += __shfl_xor_sync(0xffffffffu, add[h], 2);
    }
  };
  auto rescale_o = [&](const float(&a)[2]) {
    const bool any = __any_sync(0xffffffffu, a[0] != 1.0f || a[1] != 1.0f);
    if (any) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a[1] : a[0];
    }
  };
  // P (bf16 A fragments: pack_p's layout, pa[kk][2 c + h] holds row h, keys 16 kk + 8 c + ..)
  // times a[h] into the P buffer (swizzled 128-byte rows), for the other side's tensor cores.
  // (A factor other than 1 rounds P twice; it is 1 unless a row's reference moved.)
  auto store_p = [&](const uint32_t(&pa)[4][4], const float(&a)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + 8 * h;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t addr = s_p + r * 128 + ((j ^ (r & 7)) << 4) + 4 * (lane & 3);
        uint32_t v = pa[j >> 1][2 * (j & 1) + h];
        if (a[h] != 1.0f) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
          v = Bf16Mma::pack(f.x * a[h], f.y * a[h]);
        }
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
      }
    }
    fence_proxy_async();
  };
  auto row_of = [&](int h) { return warp * 16 + (lane >> 2) + 8 * h; };
  auto v_desc = [&](int t) { return descriptor(stage_of(t) + v_half, L::kBlockBytes, 1024); };

  // O += P V_side of tile t as one wgmma group (committed, not waited for): P from registers (this
  // side's own S) or from the P buffer (the other side's).
  auto pv_from_registers = [&](const uint32_t(&pa)[4][4], int t) {
    const uint64_t vd = v_desc(t);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) rs_m64n256k16_bf16(o, pa[kk], vd + ((kk * 16 * 128) >> 4));
    wgmma_commit();
  };
  auto pv_from_buffer = [&](int t) {
    const uint64_t vd = v_desc(t);
    const uint64_t p_desc = p_descriptor();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ss_m64n256k16_bf16(o, p_desc + ((kk * 32) >> 4), vd + ((kk * 16 * 128) >> 4));
    }
    wgmma_commit();
  };

  // ---------- left: S0, P0 V0_L, P0 a1 -> right, P1 V1_L ----------
  auto left_pair = [&](int t0) {
    const int t1 = t0 + 1;
    const bool has1 = t1 < num_tiles;
    float s[32];
    float m0[2], m1[2], a0[2], a1[2], add[2];
    compute_s(s, t0);
    new_reference(s, ref, m0);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) put_max(opaque(s_max) + 4 * row_of(h), m0[h]);
    }
    mbarrier_arrive(bar_exchange + 8 * kXm0);
    exponentiate(s, m0, add);
#pragma unroll
    for (int h = 0; h < 2; ++h) a0[h] = fast_exp2(ref[h] - use_of(m0[h]));
    rescale_o(a0);
    uint32_t pa[4][4];
    pack_p<__nv_bfloat16, kN>(s, pa);
    pv_from_registers(pa, t0);
    if (has1) {
      mbarrier_wait(bar_exchange + 8 * kXm1, (t0 >> 1) & 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) m1[h] = get_max(opaque(s_max) + 4 * (L::kRows + row_of(h)));
    } else {
      m1[0] = m0[0];
      m1[1] = m0[1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a1[h] = fast_exp2(m0[h] - use_of(m1[h]));
      sum[h] = (sum[h] * a0[h] + add[h]) * a1[h];
    }
    // The P buffer last held P1 of the previous pair, read by this side's P V (waited for).
    store_p(pa, a1);
    mbarrier_arrive(bar_exchange + 8 * kXp0);
    wgmma_wait<0>();
    fence_registers(o);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) fence_registers(pa[kk]);
    mbarrier_arrive(empty(t0, L::kGroupLeft));
    rescale_o(a1);
    if (has1) {
      mbarrier_wait(bar_exchange + 8 * kXp1, (t0 >> 1) & 1);
      pv_from_buffer(t1);
      wgmma_wait<0>();
      fence_registers(o);
      mbarrier_arrive(empty(t1, L::kGroupLeft));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) ref[h] = m1[h];
  };
  // ---------- right: S1, P1 V1_R, (P0 a1) V0_R, P1 -> left ----------
  auto right_pair = [&](int t0) {
    const int t1 = t0 + 1;
    const bool has1 = t1 < num_tiles;
    float s[32];
    float m0[2], m1[2], a0[2], a1[2], add[2];
    if (has1) compute_s(s, t1);
    mbarrier_wait(bar_exchange + 8 * kXm0, (t0 >> 1) & 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) m0[h] = get_max(opaque(s_max) + 4 * row_of(h));
    if (has1) {
      new_reference(s, m0, m1);
      if ((lane & 3) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) put_max(opaque(s_max) + 4 * (L::kRows + row_of(h)), m1[h]);
      }
      mbarrier_arrive(bar_exchange + 8 * kXm1);
      exponentiate(s, m1, add);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m1[h] = m0[h];
        add[h] = 0.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a0[h] = fast_exp2(ref[h] - use_of(m0[h]));
      a1[h] = fast_exp2(m0[h] - use_of(m1[h]));
      a0[h] *= a1[h];  // O_R and l_R take both
      sum[h] = sum[h] * a0[h] + add[h];
    }
    rescale_o(a0);
    uint32_t pa[4][4];
    if (has1) {
      pack_p<__nv_bfloat16, kN>(s, pa);
      pv_from_registers(pa, t1);
    }
    mbarrier_wait(bar_exchange + 8 * kXp0, (t0 >> 1) & 1);
    fence_proxy_async();
    pv_from_buffer(t0);
    if (has1) {
      wgmma_wait<1>();  // P1 V1_R (groups complete in order)
      mbarrier_arrive(empty(t1, L::kGroupRight));
    }
    wgmma_wait<0>();
    fence_registers(o);
    mbarrier_arrive(empty(t0, L::kGroupRight));
    if (has1) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) fence_registers(pa[kk]);
      const float one[2] = {1.0f, 1.0f};
      store_p(pa, one);  // P1 for the left side (P0 is read: the wait above)
      mbarrier_arrive(bar_exchange + 8 * kXp1);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) ref[h] = m1[h];
  };
  if (side == 0) {
    for (int t0 = 0; t0 < num_tiles; t0 += 2) left_pair(t0);
  } else {
    for (int t0 = 0; t0 < num_tiles; t0 += 2) right_pair(t0);
  }

  // Both sides' row sums; the left side writes lse.
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) s_sum[side * L::kRows + row_of(h)] = sum[h];
  }
  // Every gather issued (s_bad_page final) and both sides' sums written.
  named_barrier_sync(kBarEnd, L::kThreads);
  const bool bad_page = *s_bad_page != 0;
  if (bad_page) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_of(h);
    const int row = row0 + r;
    if (row >= num_rows || (split && row >= p.partial_rows)) continue;
    const float l = s_sum[r] + s_sum[L::kRows + r];
    const float inv = !bad_page && l > 0.0f ? p.out_scale / l : 0.0f;
    if (side == 0 && (lane & 3) == 0) {
      if (float* slot = lse_slot(p, work, row)) {
        *slot = bad_page ? (split ? poisoned_partial() : -INFINITY)
                         : (l > 0.0f ? (ref[h] + __log2f(l)) * kLn2 : -INFINITY);
      }
    }
    store_row<32>(p, work, row, side * 256 + 2 * (lane & 3), inv,
                  [&](int j) { return make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]); });
  }
  if (bad_page && t_in_wg == 0 && side == 0) {
    report_noted_page(p.guard, request, reinterpret_cast<unsigned long long*>(smem + L::kNote));
  }
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cu)
#endif
}

}  // namespace pagedattn::cuda::mla::seesaw
