// The cuda_generic backend (src/cuda/generic/) against the float64 reference: decode, prefill /
// extend and MLA over the shared paged cases (tests/common/cases.h: shuffled pages, NaN in every
// slot that holds no token), on the shapes the tuned "cuda" kernels do not serve (head dims 16 /
// 32 / 48 / 80, MLA 32 + 16, f32 q and KV) and on a few they do (bf16, head_dim 128, MLA 512 +
// 64, where auto picks "cuda": the two backends agree there). Every element of out and lse is
// compared; the kernel accumulates in f32 with exact (unrounded) probabilities, so the CPU's
// tolerances apply. Also: auto selection falls back to cuda_generic only where "cuda" says no,
// and supports() names what it cannot run. Skips without a GPU (CI).
#include "cuda/generic/generic.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cases.h"
#include "common/test_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/registry.h"
#include "reference/reference.h"

namespace pagedattn::testing {
namespace {

const Backend& generic_backend() {
  static const std::unique_ptr<Backend> backend = cuda::make_generic_backend();
  return *backend;
}

// A case's inputs, metadata and poisoned outputs on the device.
struct DeviceCase {
  explicit DeviceCase(const AttentionCase& c) : host(&c) {
    const OpKind op = c.spec().op;
    if (is_mla(op)) {
      const MlaArgs h = c.mla_args();
      q = DeviceTensor(h.q_nope);
      q_pe = DeviceTensor(h.q_pe);
      k = DeviceTensor(c.latent_tensor().view());  // [pages, alloc, rank + rope]
      out = DeviceTensor::poisoned_like(h.out);
      if (h.lse.defined()) lse = DeviceTensor::poisoned_like(h.lse);
    } else {
      const PrefillArgs h = op == OpKind::kDecode ? PrefillArgs{} : c.prefill_args();
      const DecodeArgs d = op == OpKind::kDecode ? c.decode_args() : DecodeArgs{};
      q = DeviceTensor(op == OpKind::kDecode ? d.q : h.q);
      k = DeviceTensor(op == OpKind::kDecode ? d.kv.k : h.kv.k);
      v = DeviceTensor(op == OpKind::kDecode ? d.kv.v : h.kv.v);
      out = DeviceTensor::poisoned_like(op == OpKind::kDecode ? d.out : h.out);
      const TensorView& lse_host = op == OpKind::kDecode ? d.lse : h.lse;
      if (lse_host.defined()) lse = DeviceTensor::poisoned_like(lse_host);
    }
    qo_indptr = DeviceTensor(c.meta().qo_indptr);
    kv_indptr = DeviceTensor(c.meta().kv_indptr);
    kv_indices = DeviceTensor(c.meta().kv_indices);
    kv_last_page_len = DeviceTensor(c.meta().kv_last_page_len);
  }

  StepMetadata meta() const {
    StepMetadata m = host->meta();
    m.qo_indptr = qo_indptr.view();
    m.kv_indptr = kv_indptr.view();
    m.kv_indices = kv_indices.view();
    m.kv_last_page_len = kv_last_page_len.view();
    return m;
  }

  // Plans and runs the case on `backend`, then waits.
  void run(const Backend& backend) const {
    WorkspaceLimits limits;
    limits.max_batch = std::max<int32_t>(64, host->batch_size());
    limits.max_qo_rows = std::max<int64_t>(1024, host->num_rows());
    std::unique_ptr<Workspace> workspace = backend.create_workspace(limits);
    OpDesc op = host->op_desc();
    op.device = Device::cuda(0);
    backend.plan(*workspace, op, meta());
    switch (op.op) {
      case OpKind::kDecode: {
        DecodeArgs a = host->decode_args();
        a.q = q.view(), a.kv.k = k.view(), a.kv.v = v.view(), a.out = out.view();
        a.lse = a.lse.defined() ? lse.view() : TensorView{};
        a.meta = meta();
        backend.run_decode(*workspace, a);
        break;
      }
      case OpKind::kPrefill: {
        PrefillArgs a = host->prefill_args();
        a.q = q.view(), a.kv.k = k.view(), a.kv.v = v.view(), a.out = out.view();
        a.lse = a.lse.defined() ? lse.view() : TensorView{};
        a.meta = meta();
        backend.run_prefill(*workspace, a);
        break;
      }
      default: {
        MlaArgs a = host->mla_args();
        a.q_nope = q.view(), a.q_pe = q_pe.view(), a.out = out.view();
        a.lse = a.lse.defined() ? lse.view() : TensorView{};
        // ckv and kpe: two slices of each token's row of the device latent buffer.
        a.kv.ckv = k.view();
        a.kv.ckv.shape[2] = host->spec().head_dim_vo;
        a.kv.kpe = k.view();
        a.kv.kpe.shape[2] = host->spec().head_dim_qk - host->spec().head_dim_vo;
        a.kv.kpe.data = static_cast<char*>(k.view().data) +
                        host->spec().head_dim_vo * dtype_size(k.view().dtype);
        a.meta = meta();
        backend.run_mla(*workspace, a);
      }
    }
    PA_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // out (and lse) back into the case's host buffers, as doubles.
  std::vector<double> fetch_out() const {
    poison(host->out());
    out.copy_to(host->out());
    return to_doubles(host->out());
  }
  std::vector<double> fetch_lse() const {
    if (!host->lse().defined()) return {};
    poison(host->lse());
    lse.copy_to(host->lse());
    return to_doubles(host->lse());
  }

  const AttentionCase* host;
  DeviceTensor q, q_pe, k, v, out, lse, qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

std::string check_generic(const CaseSpec& spec, uint64_t seed) {
  const AttentionCase c(spec, seed);
  const DeviceCase device_case(c);
  device_case.run(generic_backend());
  const std::vector<double> got = device_case.fetch_out();
  const std::vector<double> got_lse = device_case.fetch_lse();
  std::vector<double> expected_lse;
  const std::vector<double> expected = c.reference(&expected_lse);
  std::string report = compare(got, expected, tolerance_for(spec.q_dtype), "out vs reference");
  const auto append = [&report](const std::string& r) {
    if (!r.empty()) report += (report.empty() ? "" : "\n") + r;
  };
  append(compare_rows(got, expected, spec.head_dim_vo, row_tolerance_for(spec.q_dtype),
                      "out vs reference (relative to the row)"));
  if (c.lse().defined()) append(compare(got_lse, expected_lse, kLseTolerance, "lse vs reference"));
  if (report.empty()) return report;
  return spec.name() + " (seed " + std::to_string(seed) + ")\n" + report;
}

CaseSpec base(OpKind op, DType q, DType kv, int32_t dim) {
  CaseSpec spec;
  spec.op = op;
  spec.q_dtype = q;
  spec.kv_dtype = kv;
  spec.num_qo_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = dim;
  spec.page_size = 16;
  if (op == OpKind::kDecode) {
    spec.kv_lens = {1, 15, 16, 17, 300};
  } else {
    spec.kv_lens = {5, 40, 200};
    spec.q_lens = {5, 7, 130};  // one whole prompt, two extends over a cached prefix
  }
  return with_power(spec);
}

CaseSpec base_mla(OpKind op, DType dtype, int32_t rank, int32_t rope, int32_t heads) {
  CaseSpec spec;
  spec.op = op;
  spec.q_dtype = spec.kv_dtype = dtype;
  spec.num_qo_heads = heads;
  spec.num_kv_heads = 1;
  spec.head_dim_qk = rank + rope;
  spec.head_dim_vo = rank;
  spec.page_size = 16;
  if (op == OpKind::kMlaDecode) {
    spec.kv_lens = {1, 17, 300};
  } else {
    spec.kv_lens = {9, 60};
    spec.q_lens = {9, 20};
  }
  return with_power(spec);
}

std::vector<CaseSpec> generic_cases() {
  std::vector<CaseSpec> cases;
  for (OpKind op : {OpKind::kDecode, OpKind::kPrefill}) {
    cases.push_back(base(op, DType::kF32, DType::kF32, 16));  // the tiny fixtures' shapes, f32
    cases.push_back(base(op, DType::kBF16, DType::kBF16, 32));
    cases.push_back(base(op, DType::kF16, DType::kF16, 48));
    cases.push_back(base(op, DType::kBF16, DType::kBF16, 128));  // a shape "cuda" serves too
    {
      CaseSpec spec = base(op, DType::kF16, DType::kFP8E4M3, 80);
      spec.kv_scale = 0.25f;
      cases.push_back(spec);
    }
    {
      CaseSpec spec = base(op, DType::kF32, DType::kBF16, 16);  // HND, allocation pages of 4 P
      spec.layout = KvLayout::kHND;
      spec.page_size = 4;
      spec.alloc_page_size = 16;
      cases.push_back(spec);
    }
    {
      CaseSpec spec = base(op, DType::kF32, DType::kF32, 16);  // page size 1, group 4
      spec.page_size = 1;
      spec.num_qo_heads = 8;
      cases.push_back(spec);
    }
    {
      CaseSpec spec = base(op, DType::kF32, DType::kF32, 16);  // soft-cap and window
      spec.logits_soft_cap = 5.0f;
      spec.window_left = 37;
      cases.push_back(spec);
    }
    {
      CaseSpec spec = base(op, DType::kBF16, DType::kBF16, 32);  // padding requests
      spec.padded_batch = 8;
      cases.push_back(spec);
    }
  }
  {
    CaseSpec spec = base(OpKind::kPrefill, DType::kF32, DType::kF32, 16);  // not causal
    spec.causal = false;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base(OpKind::kDecode, DType::kF32, DType::kF32, 16);  // every request empty
    spec.kv_lens = {0, 0, 0};
    cases.push_back(spec);
  }
  for (OpKind op : {OpKind::kMlaDecode, OpKind::kMlaExtend}) {
    cases.push_back(base_mla(op, DType::kF32, 32, 16, 4));     // the tiny DeepSeek fixtures
    cases.push_back(base_mla(op, DType::kBF16, 512, 64, 16));  // DeepSeek's widths
  }
  return cases;
}

class CudaGenericTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaGenericTest, MatchesReference) {
  PA_REQUIRE_GPU();
  EXPECT_EQ(check_generic(GetParam(), fresh_seed()), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGenericTest, ::testing::ValuesIn(generic_cases()),
                         [](const auto& info) {
                           return info.param.name() + "_c" + std::to_string(info.index);
                         });

// auto takes the tuned kernels where they apply and the generic one elsewhere; "cuda" explicit
// still refuses the odd shapes.
TEST(CudaGeneric, AutoFallsBackOnlyWhereCudaCannotServe) {
  PA_REQUIRE_GPU();
  const Registry& registry = Registry::builtin();
  OpDesc op;
  op.op = OpKind::kDecode;
  op.device = Device::cuda(0);
  op.q_dtype = op.kv_dtype = DType::kBF16;
  op.num_qo_heads = 8;
  op.num_kv_heads = 2;
  op.head_dim_qk = op.head_dim_vo = 128;
  EXPECT_EQ(select_backend(registry, Selection::parse("auto"), op).name(), "cuda");
  op.head_dim_qk = op.head_dim_vo = 32;
  EXPECT_EQ(select_backend(registry, Selection::parse("auto"), op).name(), "cuda_generic");
  EXPECT_THROW(select_backend(registry, Selection::parse("cuda"), op), Error);
  op.head_dim_qk = op.head_dim_vo = 128;
  op.q_dtype = op.kv_dtype = DType::kF32;
  EXPECT_EQ(select_backend(registry, Selection::parse("auto"), op).name(), "cuda_generic");
  op.op = OpKind::kMlaDecode;
  op.num_kv_heads = 1;
  op.q_dtype = op.kv_dtype = DType::kBF16;
  op.head_dim_qk = 576;
  op.head_dim_vo = 512;
  EXPECT_EQ(select_backend(registry, Selection::parse("auto"), op).name(), "cuda");
  op.head_dim_qk = 48;
  op.head_dim_vo = 32;
  EXPECT_EQ(select_backend(registry, Selection::parse("auto"), op).name(), "cuda_generic");
}

TEST(CudaGeneric, SupportsSaysWhy) {
  PA_REQUIRE_GPU();
  OpDesc op;
  op.device = Device::cuda(0);
  op.q_dtype = DType::kFP8E4M3;
  Support s = generic_backend().supports(op);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("q dtype fp8_e4m3"), std::string::npos) << s.reason;
  op.q_dtype = DType::kBF16;
  op.head_dim_qk = op.head_dim_vo = 4096;
  s = generic_backend().supports(op);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("4096"), std::string::npos) << s.reason;
  op.head_dim_qk = op.head_dim_vo = 64;
  op.num_qo_heads = 6;
  op.num_kv_heads = 4;
  s = generic_backend().supports(op);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("6 query heads over 4"), std::string::npos) << s.reason;
  op.device = Device::cpu();
  op.num_kv_heads = 2;
  EXPECT_FALSE(generic_backend().supports(op).ok);
}

}  // namespace
}  // namespace pagedattn::testing
