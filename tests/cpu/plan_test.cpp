// The CPU backend's work partition (cpu_plan.h) on the benchmark's shapes: how many threads a step
// wakes (work-based: small steps few, large steps all), whether NHD decode units cover all KV
// heads, and that a B = 16 step still gives every thread several units by splitting the KV.
// Correctness of every partition is checked against the float64 reference in decode_test.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "cpu/cpu_plan.h"
#include "pagedattn/backend.h"

namespace pagedattn::testing {
namespace {

// Plans a decode step of `batch` requests of kv_len tokens (32/8 heads, head_dim 128, bf16) from
// metadata alone: the partition never reads the cache.
cpu::CpuPlan plan_for(int32_t batch, int32_t kv_len, int32_t page, KvLayout layout,
                      int32_t threads) {
  const int32_t pages_each = (kv_len + page - 1) / page;
  std::vector<int32_t> kv_indptr(static_cast<size_t>(batch) + 1), last(static_cast<size_t>(batch));
  std::vector<int32_t> kv_indices(static_cast<size_t>(batch) * pages_each);
  for (int32_t r = 0; r < batch; ++r) {
    kv_indptr[r + 1] = (r + 1) * pages_each;
    last[r] = kv_len - (pages_each - 1) * page;
  }
  for (size_t i = 0; i < kv_indices.size(); ++i) kv_indices[i] = static_cast<int32_t>(i);
  StepMetadata meta;
  meta.batch_size = batch;
  meta.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::kI32, {batch + 1});
  meta.kv_indices = TensorView::contiguous(kv_indices.data(), DType::kI32,
                                           {static_cast<int64_t>(kv_indices.size())});
  meta.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {batch});
  OpDesc op;  // decode, 32/8 heads, head_dim 128, bf16
  op.page_size = page;
  op.layout = layout;
  WorkspaceLimits limits;
  limits.max_batch = batch;
  limits.max_qo_rows = batch;
  limits.max_pages = static_cast<int64_t>(kv_indices.size());
  limits.max_qo_heads = op.num_qo_heads;
  limits.max_head_dim = op.head_dim_qk;
  cpu::CpuWorkspace workspace(limits, threads);
  cpu::build_plan(workspace, op, meta);
  return workspace.plan;
}

TEST(CpuPlan, SmallStepsWakeFewThreads) {
  // 1 x 16 tokens x 8 heads x 2 x 128 x 2 bytes = 64 KiB of KV: one thread.
  EXPECT_EQ(plan_for(1, 16, 16, KvLayout::kNHD, 16).threads, 1);
  // 2 x 64 tokens: 512 KiB, two threads (one per cpu::kMinWorkPerThread).
  EXPECT_EQ(plan_for(2, 64, 16, KvLayout::kNHD, 16).threads, 2);
  EXPECT_EQ(plan_for(2, 64, 16, KvLayout::kHND, 16).threads, 2);
}

TEST(CpuPlan, LargeStepsUseEveryThread) {
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
    for (int32_t batch : {1, 16}) {
      const cpu::CpuPlan plan = plan_for(batch, 4096, 16, layout, 16);
      EXPECT_EQ(plan.threads, 16) << batch;
      const int64_t units = int64_t{plan.num_items} * (plan.kv_heads / plan.heads_per_unit);
      EXPECT_GE(units, 2 * 16) << "B " << batch << ": too few units to balance 16 threads";
    }
  }
}

TEST(CpuPlan, NhdDecodeUnitsCoverAllKvHeads) {
  EXPECT_EQ(plan_for(16, 4096, 16, KvLayout::kNHD, 16).heads_per_unit, 8);
  EXPECT_EQ(plan_for(16, 4096, 1, KvLayout::kHND, 16).heads_per_unit, 8);  // P 1: same bytes
  EXPECT_EQ(plan_for(16, 4096, 16, KvLayout::kHND, 16).heads_per_unit, 1);
}

}  // namespace
}  // namespace pagedattn::testing
