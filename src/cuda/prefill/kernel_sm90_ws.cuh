// Batch prefill / extend on Hopper (sm_90a), warp-specialized: the work split, masking, K/V gather
// and output contract of kernel.cuh and kernel_sm90.cuh, for head dim 128 or 64 (qk = vo) over a
// bf16 or f16 cache, in CTAs of 128 packed query rows and 128-key tiles.
//
// Three warpgroups with their own jobs, meeting only at mbarriers:
//   WG 0 (gather)    translates each tile's key positions into pool offsets (key_offsets: one key a
//                    thread, the page table read and checked there) and gathers Q once and then K
//                    and V tile by tile with cp.async into two stages each, running up to two
//                    tiles ahead of the math; it keeps 40 registers (setmaxnreg);
//   WG 1, WG 2       own query rows 0..63 and 64..127 of the CTA: S = Q K^T (m64n128k16, both
//   (math)           operands in shared memory), the online softmax in registers, O += P V
//                    (m64n128k16, P from registers), and the epilogue of kernel_sm90.cuh; 232
//                    registers each. With kPingPong the two take turns at the tensor cores: a
//                    warpgroup issues a tile's products only after the other has issued its own,
//                    so one's softmax runs beside the other's products (FlashAttention-3's
//                    ping-pong schedule).
// Barriers (shared::cta mbarriers): q_full (128 arrivals: the gatherers' cp.async), k_full[s],
// v_full[s] (128, cp.async.mbarrier.arrive as each gatherer's copies land), k_empty[s],
// v_empty[s] (256: every math thread once its product that read the stage has completed).
// Named barriers: 1 (the gatherers, 128: a tile's offsets written), 2 and 3 (the turns, 256), 4
// (every thread, after the key loop).
// Shared memory: Q [128 x D], K and V [2 stages][128 x D] (wgmma's 128-byte swizzle, as in
// kernel_sm90.cuh), the offsets of two tiles, the barriers: 165 KiB at D = 128; one CTA per SM
// (the registers: 384 threads x 168).
// A page id outside the pool (key_offsets) sets the CTA's flag; after the closing CTA barrier the
// math warpgroups write their rows as 0 / -inf (a poisoned partial when split), as kernel.cuh.
#pragma once

#include "cuda/prefill/kernel_sm90.cuh"

namespace pagedattn::cuda::prefill::sm90ws {

using namespace pagedattn::cuda::prefill::sm90;  // wgmma, descriptors, tiles, mbarriers

template <int kHeadDimQkVo>
struct WsConfig {
  static constexpr int kThreads = 384;  // three warpgroups
  static constexpr int kHeadDim = kHeadDimQkVo;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "S and P V take one or two 64-column blocks");
  static constexpr int kBlockM = 128;  // two math warpgroups of 64 rows
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static constexpr int kBlockBytes = 128 * 128;  // one 64-column block of a 128-row tile
  static constexpr int kTileBytes = kHeadDim / 64 * kBlockBytes;  // 32 KiB at head dim 128
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kTileBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kOffsets = kV + kStages * kTileBytes;  // int64 [stage][K | V][kBlockN]
  static constexpr int kBars = kOffsets + kStages * 2 * kBlockN * 8;
  static constexpr int kNumBars = 1 + 4 * kStages;  // q_full, k_full, v_full, k_empty, v_empty
  static constexpr int kBytes = kBars + kNumBars * 8;
  static constexpr int kSmemBytes = kBytes + 1024;  // aligned up to 1024 inside the kernel
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
  // setmaxnreg: the launch's 65536 / 384 = 168 registers a thread, moved to the math warpgroups
  // (.inc takes only what .dec released: the sum must stay within 3 x 168).
  static constexpr int kGatherRegs = 40, kMathRegs = 232;
  static_assert(kGatherRegs + 2 * kMathRegs <= 3 * (65536 / kThreads / 8 * 8));
};

template <class T, int kHeadDim, bool kPingPong>
__global__ void __launch_bounds__(WsConfig<kHeadDim>::kThreads, 1)
    prefill_kernel_sm90_ws(const __grid_constant__ PrefillParams p) {
  pdl_wait();  // first (cuda/launch.h)
  pdl_trigger();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WsConfig<kHeadDim>;
  constexpr int kD = C::kHeadDim;
  constexpr int kBlockN = C::kBlockN;
  constexpr int kSRegs = kBlockN / 2;  // 64 x kBlockN f32 over 128 threads
  constexpr int kORegs = kD / 2;       // 64 x D

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t base = aligned_smem(smem_raw, smem);
  const uint32_t s_q = base + C::kQ;
  int64_t* s_off = reinterpret_cast<int64_t*>(smem + C::kOffsets);
  const uint32_t bar_q = base + C::kBars;
  auto bar = [&](int kind,
                 int stage) -> uint32_t {  // kind 0 k_full, 1 v_full, 2 k_empty, 3 v_empty
    return bar_q + 8 * (1 + kind * C::kStages + stage);
  };
  auto k_tile = [&](int stage) -> uint32_t { return base + C::kK + stage * C::kTileBytes; };
  auto v_tile = [&](int stage) -> uint32_t { return base + C::kV + stage * C::kTileBytes; };

  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  int request, tile;
  if (!find_tile<C::kBlockM, C::kThreads>(p, static_cast<int>(blockIdx.x / p.num_kv_heads), request,
                                          tile)) {
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;
  const int g = p.group_size;
  const int q_begin = p.qo_indptr[request];
  const int q_len = p.qo_indptr[request + 1] - q_begin;
  const int num_rows = q_len * g;
  const int row0 = tile * C::kBlockM;
  const RequestKv request_keys = request_kv(p, request, q_len);  // checked (kernel.cuh)
  const int kv_len = request_keys.kv_len;
  const int32_t* pages = request_keys.pages;
  const int pos_shift = kv_len - q_len;
  const int first_pos = pos_shift + row0 / g;
  const int last_pos = pos_shift + (min(row0 + C::kBlockM, num_rows) - 1) / g;
  const KeyRange range =
      split_range(p, p.window_left >= 0 ? max(0, first_pos - p.window_left) / kBlockN * kBlockN : 0,
                  p.causal ? min(kv_len, last_pos + 1) : kv_len, kv_len);
  const int cta_lo = range.lo, cta_hi = range.hi, key_end = range.end;
  const int num_blocks = cta_hi > cta_lo ? (cta_hi - cta_lo + kBlockN - 1) / kBlockN : 0;

  // Named barriers: 1 the gatherers' offsets, kTurn + w warpgroup w's turn, kClose all threads at
  // the end (barrier.sync, not __syncthreads: the roles reach it at different instructions).
  constexpr int kTurn = 2, kClose = 4;
  if (tid == 0) {
    mbarrier_init(bar_q, 128);
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(bar(0, s), 128);
      mbarrier_init(bar(1, s), 128);
      mbarrier_init(bar(2, s), 256);
      mbarrier_init(bar(3, s), 256);
    }
  }
  __syncthreads();  // the barriers are initialised

  if (wg == 0) {
    // ---- gather ----
    regs_decrease<C::kGatherRegs>();
    if (num_blocks > 0) {
      load_q_rows<T, C::kBlockM, kD>(p, s_q, row0, num_rows, q_begin, kv_head);
      mbarrier_arrive_cp_async(bar_q);
      const T* k_base = static_cast<const T*>(p.k) + kv_head * p.k_stride_head;
      const T* v_base = static_cast<const T*>(p.v) + kv_head * p.v_stride_head;
      for (int t = 0; t < num_blocks; ++t) {
        const int s = t % C::kStages;
        const uint32_t parity = ((t / C::kStages) & 1) ^ 1;  // a fresh barrier passes parity 1
        int64_t* offsets = s_off + s * 2 * kBlockN;
        // Tile t - 2's copies, which read these offsets, were issued before barrier 1 of t - 1.
        key_offsets<T>(p, pages, kv_len, cta_lo + t * kBlockN, offsets, offsets + kBlockN);
        named_barrier_sync(1, 128);
        mbarrier_wait(bar(2, s), parity);  // both math warpgroups are done with K of tile t - 2
        load_tile<kD / 8, kBlockN>(k_tile(s), k_base, offsets);
        mbarrier_arrive_cp_async(bar(0, s));
        mbarrier_wait(bar(3, s), parity);  // ... and with V of tile t - 2
        load_tile<kD / 8, kBlockN>(v_tile(s), v_base, offsets + kBlockN);
        mbarrier_arrive_cp_async(bar(1, s));
      }
    }
    named_barrier_sync(kClose, C::kThreads);  // every gatherer's page-fault flag, for the epilogue
    return;
  }

  // ---- math: warpgroup mw owns rows 64 mw .. 64 mw + 63 of the CTA ----
  regs_increase<C::kMathRegs>();
  const int mw = wg - 1;
  const int t_in_wg = tid & 127;
  const int lane = tid & 31, warp = t_in_wg >> 5;
  const int wg_row0 = row0 + 64 * mw;
  int row_pos[2];  // this thread's rows: 16 * warp + lane / 4 (+ 8) of the warpgroup
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg_row0 + warp * 16 + (lane >> 2) + h * 8;
    row_pos[h] = pos_shift + min(row, num_rows - 1) / g;
  }
  const int wg_first_pos = pos_shift + min(wg_row0, num_rows - 1) / g;
  const int wg_last_pos = pos_shift + (min(wg_row0 + 64, num_rows) - 1) / g;

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const uint32_t q_rows = s_q + mw * 64 * 128;  // 64-row A operand: 8 KiB into each block

  // The steps of one tile t (stage t % 2, phase t / 2).
  auto stage = [](int t) { return t % C::kStages; };
  auto phase = [](int t) { return static_cast<uint32_t>((t / C::kStages) & 1); };
  auto wait_k = [&](int t) {
    mbarrier_wait(bar(0, stage(t)), phase(t));  // K of tile t landed
    fence_proxy_async();                        // ... visible to the tensor cores' reads
  };
  auto wait_v = [&](int t) {
    mbarrier_wait(bar(1, stage(t)), phase(t));
    fence_proxy_async();
  };
  auto issue_s = [&](int t, float(&sc)[kSRegs]) {  // S = Q K_t^T, uncommitted
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const uint32_t column = (ks & 3) * 32;
      const uint64_t a = descriptor(q_rows + (ks >> 2) * C::kBlockBytes + column, 16, 1024);
      const uint64_t b =
          descriptor(k_tile(stage(t)) + (ks >> 2) * C::kBlockBytes + column, 16, 1024);
      Ops<T>::qk(sc, a, b, ks > 0 ? 1 : 0);
    }
  };
  auto issue_pv = [&](int t, const uint32_t(&pa)[kBlockN / 16][4]) {  // O += P V_t, uncommitted
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      Ops<T>::pv(o, pa[kk], descriptor(v_tile(stage(t)) + kk * 16 * 128, C::kBlockBytes, 1024));
    }
  };
  // The turns (kPingPong): warpgroup mw waits for its turn before it issues a tile's products and
  // hands the turn over once they are issued; warpgroup 1 hands it over once before its first
  // tile, so it skips its last hand-over and every wait meets exactly one arrival.
  auto take_turn = [&]() {
    if constexpr (kPingPong) named_barrier_sync(kTurn + mw, 256);
  };
  auto pass_turn = [&](int t) {
    if constexpr (kPingPong) {
      if (mw == 0 || t + 1 < num_blocks) named_barrier_arrive(kTurn + (mw ^ 1), 256);
    }
  };
  if (num_blocks > 0) {
    mbarrier_wait(bar_q, 0);
    if (kPingPong && mw == 1) named_barrier_arrive(kTurn, 256);  // warpgroup 0 goes first
  }
  // Each tile in order: S, softmax, P V.
  for (int t = 0; t < num_blocks; ++t) {
    float sc[kSRegs];
    wait_k(t);
    take_turn();
    wgmma_fence();
    issue_s(t, sc);
    wgmma_commit();
    pass_turn(t);
    wgmma_wait_all();
    fence_registers(sc);
    mbarrier_arrive(bar(2, stage(t)));  // this warpgroup is done with K of tile t
    float alpha[2];
    if (softmax_tile<kBlockN>(p, sc, cta_lo + t * kBlockN, cta_hi, key_end, wg_first_pos,
                              wg_last_pos, row_pos, row_max, row_sum, alpha)) {
#pragma unroll
      for (int i = 0; i < kORegs; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    uint32_t pa[kBlockN / 16][4];
    pack_p<T, kBlockN>(sc, pa);
    wait_v(t);
    wgmma_fence();
    issue_pv(t, pa);
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(o);
    mbarrier_arrive(bar(3, stage(t)));  // ... and with V of tile t
  }
  named_barrier_sync(kClose, C::kThreads);  // the gatherers' page-fault flag (key_offsets)

  // A page id outside the pool: the rows get 0 / -inf (a poisoned partial when split).
  const bool bad_page = cta_met_bad_page();
  write_rows<T, kD>(p, o, row_sum, row_max, wg_row0, num_rows, q_begin, kv_head, 1.0f, bad_page);
  if (bad_page && tid == 128) report_cta_bad_page(p, request);
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cuh)
#endif
}

}  // namespace pagedattn::cuda::prefill::sm90ws
