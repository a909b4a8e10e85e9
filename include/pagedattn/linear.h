// Linear layers y = x · Wᵀ (+ bias) with W as the checkpoint stores it, and a plain f32 GEMM for
// the few products that are not a linear layer (MLA's per-head absorption of kv_b_proj).
//
// W is [out_features, in_features] row-major in bf16, f16 or f32 (the checkpoint's dtype, usually
// a view into the memory-mapped file); x and y are f32 rows on the CPU. A Linear may stack several
// weights of the same in_features ("parts", e.g. q/k/v or gate/up): its output row is their
// outputs side by side, in order, so one GEMM serves them all.
//
// Two ways to hold W, chosen per Linear (WeightMode):
//   kConvertTiles  W stays as stored (no extra memory). At decode (M <= 16) each thread streams
//                  a tile of W's rows through the attention backend's fused SIMD dot-product loop
//                  (bf16 or f32 rows, in_features a multiple of 16): each chunk of W is converted
//                  in registers and used for up to 8 rows of x at once, so W's stored bytes are
//                  read once per call. Otherwise (prefill, f16 weights, other in_features) the
//                  thread converts the tile to f32 into its own scratch (sized to stay in cache)
//                  and runs single-threaded sgemm (sgemv at M = 1) on it.
//   kCachedF32     W is converted to one f32 copy at construction (4 bytes per weight: twice a
//                  bf16 checkpoint), and the same tiles run sgemm / sgemv on it directly.
// f32 weights are always used in place (no copy). The default (kAuto) keeps W as stored where the
// fused decode loop reads it (bf16 and f32 with in_features % 16 == 0), else (f16) the f32 copy:
// the measurements are in bench/RESULTS.md ("CPU GEMM for the model runtime"). Debian's OpenBLAS
// (0.3.21) has no bf16 kernels, so a BLAS call at decode reads an f32 copy of W, twice the bytes
// of the stored bf16 that the fused loop streams; at prefill (M = 512) converting tiles costs
// what the cached copy does.
//
// Threads: the product is split over tiles of W's rows by OpenMP (the attention backend's thread
// pool) and each tile is one single-threaded OpenBLAS call, so OpenBLAS's own threads never run
// beside OpenMP's (see ops_threads.h: init_threads() sets OpenBLAS to one thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn::ops {

enum class WeightMode : uint8_t { kAuto, kConvertTiles, kCachedF32 };

// One stacked weight: weight [out, in] (bf16/f16/f32, row stride >= in, inner stride 1) and an
// optional bias [out] in any float dtype.
struct LinearPart {
  TensorView weight;
  TensorView bias;  // absent: no bias
};

class Linear {
 public:
  Linear() = default;
  // `name` is used in errors ("model.layers.0.self_attn.qkv"). Throws Error when the parts'
  // in_features differ, a dtype is not f32/f16/bf16 or a view is not on the CPU.
  Linear(std::string name, std::span<const LinearPart> parts, WeightMode mode = WeightMode::kAuto);

  bool defined() const { return out_features_ > 0; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const std::string& name() const { return name_; }
  // Host bytes this Linear owns beyond the checkpoint's views (the f32 copy, the biases).
  int64_t owned_bytes() const;
  WeightMode mode() const { return mode_; }

  // y [M, out] = x [M, in] · Wᵀ + bias. x, y: f32, 2-D, inner stride 1, any row stride; y must not
  // overlap x. M = 0 is a no-op.
  void forward(const TensorView& x, const TensorView& y) const;

 private:
  struct Segment {  // rows [row_begin, row_begin + rows) of the stacked weight
    const char* data = nullptr;
    DType dtype = DType::kF32;
    int64_t row_stride = 0;  // elements
    int64_t row_begin = 0;
    int64_t rows = 0;
  };
  std::string name_;
  WeightMode mode_ = WeightMode::kConvertTiles;
  int64_t in_features_ = 0, out_features_ = 0;
  std::vector<Segment> segments_;
  std::vector<float> cached_;  // kCachedF32: [out, in]
  std::vector<float> bias_;    // [out] or empty
};

// C [M, N] = alpha · A [M, K] · op(B) + beta · C, all f32 row-major with leading dimensions
// lda / ldb / ldc; op(B) = B [K, N] when transpose_b is false, Bᵀ with B [N, K] when true. One
// OpenBLAS call (single-threaded by init_threads(); call it from inside a parallel loop to split
// work, or use gemm_parallel).
void gemm_f32(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Sets OpenBLAS to one thread (the model's parallel loops are OpenMP's) and OpenMP to `threads`
// (0: leave OpenMP's default, OMP_NUM_THREADS or the core count). Idempotent; the Model calls it.
void init_threads(int threads = 0);
// The OpenMP thread count and OpenBLAS's build (its config string, e.g. "... pthread ..."), for
// reports.
int num_threads();
std::string blas_info();

}  // namespace pagedattn::ops
