// Linear layers over BLAS (OpenBLAS, or blas.h's built-in GEMM where OpenBLAS is missing; see
// include/pagedattn/linear.h for the contract).
//
// The product is cut into tiles of W's rows (output features). An OpenMP loop hands tiles to
// threads; each tile is f32 (a view of an f32 weight or of the cached copy, or converted from
// bf16/f16 into the thread's scratch) and runs one single-threaded sgemm (sgemv when M = 1) into
// its columns of y. Tile sizes: at decode (small M) the product is a stream over W, so tiles are
// small (many per thread, good balance, the converted tile stays in L2); at prefill (large M) each
// tile re-packs x inside sgemm, so tiles are large (fewer re-packs). The sizes were measured with
// the DISABLED_GemmTiming test (bench/RESULTS.md).
#include "pagedattn/linear.h"

#include <algorithm>
#include <cstring>

#include "blas.h"
#include "core/check.h"
#include "cpu/cpu_simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pagedattn::ops {
namespace {

// Bytes of one f32 tile of W: small at decode (W is streamed once), large at prefill (x is
// re-packed once per tile).
constexpr int64_t kDecodeTileBytes = 128 << 10;
constexpr int64_t kPrefillTileBytes = 2 << 20;
constexpr int64_t kDecodeRows = 16;  // M at or below this counts as decode

// Small-M products over the stored weight (bf16 or f32 rows, in_features a multiple of the SIMD
// width), through the attention backend's SIMD loops: bf16 rows with in_features a multiple of 32
// take cpu::simd::gemv_bf16_pairs (x in its pair layout), the rest the fused dot-product loop
// cpu::simd::score_rows_fused (x packed). Either converts W in registers and feeds each chunk to
// every row of x, so W's stored bytes are streamed once per call. Debian's OpenBLAS 0.3.21 has no
// bf16 kernels (no sbgemm / sbgemv), so a BLAS call would read an f32 copy of W: twice the bytes.
bool fused_small_m(DType dtype, int64_t k) {
  return (dtype == DType::kBF16 || dtype == DType::kF32) && k % cpu::simd::kLanes == 0 &&
         k <= INT32_MAX;
}

void convert_row(const char* src, DType dtype, int64_t n, float* dst) {
  if (dtype == DType::kBF16) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else if (dtype == DType::kF16) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

void check_weight_dtype(const std::string& name, const char* what, DType dtype) {
  PA_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
           "{}: {} dtype {} is not supported (expected f32, f16 or bf16)", name, what,
           dtype_name(dtype));
}

// OpenBLAS runs single-threaded inside our OpenMP loops (set once, before the first product).
void single_threaded_blas() { blas::single_threaded(); }

// One thread's scratch for converted tiles; grows to the largest tile seen, never shrinks.
thread_local std::vector<float> tl_tile;

}  // namespace

Linear::Linear(std::string name, std::span<const LinearPart> parts, WeightMode mode)
    : name_(std::move(name)) {
  PA_CHECK(!parts.empty(), "{}: a linear layer needs at least one weight", name_);
  bool all_f32 = true;
  bool any_bias = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView& w = parts[i].weight;
    PA_CHECK(w.ndim == 2, "{}: weight {} has shape {} (expected 2-D [out, in])", name_, i,
             w.shape_str());
    PA_CHECK(w.device == Device::cpu(), "{}: weight {} is on {} (expected cpu)", name_, i,
             w.device.str());
    check_weight_dtype(name_, "weight", w.dtype);
    PA_CHECK(w.strides[1] == 1 && w.strides[0] >= w.shape[1],
             "{}: weight {} needs unit inner stride and row stride >= {} (strides [{}, {}])", name_,
             i, w.shape[1], w.strides[0], w.strides[1]);
    PA_CHECK(w.data != nullptr && w.shape[0] > 0 && w.shape[1] > 0, "{}: weight {} is empty ({})",
             name_, i, w.shape_str());
    if (i == 0) in_features_ = w.shape[1];
    PA_CHECK(w.shape[1] == in_features_,
             "{}: weight {} has {} input features, weight 0 has {} (stacked weights must agree)",
             name_, i, w.shape[1], in_features_);
    if (parts[i].bias.defined()) {
      const TensorView& b = parts[i].bias;
      PA_CHECK(b.ndim == 1 && b.shape[0] == w.shape[0] && b.device == Device::cpu(),
               "{}: bias {} has shape {} on {} (expected [{}] on cpu)", name_, i, b.shape_str(),
               b.device.str(), w.shape[0]);
      check_weight_dtype(name_, "bias", b.dtype);
      any_bias = true;
    }
    segments_.push_back(
        {static_cast<const char*>(w.data), w.dtype, w.strides[0], out_features_, w.shape[0]});
    out_features_ += w.shape[0];
    all_f32 = all_f32 && w.dtype == DType::kF32;
  }
  // kAuto: weights the fused small-M loop reads as stored stay as stored (decode streams their
  // bytes once; prefill converts tiles, as fast as the cached copy at M = 512); others (f16, or
  // in_features not a multiple of 16) get the f32 copy.
  bool all_fused = true;
  for (const Segment& seg : segments_)
    all_fused = all_fused && fused_small_m(seg.dtype, in_features_);
  mode_ = mode != WeightMode::kAuto ? mode
          : all_fused               ? WeightMode::kConvertTiles
                                    : WeightMode::kCachedF32;
  if (mode_ == WeightMode::kCachedF32 && !all_f32) {
    cached_.resize(static_cast<size_t>(out_features_ * in_features_));
    for (const Segment& s : segments_) {
      for (int64_t r = 0; r < s.rows; ++r) {
        convert_row(s.data + r * s.row_stride * dtype_size(s.dtype), s.dtype, in_features_,
                    cached_.data() + (s.row_begin + r) * in_features_);
      }
    }
    segments_ = {{reinterpret_cast<const char*>(cached_.data()), DType::kF32, in_features_, 0,
                  out_features_}};
  }
  if (any_bias) {
    bias_.assign(static_cast<size_t>(out_features_), 0.0f);
    int64_t row = 0;
    for (const LinearPart& p : parts) {
      if (p.bias.defined()) {
        dispatch_float(p.bias.dtype, name_, [&](auto tag) {
          using T = decltype(tag);
          const auto* b = static_cast<const T*>(p.bias.data);
          for (int64_t i = 0; i < p.bias.shape[0]; ++i) {
            bias_[static_cast<size_t>(row + i)] = to_float(b[i * p.bias.strides[0]]);
          }
        });
      }
      row += p.weight.shape[0];
    }
  }
}

int64_t Linear::owned_bytes() const {
  return static_cast<int64_t>((cached_.size() + bias_.size()) * sizeof(float));
}

void Linear::forward(const TensorView& x, const TensorView& y) const {
  PA_CHECK(defined(), "linear layer used before it was built");
  check_tensor(name_ + " input", x, {kAnySize, in_features_}, DType::kF32, Device::cpu());
  check_tensor(name_ + " output", y, {x.shape[0], out_features_}, DType::kF32, Device::cpu());
  check_inner_contiguous(name_ + " input", x);
  check_inner_contiguous(name_ + " output", y);
  const int64_t m = x.shape[0];
  if (m == 0) return;
  single_threaded_blas();
  const int64_t k = in_features_;
  const auto* xp = x.data_as<const float>();
  auto* yp = y.data_as<float>();
  const int64_t ldx = x.strides[0], ldy = y.strides[0];

  const int64_t tile_bytes = m <= kDecodeRows ? kDecodeTileBytes : kPrefillTileBytes;
  // At prefill, also enough tiles for every thread to have two (balance).
  int64_t tile_rows = std::max<int64_t>(16, (tile_bytes / (k * 4)) / 16 * 16);
  if (m > kDecodeRows) {
    const int64_t balanced = (out_features_ + 2 * num_threads() - 1) / (2 * num_threads());
    tile_rows = std::min(tile_rows, std::max<int64_t>(16, (balanced + 15) / 16 * 16));
  }
  // Tiles never straddle two segments, so a tile is one dtype and one row stride.
  struct Tile {
    int32_t segment;
    int64_t row, rows;
  };
  std::vector<Tile> tiles;
  for (size_t s = 0; s < segments_.size(); ++s) {
    for (int64_t r = 0; r < segments_[s].rows; r += tile_rows) {
      tiles.push_back({static_cast<int32_t>(s), r, std::min(tile_rows, segments_[s].rows - r)});
    }
  }
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  // Threads only where the product is worth a fork/join (~1 MFLOP; below that one core is done
  // before a second one has woken, and an oversubscribed host makes every join expensive).
  const bool parallel = num_tiles > 1 && m * out_features_ * k >= (int64_t{1} << 19);
  // Decode over the stored weight: x's rows in groups of kMaxFusedRows, each group one pass over
  // the tile (a second group re-reads the tile from the cache, not from memory). x is prepared
  // once here for the loops the segments take: in the pair layout for gemv_bf16_pairs, packed
  // (row stride k) for score_rows_fused when it is strided.
  const bool fused = m <= kDecodeRows;
  const bool pairs = fused && k % cpu::simd::kPairBlock == 0;
  bool any_pairs = false, any_plain = false;
  for (const Segment& seg : segments_) {
    if (!fused || !fused_small_m(seg.dtype, k)) continue;
    (pairs && seg.dtype == DType::kBF16 ? any_pairs : any_plain) = true;
  }
  thread_local std::vector<float> packed_x, paired_x;
  const float* x_rows = xp;
  if (any_plain && ldx != k) {
    packed_x.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(packed_x.data() + i * k, xp + i * ldx, static_cast<size_t>(k) * sizeof(float));
    }
    x_rows = packed_x.data();
  }
  if (any_pairs) {
    paired_x.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) {
      cpu::simd::pair_layout(xp + i * ldx, static_cast<int>(k), paired_x.data() + i * k);
    }
  }
  const float* x_pairs = paired_x.data();
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t t = 0; t < num_tiles; ++t) {
    const Tile& tile = tiles[static_cast<size_t>(t)];
    const Segment& seg = segments_[static_cast<size_t>(tile.segment)];
    const int64_t out_col = seg.row_begin + tile.row;
    if (fused && fused_small_m(seg.dtype, k)) {
      const int64_t row_bytes = seg.row_stride * dtype_size(seg.dtype);
      thread_local std::vector<const char*> rows;
      rows.resize(static_cast<size_t>(tile.rows));
      for (int64_t r = 0; r < tile.rows; ++r) rows[r] = seg.data + (tile.row + r) * row_bytes;
      const bool bf16_pairs = pairs && seg.dtype == DType::kBF16;
      const auto elem =
          seg.dtype == DType::kBF16 ? cpu::simd::KvElem::kBF16 : cpu::simd::KvElem::kF32;
      for (int64_t i0 = 0; i0 < m; i0 += cpu::simd::kMaxFusedRows) {
        const int group = static_cast<int>(std::min<int64_t>(cpu::simd::kMaxFusedRows, m - i0));
        float* y_rows = yp + i0 * ldy + out_col;
        if (bf16_pairs) {
          cpu::simd::gemv_bf16_pairs(x_pairs + i0 * k, group, rows.data(),
                                     static_cast<int>(tile.rows), static_cast<int>(k), y_rows,
                                     static_cast<int>(ldy));
        } else {
          cpu::simd::score_rows_fused(x_rows + i0 * k, group, rows.data(), elem,
                                      static_cast<int>(tile.rows), static_cast<int>(k), y_rows,
                                      static_cast<int>(ldy));
        }
      }
      if (!bias_.empty()) {
        for (int64_t i = 0; i < m; ++i) {
          float* y_row = yp + i * ldy + out_col;
          for (int64_t j = 0; j < tile.rows; ++j)
            y_row[j] += bias_[static_cast<size_t>(out_col + j)];
        }
      }
      continue;
    }
    const float* w = nullptr;
    int64_t ldw = k;
    if (seg.dtype == DType::kF32) {
      w = reinterpret_cast<const float*>(seg.data) + tile.row * seg.row_stride;
      ldw = seg.row_stride;
    } else {
      if (static_cast<int64_t>(tl_tile.size()) < tile.rows * k) {
        tl_tile.resize(static_cast<size_t>(tile.rows * k));
      }
      const int64_t elem = dtype_size(seg.dtype);
      for (int64_t r = 0; r < tile.rows; ++r) {
        convert_row(seg.data + (tile.row + r) * seg.row_stride * elem, seg.dtype, k,
                    tl_tile.data() + r * k);
      }
      w = tl_tile.data();
    }
    float beta = 0.0f;
    if (!bias_.empty()) {
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(yp + i * ldy + out_col, bias_.data() + out_col,
                    static_cast<size_t>(tile.rows) * sizeof(float));
      }
      beta = 1.0f;
    }
    if (m == 1) {
      blas::sgemv(tile.rows, k, w, ldw, xp, beta, yp + out_col);
    } else {
      gemm_f32(true, m, tile.rows, k, 1.0f, xp, ldx, w, ldw, beta, yp + out_col, ldy);
    }
  }
}

void gemm_f32(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  single_threaded_blas();
  blas::sgemm(transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void init_threads(int threads) {
  single_threaded_blas();
#ifdef _OPENMP
  if (threads > 0) omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::string blas_info() { return blas::info(); }

}  // namespace pagedattn::ops
