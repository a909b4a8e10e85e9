// MoE on the device, without a round trip to the host (moe.cu): what a decode step of a DeepSeek
// model needs to run as one CUDA graph. For one MoE layer of T tokens, top-k of E experts:
//
//   moe_route_device   router logits [T, E] f32 -> expert ids and weights [T, k], one thread per
//                      token running ops::moe_route's algorithm step for step (include/pagedattn/
//                      moe.h: softmax / grouped / sigmoid + correction bias, ties to the lower
//                      index), so that both choose the same experts up to exp's last bit;
//   moe_sort_device    a counting sort of the T·k (token, slot) pairs by expert in one block:
//                      position[p] (the pair's row in the expert-sorted buffers), source_row[r]
//                      (the token of row r), and the tile table of the grouped GEMM: entries
//                      (expert, first row, rows) of at most tile_rows rows, the unused ones
//                      with expert -1. A row's place inside its expert depends on thread timing;
//                      its values do not (every row of the GEMM is computed alone);
//   moe_grouped_gemm   for each tile, C[rows, N] f32 = A[rows, K] · W_eᵀ with W_e [N, K] the
//                      expert's weight (a device array of E pointers), bf16 or f16 inputs on
//                      tensor cores (mma.sync m16n8k16; the 128-row tiles on wgmma on Hopper;
//                      f32 accumulation), K a multiple of 8;
//   moe_grouped_gemm_silu  the same product over gate_up weights whose rows are interleaved in
//                      blocks of kMoePairBlock gates then their ups, writing act = silu(gate) *
//                      up in the compute dtype from the epilogue: no f32 [pairs, 2 I] buffer
//                      written and read again, no silu_mul kernel (DeepSeek-V2-Lite at 8192
//                      tokens: 553 MB a layer).
//
// Two tile heights (moe_tile_rows picks one per step). kMoeTileRows (32) where each expert has
// few rows (decode): the weights are read once per tile, the step is memory-bound, and short
// tiles waste no reads on rows that do not exist. kMoeLargeTileRows (128) where experts have
// many rows (prefill): a 32-row tile reads an expert's whole weight for every 32 rows, so
// the step became bound by those reads (DeepSeek-V2-Lite's shape on an H100: 69 ms at 2048
// tokens against 64 ms for a cuBLAS GEMM per expert); 128-row tiles read it a quarter as often
// and give each warp a 64 x 32 block of the output.
//
// The grid of each launch depends on T, E, N and K only, never on the routing, so the launches
// can be captured in a graph. Tested against ops::moe_route and a float64 GEMM in
// tests/model/cuda/moe_cuda_test.cpp.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"
#include "pagedattn/moe.h"

namespace pagedattn::model::cuda {

inline constexpr int32_t kMoeTileRows = 32;
inline constexpr int32_t kMoeLargeTileRows = 128;
inline constexpr int32_t kMoeMaxExperts = 256;  // DeepSeek-V3: 256, V2: 160
inline constexpr int32_t kMoeMaxGroups = 64;
// moe_grouped_gemm_silu's weight layout: rows [32 b, 32 b + 16) are gate rows [16 b, 16 b + 16),
// rows [32 b + 16, 32 b + 32) the matching up rows (interleave_pairs in weights.h builds it).
inline constexpr int32_t kMoePairBlock = 16;

// Tile-table entries a sort of `pairs` pairs over `experts` experts into tiles of at most
// `tile_rows` rows may need (launch size).
inline int64_t moe_max_tiles(int64_t pairs, int32_t experts, int32_t tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + experts;
}

// The tile height for a step of `pairs` (token, expert) pairs over `experts` experts:
// kMoeLargeTileRows from an average of kMoeLargeTileRows / 2 rows an expert, else kMoeTileRows.
// PAGEDATTN_MOE_TILE_ROWS=32 or 128 forces one (measurements, tests); any other value is an error.
int32_t moe_tile_rows(int64_t pairs, int32_t experts);

// logits [tokens, E] f32 (read only); correction_bias [E] f32 on the device for kSigmoidNoAuxTc
// (else null); expert_ids, weights [tokens, top_k].
void moe_route_device(const float* logits, int64_t tokens, const ops::MoeRouterConfig& config,
                      const float* correction_bias, int32_t* expert_ids, float* weights,
                      void* stream);

// expert_ids [pairs] (pair p = token p / top_k, slot p % top_k) -> position [pairs],
// source_row [pairs], tiles [max_tiles, 3] (expert, first row, rows <= tile_rows; tile_rows
// kMoeTileRows or kMoeLargeTileRows, max_tiles >= moe_max_tiles(pairs, experts, tile_rows)).
void moe_sort_device(const int32_t* expert_ids, int64_t pairs, int32_t top_k, int32_t experts,
                     int32_t* position, int32_t* source_row, int32_t* tiles, int64_t max_tiles,
                     void* stream, int32_t tile_rows);

// For each tile of `tiles` [max_tiles, 3] (sorted into tiles of at most tile_rows rows): rows
// [first, first + rows) of c (f32, row stride ldc) = the same rows of a (row stride lda) ·
// weights[expert]ᵀ ([n, k], row-major). dtype bf16 or f16; k, lda multiples of 8; 16-byte aligned
// a and weights.
void moe_grouped_gemm(const void* a, int64_t lda, const void* const* weights, DType dtype,
                      int64_t n, int64_t k, const int32_t* tiles, int64_t max_tiles, float* c,
                      int64_t ldc, void* stream, int32_t tile_rows);

// As moe_grouped_gemm, over weights[expert] [n, k] whose rows are interleaved in blocks of
// kMoePairBlock gates then their ups (n = 2 I, a multiple of 2 kMoePairBlock): rows [first, first
// + rows) of act (dtype, row stride ld_act, even, >= I; 4-byte aligned) = silu(gate) * up,
// computed in f32 from the accumulators as silu_mul does.
void moe_grouped_gemm_silu(const void* a, int64_t lda, const void* const* weights, DType dtype,
                           int64_t n, int64_t k, const int32_t* tiles, int64_t max_tiles, void* act,
                           int64_t ld_act, void* stream, int32_t tile_rows);

}  // namespace pagedattn::model::cuda
