// Strided views: q, out and lse given as slices of larger buffers (as engines pass them: a row
// of a fused QKV projection, an output with padded heads). The backend must read and write
// through the strides and leave every byte outside the views untouched.
#include <gtest/gtest.h>

#include <cstring>

#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_test_util.h"
#include "reference/reference.h"

namespace pagedattn::testing {
namespace {

// A view of the leading [rows, heads, dim] corner of `buffer` ([rows, heads + extra, dim + pad]).
TensorView corner(const HostTensor& buffer, int64_t rows, int64_t heads, int64_t dim) {
  TensorView view = buffer.view();
  view.shape[0] = rows;
  view.shape[1] = heads;
  view.shape[2] = dim;
  return view;
}

void copy_rows(const TensorView& from, const TensorView& to) {
  const int64_t element = dtype_size(from.dtype);
  for (int64_t r = 0; r < from.shape[0]; ++r) {
    for (int64_t h = 0; h < from.shape[1]; ++h) {
      std::memcpy(static_cast<char*>(to.data) + (r * to.strides[0] + h * to.strides[1]) * element,
                  static_cast<const char*>(from.data) +
                      (r * from.strides[0] + h * from.strides[1]) * element,
                  static_cast<size_t>(from.shape[2] * element));
    }
  }
}

// Elements of a [rows, H, D] buffer outside its [rows, heads, dim] corner that are no longer all
// 0xFF bytes (the poison).
int64_t touched_outside(const HostTensor& buffer, int64_t heads, int64_t dim) {
  const TensorView& v = buffer.view();
  const int64_t element = dtype_size(v.dtype);
  const auto* bytes = static_cast<const unsigned char*>(v.data);
  int64_t touched = 0;
  for (int64_t i = 0; i < v.numel(); ++i) {
    const int64_t d = v.ndim == 3 ? i % v.shape[2] : 0;
    const int64_t h = v.ndim == 3 ? (i / v.shape[2]) % v.shape[1] : i % v.shape[1];
    if (h < heads && d < dim) continue;
    for (int64_t b = 0; b < element; ++b) touched += bytes[i * element + b] != 0xff ? 1 : 0;
  }
  return touched;
}

TEST(StridedViews, PrefillReadsAndWritesThroughStrides) {
  CaseSpec spec;
  spec.op = OpKind::kPrefill;
  spec.q_dtype = DType::kF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 6;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 32;
  spec.page_size = 4;
  spec.alloc_page_size = 8;
  spec.kv_lens = {9, 30};
  spec.q_lens = {3, 11};
  const uint64_t seed = fresh_seed();
  const AttentionCase c(spec, seed);
  const int64_t rows = c.num_rows(), heads = spec.num_qo_heads, dim = spec.head_dim_qk;

  HostTensor q_buffer(spec.q_dtype, {rows, heads + 2, dim + 16});
  HostTensor out_buffer(spec.q_dtype, {rows, heads + 1, dim + 16});
  HostTensor lse_buffer(DType::kF32, {rows, heads * 2});
  poison(q_buffer.view());
  const TensorView q = corner(q_buffer, rows, heads, dim);
  copy_rows(c.q_tensor().view(), q);
  poison(out_buffer.view());
  poison(lse_buffer.view());

  PrefillArgs args = c.prefill_args();
  args.q = q;
  args.out = corner(out_buffer, rows, heads, dim);
  args.lse = lse_buffer.view();
  args.lse.shape[1] = heads;
  args.lse.strides[1] = 2;

  const std::unique_ptr<Backend> backend = cpu::make_backend();
  const std::unique_ptr<Workspace> workspace = backend->create_workspace({});
  backend->plan(*workspace, c.op_desc(), c.meta());
  backend->run_prefill(*workspace, args);

  std::vector<double> expected_lse;
  const std::vector<double> expected = reference_prefill(c.prefill_args(), &expected_lse);
  EXPECT_EQ(compare_rows(to_doubles(args.out), expected, spec.head_dim_vo,
                         row_tolerance_for(spec.q_dtype), "out"),
            "")
      << "seed " << seed;
  EXPECT_EQ(compare(to_doubles(args.lse), expected_lse, kLseTolerance, "lse"), "")
      << "seed " << seed;
  // Nothing outside the views was written (lse uses every other column: heads * 2 columns).
  EXPECT_EQ(touched_outside(out_buffer, heads, dim), 0);
  int64_t lse_gaps = 0;
  const auto* lse_bytes = static_cast<const unsigned char*>(lse_buffer.view().data);
  for (int64_t i = 0; i < lse_buffer.numel(); ++i) {
    if (i % 2 == 1) lse_gaps += std::memcmp(lse_bytes + i * 4, "\xff\xff\xff\xff", 4) != 0;
  }
  EXPECT_EQ(lse_gaps, 0);
}

}  // namespace
}  // namespace pagedattn::testing
