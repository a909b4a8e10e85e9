// transform_heads with a slot-addressed out (src/model/cuda/kernels.h: the KV store fused into the
// head transform, as the CUDA model's GQA layers run it) against the unfused pair it replaces:
// the same transform writing k back in f32, then cuda::store_kv of the f32 rows. Every byte of
// both pools must agree (pools pre-filled with a pattern, so a write to a wrong place or to a
// skipped slot shows), over bf16 / f16 / f32 pools, NHD and HND, allocation pages of 1, 16 and
// 64 tokens, heads of 64 and 128 (the two kernels), with a slot of -1 and one past the pool among
// the rows. V, a plain copy (+ bias), is
// also checked against the host: each element the dtype's rounding of the f32 x + bias.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/device_array.h"
#include "model/cuda/kernels.h"
#include "pagedattn/cuda_store.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::model {
namespace {

using ::pagedattn::testing::DeviceArray;

struct StoreCase {
  std::string name;
  DType dtype;
  KvLayout layout;
  int64_t alloc_page;
  bool v_bias;
  // Heads of 64 with RoPE over 32 of them (the lane-strided kernel), or of 128 with whole-head
  // RoPE (the vector kernel: a warp per head at 9 rows, 2 or 4 heads a warp at 300).
  int32_t dim = 64;
  int64_t rows = 9;
  int32_t q_heads = 4, kv_heads = 2;
};
void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.name; }

// The host's rounding of an f32 value to the pool dtype, as bytes.
std::vector<uint8_t> rounded(DType dtype, float v) {
  std::vector<uint8_t> out(dtype_size(dtype));
  if (dtype == DType::kBF16) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    std::memcpy(out.data(), &b, 2);
  } else if (dtype == DType::kF16) {
    const __half h = __float2half_rn(v);
    std::memcpy(out.data(), &h, 2);
  } else {
    std::memcpy(out.data(), &v, 4);
  }
  return out;
}

class TransformStore : public ::testing::TestWithParam<StoreCase> {};

TEST_P(TransformStore, FusedStoreEqualsTransformThenStoreKv) {
  REQUIRE_GPU();
  const StoreCase& c = GetParam();
  const int32_t kQHeads = c.q_heads, kKvHeads = c.kv_heads, kDim = c.dim;
  const int32_t kHalf = kDim == 128 ? 64 : 16;
  const int64_t kRows = c.rows, kPages = kRows <= 9 ? 3 : kRows / c.alloc_page + 1;
  const int64_t width = (kQHeads + 2 * kKvHeads) * kDim, elem = dtype_size(c.dtype);
  const int64_t num_slots = kPages * c.alloc_page;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  const auto randoms = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = unit(rng);
    return v;
  };
  const std::vector<float> qkv = randoms(kRows * width), bias = randoms(width),
                           k_norm = randoms(kDim), cos = randoms(64 * kHalf),
                           sin = randoms(64 * kHalf);
  std::vector<int32_t> positions(kRows);
  for (int64_t r = 0; r < kRows; ++r) positions[r] = static_cast<int32_t>((r * 7) % 64);
  // Distinct slots in the pool, then a skipped row (-1) and one past the pool (not written).
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(all.begin(), all.begin() + std::min<int64_t>(kRows - 2, num_slots));
  while (static_cast<int64_t>(slots.size()) < kRows - 2) slots.push_back(-1);
  slots.insert(slots.begin() + 1, -1);
  slots.insert(slots.begin() + 4, num_slots);

  DeviceArray<float> d_bias(bias), d_norm(k_norm), d_cos(cos), d_sin(sin);
  DeviceArray<int32_t> d_pos(positions);
  DeviceArray<int64_t> d_slots(slots);
  const int64_t pool_bytes = kPages * c.alloc_page * kKvHeads * kDim * elem;
  std::vector<uint8_t> pattern(static_cast<size_t>(pool_bytes));
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(0x5a ^ (i * 37));

  struct Run {
    std::vector<uint8_t> k, v;
  };
  const auto run = [&](bool fused) {
    DeviceArray<float> d_qkv(qkv);
    DeviceArray<uint8_t> d_k(pattern), d_v(pattern),
        d_q(static_cast<size_t>(kRows * kQHeads * kDim * elem));
    const bool nhd = c.layout == KvLayout::kNHD;
    PagedKv kv;
    kv.layout = c.layout;
    kv.page_size = 1;
    // (Not a conditional of two initializer_lists: their arrays die with the expression.)
    const auto pool_view = [&](uint8_t* data) {
      return nhd ? TensorView::contiguous(data, c.dtype, {kPages, c.alloc_page, kKvHeads, kDim},
                                          Device::cuda(0))
                 : TensorView::contiguous(data, c.dtype, {kPages, kKvHeads, c.alloc_page, kDim},
                                          Device::cuda(0));
    };
    kv.k = pool_view(d_k.data);
    kv.v = pool_view(d_v.data);
    cuda::HeadTransformArgs q;
    q.x = d_qkv.data;
    q.x_stride_row = width;
    q.x_stride_head = kDim;
    q.heads = kQHeads;
    q.width = kDim;
    q.rows = kRows;
    q.cos = d_cos.data;
    q.sin = d_sin.data;
    q.rotary_half = kHalf;
    q.positions = d_pos.data;
    q.out = d_q.data;
    q.out_dtype = c.dtype;
    q.out_stride_row = kQHeads * kDim;
    q.out_stride_head = kDim;
    q.write_x = false;
    cuda::HeadTransformArgs k = q;
    k.x = d_qkv.data + kQHeads * kDim;
    k.heads = kKvHeads;
    k.norm_weight = d_norm.data;
    k.out = nullptr;
    k.write_x = true;
    cuda::HeadTransformArgs v = k;
    v.x = d_qkv.data + (kQHeads + kKvHeads) * kDim;
    v.norm_weight = nullptr;
    v.cos = v.sin = nullptr;
    v.bias = c.v_bias ? d_bias.data + (kQHeads + kKvHeads) * kDim : nullptr;
    std::vector<cuda::HeadTransformArgs> groups = {q, k};
    if (fused || c.v_bias) groups.push_back(v);
    if (fused) {
      for (size_t g = 1; g < groups.size(); ++g) {
        const TensorView& pool = g == 1 ? kv.k : kv.v;
        groups[g].write_x = false;
        groups[g].out = pool.data;
        groups[g].out_slots = d_slots.data;
        groups[g].out_alloc_page = c.alloc_page;
        groups[g].out_num_slots = num_slots;
        groups[g].out_stride_page = pool.strides[0];
        groups[g].out_stride_row = nhd ? pool.strides[1] : pool.strides[2];
        groups[g].out_stride_head = nhd ? pool.strides[2] : pool.strides[1];
      }
    }
    cuda::transform_heads(groups, nullptr);
    if (!fused) {
      const auto rows = [&](float* x) {
        TensorView view =
            TensorView::contiguous(x, DType::kF32, {kRows, kKvHeads, kDim}, Device::cuda(0));
        view.strides[0] = width;
        return view;
      };
      ::pagedattn::cuda::store_kv(
          kv, rows(d_qkv.data + kQHeads * kDim), rows(d_qkv.data + (kQHeads + kKvHeads) * kDim),
          TensorView::contiguous(d_slots.data, DType::kI64, {kRows}, Device::cuda(0)), nullptr);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return Run{d_k.host(), d_v.host()};
  };
  const Run unfused = run(false), fused = run(true);
  int64_t differ = 0;
  for (size_t i = 0; i < unfused.k.size(); ++i) differ += unfused.k[i] != fused.k[i];
  for (size_t i = 0; i < unfused.v.size(); ++i) differ += unfused.v[i] != fused.v[i];
  EXPECT_EQ(differ, 0) << c.name << ": pool bytes differ between the fused and unfused stores";

  // V against the host, and the untouched bytes of skipped rows.
  int64_t written = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t slot = slots[static_cast<size_t>(r)];
    if (slot < 0 || slot >= num_slots) continue;
    const int64_t page = slot / c.alloc_page, offset = slot % c.alloc_page;
    for (int64_t h = 0; h < kKvHeads; ++h) {
      for (int64_t d = 0; d < kDim; ++d) {
        const int64_t index = c.layout == KvLayout::kNHD
                                  ? ((page * c.alloc_page + offset) * kKvHeads + h) * kDim + d
                                  : ((page * kKvHeads + h) * c.alloc_page + offset) * kDim + d;
        const int64_t col = (kQHeads + kKvHeads + h) * kDim + d;
        float value = qkv[static_cast<size_t>(r * width + col)];
        if (c.v_bias) value += bias[static_cast<size_t>(col)];
        const std::vector<uint8_t> want = rounded(c.dtype, value);
        EXPECT_EQ(std::memcmp(fused.v.data() + index * elem, want.data(), elem), 0)
            << c.name << ": v of row " << r << " head " << h << " element " << d;
        ++written;
      }
    }
  }
  // Every byte outside the written rows keeps the pattern.
  std::vector<bool> touched(static_cast<size_t>(num_slots * kKvHeads), false);
  for (int64_t slot : slots) {
    if (slot < 0 || slot >= num_slots) continue;
    for (int64_t h = 0; h < kKvHeads; ++h) touched[static_cast<size_t>(slot * kKvHeads + h)] = true;
  }
  int64_t stray = 0;
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    const int64_t page = slot / c.alloc_page, offset = slot % c.alloc_page;
    for (int64_t h = 0; h < kKvHeads; ++h) {
      if (touched[static_cast<size_t>(slot * kKvHeads + h)]) continue;
      const int64_t row = c.layout == KvLayout::kNHD
                              ? (page * c.alloc_page + offset) * kKvHeads + h
                              : (page * kKvHeads + h) * c.alloc_page + offset;
      for (int64_t b = row * kDim * elem; b < (row + 1) * kDim * elem; ++b) {
        stray += fused.k[static_cast<size_t>(b)] != pattern[static_cast<size_t>(b)];
        stray += fused.v[static_cast<size_t>(b)] != pattern[static_cast<size_t>(b)];
      }
    }
  }
  EXPECT_EQ(stray, 0) << c.name << ": bytes of unwritten slots changed";
  EXPECT_GT(written, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Pools, TransformStore,
    ::testing::Values(StoreCase{"bf16_nhd_alloc16", DType::kBF16, KvLayout::kNHD, 16, false},
                      StoreCase{"f16_hnd_alloc64_bias", DType::kF16, KvLayout::kHND, 64, true},
                      StoreCase{"f32_nhd_alloc1", DType::kF32, KvLayout::kNHD, 1, false},
                      StoreCase{"bf16_hnd_alloc1_bias", DType::kBF16, KvLayout::kHND, 1, true},
                      StoreCase{"bf16_nhd_alloc16_d128", DType::kBF16, KvLayout::kNHD, 16, false,
                                128},
                      StoreCase{"bf16_nhd_alloc16_d128_300rows", DType::kBF16, KvLayout::kNHD, 16,
                                false, 128, 300, 8, 4},
                      StoreCase{"f16_hnd_alloc1_d128_300rows_bias", DType::kF16, KvLayout::kHND, 1,
                                true, 128, 300},
                      StoreCase{"f32_hnd_alloc64_d128_300rows", DType::kF32, KvLayout::kHND, 64,
                                false, 128, 300, 8, 4}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pagedattn::model
