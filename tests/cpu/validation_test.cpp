// Bad inputs to the CPU backend: each raises a pagedattn::Error that names the argument, and
// writes nothing (the poisoned outputs stay poisoned). Also supports() reasons and the workspace
// / plan contract.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_test_util.h"

namespace pagedattn::testing {
namespace {

CaseSpec small_case(OpKind op) {
  CaseSpec spec;
  spec.op = op;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = is_mla(op) ? 1 : 2;
  spec.head_dim_qk = is_mla(op) ? 80 : 64;
  spec.head_dim_vo = 64;
  spec.page_size = 16;
  spec.kv_lens = {5, 40, 17};
  if (op == OpKind::kPrefill || op == OpKind::kMlaExtend) spec.q_lens = {2, 7, 1};
  return spec;
}

struct BadInput {
  std::string name;
  OpKind op;
  std::function<void(DecodeArgs&, PrefillArgs&, MlaArgs&)> mutate;
  std::string expected;  // a substring of the error message
};

void PrintTo(const BadInput& bad, std::ostream* os) { *os << bad.name; }

int32_t* ints(const TensorView& view) { return view.data_as<int32_t>(); }

std::vector<BadInput> bad_inputs() {
  using D = DecodeArgs;
  using P = PrefillArgs;
  using M = MlaArgs;
  const OpKind dec = OpKind::kDecode, pre = OpKind::kPrefill, mla = OpKind::kMlaDecode,
               ext = OpKind::kMlaExtend;
  return {
      {"SmScaleZero", dec, [](D& a, P&, M&) { a.options.sm_scale = 0; }, "options.sm_scale: 0"},
      {"SmScaleNan", dec, [](D& a, P&, M&) { a.options.sm_scale = NAN; }, "options.sm_scale: nan"},
      {"NegativeSoftCap", dec, [](D& a, P&, M&) { a.options.logits_soft_cap = -1; },
       "options.logits_soft_cap"},
      {"WindowBelowMinusOne", dec, [](D& a, P&, M&) { a.options.window_left = -2; },
       "options.window_left"},
      {"QueryFp8", dec, [](D& a, P&, M&) { a.q.dtype = DType::kFP8E4M3; }, "q: dtype fp8_e4m3"},
      {"HeadDimNotMultipleOf16", dec, [](D& a, P&, M&) { a.q.shape[2] = 60; }, "q: head_dim 60"},
      {"HeadsNotMultipleOfKvHeads", dec, [](D& a, P&, M&) { a.q.shape[1] = 5; },
       "not a multiple of the cache's 2 KV heads"},
      {"QueryOnCuda", dec, [](D& a, P&, M&) { a.q.device = Device::cuda(0); }, "q: on device cuda:0"},
      {"QueryInnerStride", dec, [](D& a, P&, M&) { a.q.strides[2] = 2; }, "q: innermost stride is 2"},
      {"ValueDtypeDiffers", dec, [](D& a, P&, M&) { a.kv.v.dtype = DType::kF16; }, "kv.v: dtype f16"},
      {"ValueHeadsDiffer", dec, [](D& a, P&, M&) { a.kv.v.shape[2] = 1; }, "kv.v: shape [9, 16, 1, 64]"},
      {"PageSizeNotDividing", dec, [](D& a, P&, M&) { a.kv.page_size = 3; }, "kv.page_size: 3"},
      {"PageSizeZero", dec, [](D& a, P&, M&) { a.kv.page_size = 0; }, "kv.page_size: 0"},
      {"ScaleOnBf16Cache", dec, [](D& a, P&, M&) { a.kv.k_scale = 0.5f; }, "kv.k_scale: 0.5"},
      {"OutRows", dec, [](D& a, P&, M&) { a.out.shape[0] = 2; }, "out: shape [2, 8, 64]"},
      {"OutDtype", dec, [](D& a, P&, M&) { a.out.dtype = DType::kF32; }, "out: dtype f32"},
      {"LseDtype", dec, [](D& a, P&, M&) { a.lse.dtype = DType::kBF16; }, "lse: dtype bf16"},
      {"LseShape", dec, [](D& a, P&, M&) { a.lse.shape[1] = 4; }, "lse: shape [3, 4]"},
      {"PageIdTooLarge", dec, [](D& a, P&, M&) { ints(a.meta.kv_indices)[1] = 1000; },
       "meta.kv_indices[1]: page 1000 is out of range"},
      {"PageIdNegative", dec, [](D& a, P&, M&) { ints(a.meta.kv_indices)[0] = -1; },
       "meta.kv_indices[0]: page -1"},
      {"LastPageLenTooLarge", dec, [](D& a, P&, M&) { ints(a.meta.kv_last_page_len)[2] = 17; },
       "meta.kv_last_page_len[2]: 17"},
      {"LastPageLenZero", dec, [](D& a, P&, M&) { ints(a.meta.kv_last_page_len)[0] = 0; },
       "meta.kv_last_page_len[0]: 0"},
      {"KvIndptrDecreases", dec, [](D& a, P&, M&) { ints(a.meta.kv_indptr)[2] = 0; },
       "meta.kv_indptr: decreases"},
      {"KvIndicesTooShort", dec, [](D& a, P&, M&) { a.meta.kv_indices.shape[0] = 2; },
       "meta.kv_indices: 2 entries"},
      {"KvIndptrDtype", dec, [](D& a, P&, M&) { a.meta.kv_indptr.dtype = DType::kI64; },
       "meta.kv_indptr: dtype i64"},
      {"BatchSizeVsRows", dec, [](D& a, P&, M&) { a.meta.batch_size = 2; },
       "expected meta.batch_size = 2"},
      {"DecodeQoIndptrNotIdentity", dec, [](D& a, P&, M&) { ints(a.meta.qo_indptr)[1] = 2; },
       "meta.qo_indptr[1]: 2"},
      {"QoIndptrEndVsRows", pre, [](D&, P& a, M&) { ints(a.meta.qo_indptr)[3] = 9; },
       "meta.qo_indptr[3]: 9 query rows"},
      {"QoIndptrDecreases", pre, [](D&, P& a, M&) { ints(a.meta.qo_indptr)[2] = 1; },
       "meta.qo_indptr: decreases"},
      // q_len > kv_len (qo_indptr 0, 6, 9, 10 over kv_lens 5, 40, 17): request 0's 6 rows would
      // sit before its first key; the planner rejects the same step.
      {"PrefillQLenOverKvLen", pre, [](D&, P& a, M&) { ints(a.meta.qo_indptr)[1] = 6; },
       "request 0 has 6 query rows (qo_indptr[0..1] = 0, 6) but 5 KV tokens"},
      {"MaxQLenBelowAQLen", pre, [](D&, P& a, M&) { a.meta.max_q_len = 3; },
       "meta.max_q_len: 3, but request 1 has 7 query rows"},
      {"PrefillValueHeadDim", pre, [](D&, P& a, M&) { a.kv.v.shape[3] = 40; }, "kv.v: head_dim 40"},
      {"MlaQPeHeads", mla, [](D&, P&, M& a) { a.q_pe.shape[1] = 4; }, "q_pe: shape [3, 4, 16]"},
      {"MlaQNopeDim", mla, [](D&, P&, M& a) { a.q_nope.shape[2] = 48; },
       "q_nope: last dimension 48"},
      {"MlaKpeDtype", mla, [](D&, P&, M& a) { a.kv.kpe.dtype = DType::kF32; }, "kv.kpe: dtype f32"},
      {"MlaSmScale", mla, [](D&, P&, M& a) { a.sm_scale = -1; }, "sm_scale: -1"},
      {"MlaExtendQLenOverKvLen", ext, [](D&, P&, M& a) { ints(a.meta.qo_indptr)[1] = 6; },
       "request 0 has 6 query rows (qo_indptr[0..1] = 0, 6) but 5 KV tokens"},
      {"MlaPageId", mla, [](D&, P&, M& a) { ints(a.meta.kv_indices)[2] = 999; },
       "meta.kv_indices[2]: page 999"},
  };
}

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, RaisesAndWritesNothing) {
  const BadInput& bad = GetParam();
  const AttentionCase c(small_case(bad.op), fresh_seed());
  const std::unique_ptr<Backend> backend = cpu::make_backend();
  const std::unique_ptr<Workspace> workspace = backend->create_workspace({});
  backend->plan(*workspace, c.op_desc(), c.meta());
  poison(c.out());
  poison(c.lse());
  DecodeArgs d = c.decode_args();
  PrefillArgs p = c.prefill_args();
  MlaArgs m = c.mla_args();
  bad.mutate(d, p, m);
  try {
    switch (bad.op) {
      case OpKind::kDecode:
        backend->run_decode(*workspace, d);
        break;
      case OpKind::kPrefill:
        backend->run_prefill(*workspace, p);
        break;
      default:
        backend->run_mla(*workspace, m);
        break;
    }
    ADD_FAILURE() << "no error for " << bad.name;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(bad.expected), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << bad.expected;
  }
  EXPECT_TRUE(still_poisoned(c.out())) << "out was written";
  EXPECT_TRUE(still_poisoned(c.lse())) << "lse was written";
}

INSTANTIATE_TEST_SUITE_P(Cpu, BadInputTest, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

TEST(CpuWorkspaceContract, RunWithoutPlanOrWithAStalePlan) {
  const AttentionCase c(small_case(OpKind::kDecode), fresh_seed());
  const std::unique_ptr<Backend> backend = cpu::make_backend();
  const std::unique_ptr<Workspace> workspace = backend->create_workspace({});
  poison(c.out());
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, c.decode_args()); },
                             {"workspace: no plan", "plan()"}),
            "");
  const AttentionCase other(small_case(OpKind::kPrefill), fresh_seed());
  backend->plan(*workspace, other.op_desc(), other.meta());
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, c.decode_args()); },
                             {"workspace: planned for prefill", "called for decode"}),
            "");
  EXPECT_TRUE(still_poisoned(c.out()));
  // Same op and totals, but the pages moved between requests since plan(): stale.
  backend->plan(*workspace, c.op_desc(), c.meta());
  DecodeArgs moved = c.decode_args();
  int32_t* kv_indptr = moved.meta.kv_indptr.data_as<int32_t>();
  kv_indptr[1] += 1;
  ints(moved.meta.kv_last_page_len)[0] = 16;
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, moved); },
                             {"other per-request lengths"}),
            "");
  EXPECT_TRUE(still_poisoned(c.out()));

  class OtherWorkspace : public Workspace {};
  OtherWorkspace foreign;
  EXPECT_EQ(error_containing([&] { backend->plan(foreign, c.op_desc(), c.meta()); },
                             {"workspace: not a cpu workspace"}),
            "");
}

TEST(CpuWorkspaceContract, PlanBeyondLimits) {
  const AttentionCase c(small_case(OpKind::kDecode), fresh_seed());
  const std::unique_ptr<Backend> backend = cpu::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = 2;
  const std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  EXPECT_EQ(error_containing([&] { backend->plan(*workspace, c.op_desc(), c.meta()); },
                             {"meta.batch_size: 3", "limits.max_batch = 2"}),
            "");
  limits = {};
  limits.max_qo_heads = 4;
  EXPECT_EQ(error_containing(
                [&] { backend->plan(*backend->create_workspace(limits), c.op_desc(), c.meta()); },
                {"op.num_qo_heads: 8", "limits.max_qo_heads 4"}),
            "");
}

TEST(CpuSupports, ReasonsNameTheValue) {
  const std::unique_ptr<Backend> backend = cpu::make_backend();
  EXPECT_EQ(backend->name(), "cpu");
  EXPECT_EQ(backend->device_type(), DeviceType::kCPU);
  EXPECT_FALSE(backend->describe().empty());
  OpDesc op;
  EXPECT_TRUE(backend->supports(op)) << backend->supports(op).reason;
  auto reason = [&](auto&& change) {
    OpDesc o;
    change(o);
    const Support s = backend->supports(o);
    EXPECT_FALSE(s.ok);
    return s.reason;
  };
  EXPECT_NE(reason([](OpDesc& o) { o.device = Device::cuda(0); }).find("cuda:0"),
            std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.q_dtype = DType::kFP8E4M3; }).find("fp8_e4m3"),
            std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.kv_dtype = DType::kI32; }).find("i32"), std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.head_dim_qk = o.head_dim_vo = 100; }).find("100"),
            std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.head_dim_qk = o.head_dim_vo = 640; }).find("640"),
            std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.num_qo_heads = 30; }).find("30"), std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) { o.head_dim_qk = 192; }).find("192"), std::string::npos);
  EXPECT_NE(reason([](OpDesc& o) {
              o.op = OpKind::kMlaDecode;
              o.num_kv_heads = 8;
            }).find("8 KV heads"),
            std::string::npos);
  OpDesc prefill;
  prefill.op = OpKind::kPrefill;
  prefill.head_dim_qk = 192;
  EXPECT_TRUE(backend->supports(prefill));
  OpDesc mla;
  mla.op = OpKind::kMlaExtend;
  mla.num_qo_heads = 128;
  mla.num_kv_heads = 1;
  mla.head_dim_qk = 576;
  mla.head_dim_vo = 512;
  mla.page_size = 1;
  EXPECT_TRUE(backend->supports(mla)) << backend->supports(mla).reason;
  OpDesc bad = mla;
  bad.num_kv_heads = 2;
  EXPECT_EQ(error_containing([&] { backend->plan(*backend->create_workspace({}), bad, {}); },
                             {"cannot run mla_extend", "MLA with 2 KV heads"}),
            "");
}

}  // namespace
}  // namespace pagedattn::testing
