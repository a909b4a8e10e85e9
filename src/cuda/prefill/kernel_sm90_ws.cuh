// Batch prefill / extend on Hopper (sm_90a), warp-specialized: the work split, masking, K/V gather
// and output contract of kernel.cuh and kernel_sm90.cuh, for head dim 128 or 64 (qk = vo) over a
// bf16 or f16 cache, in CTAs of 128 packed query rows and 128-key tiles.
//
// Three warpgroups with their own jobs, meeting only at mbarriers:
//   WG 0 (gather)    translates each tile's key positions into pool offsets (key_offsets: one key a
//                    thread, the page table read and checked there) and gathers a unit's Q and then
//                    K and V tile by tile with cp.async into two stages each, running up to two
//                    tiles ahead of the math; it keeps 56 registers (setmaxnreg);
//   WG 1, WG 2       own query rows 0..63 and 64..127 of each unit's tile: S = Q K^T (m64n128k16,
//   (math)           both operands in shared memory), the online softmax in registers, O += P V
//                    (m64n128k16, P from registers), and the epilogue of kernel_sm90.cuh; 224
//                    registers each. With kPingPong the two take turns at the tensor cores: a
//                    warpgroup issues a tile's products only after the other has issued its own,
//                    so one's softmax runs beside the other's products (FlashAttention-3's
//                    ping-pong schedule).
// Work units (prefill_kernel_sm90_ws): a query tile of a request and a KV head, one a CTA or, in a
// persistent grid of one CTA per SM, many a CTA in turn, the gather of the next unit running
// under the last products and the epilogue of the one before.
// Barriers (shared::cta mbarriers): q_full (128 arrivals: the gatherers' cp.async), k_full[s],
// v_full[s] (128, cp.async.mbarrier.arrive as each gatherer's copies land), k_empty[s],
// v_empty[s] (256: every math thread once its product that read the stage has completed), q_empty
// (256: every math thread once the unit's last S has completed), unit[2] (128: the gatherers are
// done with a unit's page ids, so its page-fault slot is final), fetch_full[2] (1: thread 0
// wrote the next unit and its work) and fetch_empty[2] (384: every thread read it). Named
// barriers: 1 (the gatherers, 128: a tile's offsets written), 2 and 3 (the turns, 256).
// Shared memory: Q [128 x D], K and V [2 stages][128 x D] (wgmma's 128-byte swizzle, as in
// kernel_sm90.cuh), the offsets of two tiles, the output's staging rows, the barriers: 199 KiB at
// D = 128; one CTA per SM (the registers: 384 threads x 168).
// A page id outside the pool (key_offsets) sets the unit's page-fault slot; the math warpgroups
// then write the unit's rows as 0 / -inf (a poisoned partial when split), as kernel.cuh.
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
  // The output's staging rows (write_rows_staged): 16 rows a math warp, 2 x D bytes each at a
  // pitch of 2 x D + 16 (stmatrix's eight rows then fall in eight distinct bank groups).
  static constexpr int kOutPitch = 2 * kHeadDim + 16;
  static constexpr int kOut = kOffsets + kStages * 2 * kBlockN * 8;
  static constexpr int kBars = kOut + kBlockM * kOutPitch;
  // q_full, k_full, v_full, k_empty, v_empty, q_empty, a unit's page-fault slot (2), the fetched
  // unit's slot full (2) and empty (2)
  static constexpr int kNumBars = 1 + 4 * kStages + 1 + 2 + 4;
  static constexpr int kBytes = kBars + kNumBars * 8;
  static constexpr int kSmemBytes = kBytes + 1024;  // aligned up to 1024 inside the kernel
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
  // setmaxnreg: the launch's 65536 / 384 = 168 registers a thread, moved to the math warpgroups
  // (.inc takes only what .dec released: the sum must stay within 3 x 168).
  static constexpr int kGatherRegs = 56, kMathRegs = 224;
  static_assert(kGatherRegs + 2 * kMathRegs <= 3 * (65536 / kThreads / 8 * 8));
};

// Work unit `unit` (a query tile of a request and a KV head: a CTA's whole work when the grid
// has a CTA per unit), as one warp finds it (find_tile_warp, then tile_work: the same values in
// every lane); false past the last tile.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool ws_unit(const PrefillParams& p, int unit, TileWork& u) {
  int request = 0, tile = 0;
  if (!find_tile_warp<kBlockM>(p, unit / p.num_kv_heads, request, tile)) return false;
  u = tile_work<kBlockM, kBlockN>(p, request, tile, unit % p.num_kv_heads);
  return true;
}

// A math warp's 16 rows of O / l to out (and lse) through shared memory, for a unit with no KV
// split, no bad page and an output whose rows are 16-byte aligned (the caller's check): the rows
// packed to T go into the warp's staging rows with stmatrix (four 8 x 8 blocks an instruction,
// the accumulators' own layout), then are read back 16 bytes a lane and stored with coalesced
// 16-byte stores, consecutive lanes along a row. The same values as write_rows (kernel_sm90.cuh).
template <class T, int kD>
__device__ __forceinline__ void write_rows_staged(const PrefillParams& p, const float (&o)[kD / 2],
                                                  const float (&row_sum)[2],
                                                  const float (&row_max)[2], int wg_row0,
                                                  int num_rows, int q_begin, int kv_head,
                                                  uint32_t staging, int pitch) {
  const int lane = static_cast<int>(threadIdx.x & 31),
            warp = static_cast<int>(threadIdx.x >> 5) & 3;
  float l[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(row_sum[h]);
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
  __syncwarp();  // the warp is done reading its staging rows of the unit before
  // Block pair j, j + 1 (8 columns each): matrices rows 0-7 / 8-15 of block j, then of j + 1;
  // lanes 8 m .. 8 m + 7 give matrix m's row addresses.
  const int m = lane >> 3;
  const uint32_t row_addr = staging + static_cast<uint32_t>(((lane & 7) + 8 * (m & 1)) * pitch);
#pragma unroll
  for (int j = 0; j < kD / 8; j += 2) {
    const uint32_t r0 = Mma<T>::pack(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
    const uint32_t r1 = Mma<T>::pack(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]);
    const uint32_t r2 = Mma<T>::pack(o[4 * j + 4] * inv[0], o[4 * j + 5] * inv[0]);
    const uint32_t r3 = Mma<T>::pack(o[4 * j + 6] * inv[1], o[4 * j + 7] * inv[1]);
    const uint32_t addr = row_addr + static_cast<uint32_t>((j + (m >> 1)) * 16);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  }
  __syncwarp();
  // Lane l < 16: where row l goes (null past the unit's rows).
  T* row_dst = nullptr;
  if (lane < 16) {
    const int row = wg_row0 + warp * 16 + lane;
    if (row < num_rows) {
      const auto [token, head] = row_dest(row, p.group_size, kv_head);
      row_dst = static_cast<T*>(p.out) + (q_begin + token) * p.out_stride_token +
                head * p.out_stride_head;
    }
  }
  // 32 / chunks rows a step, a lane a 16-byte chunk: coalesced 16-byte stores.
  constexpr int kChunks = kD * static_cast<int>(sizeof(T)) / 16;
  constexpr int kRowsPerStep = 32 / kChunks;
  const int c = lane % kChunks;
#pragma unroll
  for (int step = 0; step < 16 / kRowsPerStep; ++step) {
    const int r = step * kRowsPerStep + lane / kChunks;
    T* dst =
        reinterpret_cast<T*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row_dst), r));
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(staging + static_cast<uint32_t>(r * pitch + c * 16)));
    if (dst != nullptr) *reinterpret_cast<uint4*>(dst + c * (16 / sizeof(T))) = v;
  }
  if (p.lse != nullptr && (lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wg_row0 + warp * 16 + (lane >> 2) + h * 8;
      if (row < num_rows)
        write_lse(p, q_begin, row_dest(row, p.group_size, kv_head), row_max[h], l[h]);
    }
  }
}

// Units: num_tiles_bound x num_kv_heads (x the KV chunks in grid.y), in the order of find_tile
// (requests in turn, each one's last, longest tiles first). Without counters (unit_counters null:
// a CTA per unit) CTA b takes unit b (b, b + grid, ... in a smaller grid). A persistent grid (a
// CTA per SM: the launcher's choice, launch.cuh) takes them in that order as its CTAs come free:
// thread 0 fetches the next from the counter; the CTA that fetches past the end last zeroes the
// counters for the next launch. Either way warp 0 looks the unit up and hands it, with its work,
// to every thread through a slot of shared memory (fetch_full / fetch_empty, two slots). Within a
// CTA the roles run unit after unit without meeting: the gatherer loads the next unit's Q once both
// math warpgroups have issued the last S of the unit before (q_empty) and its first K / V tiles as
// the stages free, while the math warpgroups still run that unit's last P V and write its rows.
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
  const uint32_t bar_q_empty = bar_q + 8 * (1 + 4 * C::kStages);
  auto bar_unit = [&](int slot) -> uint32_t { return bar_q_empty + 8 * (1 + slot); };
  auto bar_fetch_full = [&](int slot) -> uint32_t { return bar_q_empty + 8 * (3 + slot); };
  auto bar_fetch_empty = [&](int slot) -> uint32_t { return bar_q_empty + 8 * (5 + slot); };
  auto k_tile = [&](int stage) -> uint32_t { return base + C::kK + stage * C::kTileBytes; };
  auto v_tile = [&](int stage) -> uint32_t { return base + C::kV + stage * C::kTileBytes; };
  // A page id outside the pool met by the gatherers in a unit (key_offsets), per unit slot.
  __shared__ CtaPageFault faults[2];
  // The CTA's units as warp 0 fetched and looked them up (next_unit), two slots.
  struct FetchedUnit {
    TileWork work;
    int unit;   // -1 past the CTA's last
    int found;  // ws_unit's result (0: a unit past the last tile)
  };
  __shared__ FetchedUnit fetched[2];

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;
  const int g = p.group_size;
  const int units = p.num_tiles_bound * p.num_kv_heads;
  // The CTA's f-th unit, or -1 past its last, with its work (`found` false: a unit past the last
  // tile); every thread calls it for f = 0, 1, ... in turn. Warp 0 (gatherers, ahead of the math)
  // fetches the unit and looks it up (ws_unit: the request's metadata read and checked once a
  // unit, not by each role), and hands both to every thread through a slot of shared memory, so
  // the math warpgroups start a unit with no global-memory round trip.
  // Thread 0's next value of the counter, fetched a unit ahead (the atomic's round trip runs under
  // the unit before); -1: none yet.
  int prefetched = -1;
  auto next_unit = [&](int f, TileWork& u, bool& found) -> int {
    const int slot = f & 1;
    const uint32_t round = static_cast<uint32_t>((f >> 1) & 1);
    if (tid < 32) {
      if (tid == 0) mbarrier_wait(bar_fetch_empty(slot), round ^ 1);  // f - 2 read by every thread
      __syncwarp();
      int unit = -1;
      if (p.unit_counters == nullptr) {  // units b, b + grid, ... (a CTA per unit: b alone)
        const int64_t next = blockIdx.x + int64_t{f} * gridDim.x;
        unit = next < units ? static_cast<int>(next) : -1;
      } else {
        if (tid == 0) {
          unit = prefetched >= 0 ? prefetched : atomicAdd(p.unit_counters, 1);
          // The next one now, unless this one is past the end (a CTA's last fetch).
          prefetched = unit < units ? atomicAdd(p.unit_counters, 1) : -1;
          if (unit >= units &&
              atomicAdd(p.unit_counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
            // The last CTA past the end: every CTA has fetched its last, so the counters are free.
            atomicExch(p.unit_counters, 0);
            atomicExch(p.unit_counters + 1, 0);
          }
          if (unit >= units) unit = -1;
        }
        unit = __shfl_sync(0xffffffffu, unit, 0);
      }
      TileWork work{};
      const bool ok = unit >= 0 && ws_unit<C::kBlockM, kBlockN>(p, unit, work);
      if (tid == 0) {
        fetched[slot].work = work;
        fetched[slot].unit = unit;
        fetched[slot].found = ok ? 1 : 0;
        mbarrier_arrive(bar_fetch_full(slot));
      }
    }
    mbarrier_wait(bar_fetch_full(slot), round);
    const int unit = fetched[slot].unit;
    found = fetched[slot].found != 0;
    u = fetched[slot].work;
    mbarrier_arrive(bar_fetch_empty(slot));
    return unit;
  };

  // Named barriers: 1 the gatherers' offsets, kTurn + w warpgroup w's turn.
  constexpr int kTurn = 2;
  if (tid == 0) {
    mbarrier_init(bar_q, 128);
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(bar(0, s), 128);
      mbarrier_init(bar(1, s), 128);
      mbarrier_init(bar(2, s), 256);
      mbarrier_init(bar(3, s), 256);
    }
    mbarrier_init(bar_q_empty, 256);
    mbarrier_init(bar_unit(0), 128);
    mbarrier_init(bar_unit(1), 128);
    for (int slot = 0; slot < 2; ++slot) {
      mbarrier_init(bar_fetch_full(slot), 1);
      mbarrier_init(bar_fetch_empty(slot), C::kThreads);
    }
  }
  __syncthreads();  // the barriers are initialised

  // The K / V stages run over the CTA's tiles of all its units in order (tile n: stage n % 2,
  // phase n / 2); q_full, q_empty and the unit slots over its units with tiles (the k-th: Q
  // phase k % 2, slot k % 2 of phase k / 2).
  if (wg == 0) {
    // ---- gather ----
    regs_decrease<C::kGatherRegs>();
    int n = 0, k = 0;
    for (int f = 0;; ++f) {
      TileWork u;
      bool found = false;
      if (next_unit(f, u, found) < 0) break;
      if (!found || u.num_blocks == 0) continue;
      // Both math warpgroups are done with the previous unit's Q, and so with the unit before's
      // fault slot (they read it before they start the next unit).
      if (k > 0) mbarrier_wait(bar_q_empty, static_cast<uint32_t>((k - 1) & 1));
      CtaPageFault& fault = faults[k & 1];
      if (tid == 0) fault.flag = 0;
      named_barrier_sync(1, 128);  // cleared before any gatherer's key_offsets
      load_q_rows<T, C::kBlockM, kD>(p, s_q, u.row0, u.num_rows, u.q_begin, u.kv_head);
      mbarrier_arrive_cp_async(bar_q);
      const T* k_base = static_cast<const T*>(p.k) + u.kv_head * p.k_stride_head;
      const T* v_base = static_cast<const T*>(p.v) + u.kv_head * p.v_stride_head;
      for (int t = 0; t < u.num_blocks; ++t, ++n) {
        const int s = n % C::kStages;
        const uint32_t parity = ((n / C::kStages) & 1) ^ 1;  // a fresh barrier passes parity 1
        int64_t* offsets = s_off + s * 2 * kBlockN;
        // Tile n - 2's copies, which read these offsets, were issued before barrier 1 of n - 1.
        key_offsets<T>(p, u.pages, u.kv_len, u.lo + t * kBlockN, offsets, offsets + kBlockN, fault);
        named_barrier_sync(1, 128);
        mbarrier_wait(bar(2, s), parity);  // both math warpgroups are done with K of tile n - 2
        load_tile<kD / 8, kBlockN>(k_tile(s), k_base, offsets);
        mbarrier_arrive_cp_async(bar(0, s));
        mbarrier_wait(bar(3, s), parity);  // ... and with V of tile n - 2
        load_tile<kD / 8, kBlockN>(v_tile(s), v_base, offsets + kBlockN);
        mbarrier_arrive_cp_async(bar(1, s));
      }
      mbarrier_arrive(bar_unit(k & 1));  // this thread's page-fault writes for the unit are done
      ++k;
    }
    // The last copies land (and arrive on their barriers) before the thread exits.
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- math: warpgroup mw owns rows 64 mw .. 64 mw + 63 of each unit's tile ----
  regs_increase<C::kMathRegs>();
  const int mw = wg - 1;
  const int t_in_wg = tid & 127;
  // Rows out through shared memory (write_rows_staged) where each row is one
  // 16-byte aligned run of 2 x D bytes and the KV is not split (partials go as before).
  const bool staged_out = p.num_kv_chunks <= 1 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                          p.out_stride_token % (16 / sizeof(T)) == 0 &&
                          p.out_stride_head % (16 / sizeof(T)) == 0;
  const int lane = tid & 31, warp = t_in_wg >> 5;
  const uint32_t q_rows = s_q + mw * 64 * 128;  // 64-row A operand: 8 KiB into each block

  // The steps of the CTA's tile n (stage n % 2, phase n / 2).
  auto stage = [](int n) { return n % C::kStages; };
  auto phase = [](int n) { return static_cast<uint32_t>((n / C::kStages) & 1); };
  auto wait_k = [&](int n) {
    mbarrier_wait(bar(0, stage(n)), phase(n));  // K of tile n landed
    fence_proxy_async();                        // ... visible to the tensor cores' reads
  };
  auto wait_v = [&](int n) {
    mbarrier_wait(bar(1, stage(n)), phase(n));
    fence_proxy_async();
  };
  // The turns (kPingPong): warpgroup mw waits for its turn before it issues a tile's products and
  // hands the turn over once they are issued. Warpgroup 1 hands it over once before its first tile
  // and warpgroup 0 takes one more after its last, so every wait meets exactly one arrival.
  bool started = false;
  int n = 0, k = 0;
  for (int f = 0;; ++f) {
    TileWork u;
    bool found = false;
    if (next_unit(f, u, found) < 0) break;
    if (!found) continue;
    const int wg_row0 = u.row0 + 64 * mw;
    int row_pos[2];  // this thread's rows: 16 * warp + lane / 4 (+ 8) of the warpgroup
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wg_row0 + warp * 16 + (lane >> 2) + h * 8;
      row_pos[h] = u.pos_shift + min(row, u.num_rows - 1) / g;
    }
    const int wg_first_pos = u.pos_shift + min(wg_row0, u.num_rows - 1) / g;
    const int wg_last_pos = u.pos_shift + (min(wg_row0 + 64, u.num_rows) - 1) / g;

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    if (u.num_blocks > 0) {
      mbarrier_wait(bar_q, static_cast<uint32_t>(k & 1));
      if (kPingPong && mw == 1 && !started) named_barrier_arrive(kTurn, 256);  // 0 goes first
      started = true;
    }
    // Each tile in order: S, softmax, P V.
    for (int t = 0; t < u.num_blocks; ++t, ++n) {
      float sc[kSRegs];
      wait_k(n);
      if constexpr (kPingPong) named_barrier_sync(kTurn + mw, 256);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {  // S = Q K_n^T
        const uint32_t column = (ks & 3) * 32;
        const uint64_t a = descriptor(q_rows + (ks >> 2) * C::kBlockBytes + column, 16, 1024);
        const uint64_t b =
            descriptor(k_tile(stage(n)) + (ks >> 2) * C::kBlockBytes + column, 16, 1024);
        Ops<T>::qk(sc, a, b, ks > 0 ? 1 : 0);
      }
      wgmma_commit();
      if constexpr (kPingPong) named_barrier_arrive(kTurn + (mw ^ 1), 256);
      wgmma_wait_all();
      fence_registers(sc);
      mbarrier_arrive(bar(2, stage(n)));  // this warpgroup is done with K of tile n
      if (t + 1 == u.num_blocks) mbarrier_arrive(bar_q_empty);  // ... and with the unit's Q
      float alpha[2];
      if (softmax_tile<kBlockN>(p, sc, u.lo + t * kBlockN, u.hi, u.end, wg_first_pos, wg_last_pos,
                                row_pos, row_max, row_sum, alpha)) {
#pragma unroll
        for (int i = 0; i < kORegs; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      uint32_t pa[kBlockN / 16][4];
      pack_p<T, kBlockN>(sc, pa);
      wait_v(n);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {  // O += P V_n
        Ops<T>::pv(o, pa[kk], descriptor(v_tile(stage(n)) + kk * 16 * 128, C::kBlockBytes, 1024));
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_registers(o);
      mbarrier_arrive(bar(3, stage(n)));  // ... and with V of tile n
    }

    // A page id outside the pool: the rows get 0 / -inf (a poisoned partial when split).
    bool bad_page = false;
    const CtaPageFault& fault = faults[k & 1];
    if (u.num_blocks > 0) {
      mbarrier_wait(bar_unit(k & 1), static_cast<uint32_t>((k >> 1) & 1));
      bad_page = fault.flag != 0;
      ++k;
    }
    if (staged_out && !bad_page) {
      write_rows_staged<T, kD>(p, o, row_sum, row_max, wg_row0, u.num_rows, u.q_begin, u.kv_head,
                               base + C::kOut + (mw * 64 + warp * 16) * C::kOutPitch, C::kOutPitch);
    } else {
      write_rows<T, kD>(p, o, row_sum, row_max, wg_row0, u.num_rows, u.q_begin, u.kv_head, 1.0f,
                        bad_page);
    }
    if (bad_page && tid == 128) report_page(p.guard, u.request, fault.index, fault.page);
  }
  if (kPingPong && mw == 0 && started) named_barrier_sync(kTurn, 256);  // the last hand-over
#else
  __trap();  // launched only where the sm_90a code exists (see launch.cuh)
#endif
}

}  // namespace pagedattn::cuda::prefill::sm90ws
