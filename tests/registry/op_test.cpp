// Operation names, OpDesc::str, and describe_op deriving an OpDesc from a call's tensors.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "pagedattn/backend.h"
#include "pagedattn/error.h"

namespace pagedattn {
namespace {

// Views carry shapes only: describe_op never reads data.
TensorView shaped(DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return TensorView::contiguous(nullptr, dtype, shape, device);
}

TEST(Op, Names) {
  EXPECT_EQ(op_name(OpKind::kDecode), "decode");
  EXPECT_EQ(op_name(OpKind::kPrefill), "prefill");
  EXPECT_EQ(op_name(OpKind::kMlaDecode), "mla_decode");
  EXPECT_EQ(op_name(OpKind::kMlaExtend), "mla_extend");
  EXPECT_TRUE(is_decode_like(OpKind::kMlaDecode));
  EXPECT_FALSE(is_decode_like(OpKind::kMlaExtend));
}

TEST(Op, DescribeDecodeFromTensors) {
  DecodeArgs args;
  const Device gpu = Device::cuda(1);
  args.q = shaped(DType::kF16, {4, 32, 128}, gpu);
  args.kv.k = shaped(DType::kFP8E4M3, {100, 8, 64, 128}, gpu);  // HND: [pages, Hkv, A, D]
  args.kv.v = shaped(DType::kFP8E4M3, {100, 8, 64, 128}, gpu);
  args.kv.layout = KvLayout::kHND;
  args.kv.page_size = 16;
  args.options.logits_soft_cap = 30.0f;
  const OpDesc op = describe_op(args);
  EXPECT_EQ(op.op, OpKind::kDecode);
  EXPECT_EQ(op.device, gpu);
  EXPECT_EQ(op.q_dtype, DType::kF16);
  EXPECT_EQ(op.kv_dtype, DType::kFP8E4M3);
  EXPECT_EQ(op.num_qo_heads, 32);
  EXPECT_EQ(op.num_kv_heads, 8);
  EXPECT_EQ(op.head_dim_qk, 128);
  EXPECT_EQ(op.head_dim_vo, 128);
  EXPECT_EQ(op.page_size, 16);
  EXPECT_EQ(op.layout, KvLayout::kHND);
  EXPECT_TRUE(op.soft_cap);
  EXPECT_FALSE(op.sliding_window);
  EXPECT_EQ(op.str(),
            "decode on cuda:1: q f16, kv fp8_e4m3, heads 32/8, head_dim 128/128, page_size 16, "
            "HND, soft_cap");
}

TEST(Op, DescribePrefillFromTensors) {
  PrefillArgs args;
  args.q = shaped(DType::kBF16, {77, 16, 192}, Device::cpu());
  args.kv.k = shaped(DType::kBF16, {10, 64, 4, 192}, Device::cpu());  // NHD
  args.kv.v = shaped(DType::kBF16, {10, 64, 4, 128}, Device::cpu());
  args.kv.page_size = 64;
  args.options.window_left = 128;
  args.options.causal = true;
  const OpDesc op = describe_op(args);
  EXPECT_EQ(op.op, OpKind::kPrefill);
  EXPECT_EQ(op.num_kv_heads, 4);
  EXPECT_EQ(op.head_dim_qk, 192);
  EXPECT_EQ(op.head_dim_vo, 128);
  EXPECT_TRUE(op.sliding_window);
  EXPECT_EQ(op.str(),
            "prefill on cpu: q bf16, kv bf16, heads 16/4, head_dim 192/128, page_size 64, NHD, "
            "causal, sliding_window");
}

TEST(Op, DescribeMlaFromTensors) {
  MlaArgs args;
  args.q_nope = shaped(DType::kBF16, {8, 128, 512}, Device::cpu());
  args.q_pe = shaped(DType::kBF16, {8, 128, 64}, Device::cpu());
  args.kv.ckv = shaped(DType::kBF16, {50, 64, 512}, Device::cpu());
  args.kv.kpe = shaped(DType::kBF16, {50, 64, 64}, Device::cpu());
  args.kv.page_size = 64;
  const OpDesc op = describe_op(args, OpKind::kMlaDecode);
  EXPECT_EQ(op.op, OpKind::kMlaDecode);
  EXPECT_EQ(op.num_qo_heads, 128);
  EXPECT_EQ(op.num_kv_heads, 1);
  EXPECT_EQ(op.head_dim_qk, 576);
  EXPECT_EQ(op.head_dim_vo, 512);
  EXPECT_EQ(op.str(),
            "mla_decode on cpu: q bf16, kv bf16, heads 128/1, head_dim 576/512, page_size 64");
  EXPECT_EQ(testing::error_containing([&] { describe_op(args, OpKind::kDecode); },
                                      {"operation decode is not an MLA operation"}),
            "");
}

TEST(Op, DescribeRejectsMissingTensors) {
  DecodeArgs args;  // q absent
  try {
    describe_op(args);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("q has shape"), std::string::npos) << error.what();
  }
  PrefillArgs prefill;
  prefill.q = shaped(DType::kBF16, {1, 1, 64}, Device::cpu());
  EXPECT_EQ(testing::error_containing([&] { describe_op(prefill); },  // no cache
                                      {"describe_op: kv.k has shape [] (0 dimensions)"}),
            "");
}

}  // namespace
}  // namespace pagedattn
