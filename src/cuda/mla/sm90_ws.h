// The layout of the warp-specialized Hopper MLA kernel (kernel_sm90_ws.cuh): its warpgroups,
// tile, shared-memory map and register split. Apart from the kernel so that the tensor-core probe
// (wgmma_probe.cu) issues the same sequences with the same registers. No CUDA types.
#pragma once

#include "cuda/mla/config.h"

namespace pagedattn::cuda::mla::sm90ws {

struct Ws {
  static constexpr int kThreads = 384;  // three warpgroups
  static constexpr int kRows = 64;
  static constexpr int kTokens = 32;
  static constexpr int kStages = 5;
  static constexpr int kBlocks = kDimQk / 64;          // 9 column blocks (8 ckv + 1 kpe)
  static constexpr int kKvBlockBytes = kTokens * 128;  // one 64-column block of a tile
  static constexpr int kStageBytes = kBlocks * kKvBlockBytes;
  static constexpr int kQBlockBytes = kRows * 128;
  static constexpr int kQBytes = kBlocks * kQBlockBytes;
  static constexpr int kPBytes = kRows * 128;
  static constexpr int kKv = 0;
  static constexpr int kQStage = 3;  // Q lands in stages 3 and 4 before WG 0 takes it
  static constexpr int kP = kKv + kStages * kStageBytes;
  // S's k16 steps with A from WG 0's registers (Q's latent blocks 0..6); the last latent block and
  // the rope block are read from shared memory (A of steps kRegSteps .. 35). One latent block
  // less in registers pays for WG 0's second set of S accumulators.
  static constexpr int kRegSteps = 28;
  static constexpr int kSmemQChunk = kRegSteps * 2;  // Q's first 16-byte chunk kept in smem
  static constexpr int kQSmem = kP + 2 * kPBytes;    // [2 blocks][64 rows][128 bytes]
  static constexpr int kAlpha =
      kQSmem + (kDimQk / 16 - kRegSteps) / 4 * kQBlockBytes;  // f32 [2][64]
  static constexpr int kMoved = kAlpha + 2 * kRows * 4;       // int [2][4 warps]
  static constexpr int kStats = kMoved + 2 * 4 * 4;           // f32 [max | sum][64]
  static constexpr int kBars = kStats + 2 * kRows * 4;        // u64 full[5], pfull[2], pempty[2]
  static constexpr int kNote = kBars + (kStages + 4) * 8;     // u64: a bad page id (guard.cuh)
  static constexpr int kBadPage = kNote + 8;                  // int: the gatherers met one
  static constexpr int kBytes = kBadPage + 8;
  static constexpr int kSmemBytes = kBytes + 1024;  // aligned up to 1024 inside the kernel
  static_assert(kQBytes <= (kStages - kQStage) * kStageBytes);
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM must fit");
  // setmaxnreg: the CTA's 3 x 168 registers per thread, moved to the softmax warpgroup.
  static constexpr int kSoftmaxRegs = 184, kOutputRegs = 160;  // 184 + 2 x 160 = 3 x 168
  // setmaxnreg.inc only takes what .dec released inside the CTA: the sum must not exceed the
  // launch's 65536 / 384 registers per thread (168, a multiple of 8), or WG 0 waits forever.
  static_assert(kSoftmaxRegs + 2 * kOutputRegs <= 3 * (65536 / kThreads / 8 * 8));
};

}  // namespace pagedattn::cuda::mla::sm90ws
