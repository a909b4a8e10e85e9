// The GPU planner (include/pagedattn/cuda_planner.h) against the host planner (planner.h): random
// engine batches (tests/planner/batch_maker.h: shuffled pages, corner lengths) in both table forms,
// decode and prefill, P dividing A, padding, batches larger than one scan block; every output entry
// must be equal. The split-KV partition against split_kv_partition() for several configurations.
// Bad tables are reported through the status word.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "common/test_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "cuda/workspace.h"
#include "pagedattn/cuda_planner.h"
#include "planner/batch_maker.h"

namespace pagedattn::testing {
namespace {

struct GpuPlanCase {
  bool slot_form;
  bool prefill;
  int32_t page_size;
  int32_t alloc_page_size;
  int32_t num_reqs;
  int32_t padding;
  std::string name() const {
    return fmt::format("{}_{}_P{}_A{}_n{}_pad{}", slot_form ? "slots" : "blocks",
                       prefill ? "prefill" : "decode", page_size, alloc_page_size, num_reqs,
                       padding);
  }
};

std::vector<int32_t> device_to_host(const DeviceTensor& tensor, int64_t count) {
  std::vector<int32_t> host(static_cast<size_t>(count));
  if (count > 0) {
    PA_CUDA_CHECK(cudaMemcpy(host.data(), tensor.view().data, count * sizeof(int32_t),
                             cudaMemcpyDeviceToHost));
  }
  return host;
}

std::vector<int32_t> head(const std::vector<int32_t>& values, int64_t count) {
  return {values.begin(), values.begin() + count};
}

struct DevicePlan {
  DeviceTensor qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens, status;
  DevicePlan(int32_t batch, int64_t max_pages)
      : qo_indptr(DeviceTensor::from_vector(std::vector<int32_t>(batch + 1, -1))),
        kv_indptr(DeviceTensor::from_vector(std::vector<int32_t>(batch + 1, -1))),
        kv_indices(
            DeviceTensor::from_vector(std::vector<int32_t>(std::max<int64_t>(1, max_pages), -1))),
        kv_last_page_len(DeviceTensor::from_vector(std::vector<int32_t>(std::max(1, batch), -1))),
        kv_lens(DeviceTensor::from_vector(std::vector<int32_t>(std::max(1, batch), -1))),
        status(DeviceTensor::from_vector(std::vector<int32_t>(4, -1))) {}
  cuda::DevicePlanBuffers buffers() const {
    return {qo_indptr.view(),        kv_indptr.view(), kv_indices.view(),
            kv_last_page_len.view(), kv_lens.view(),   status.view()};
  }
};

TensorView table_view(const DeviceTensor& flat, int32_t rows, int64_t stride) {
  TensorView view = flat.view();
  view.ndim = 2;
  view.shape = {rows, stride};
  view.strides = {stride, 1};
  return view;
}

class GpuPlannerTest : public ::testing::TestWithParam<GpuPlanCase> {};

TEST_P(GpuPlannerTest, EqualsHostPlanner) {
  PA_REQUIRE_GPU();
  const GpuPlanCase& p = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  const EngineBatch batch = make_batch(
      rng, p.alloc_page_size, corner_lengths(rng, p.num_reqs, p.alloc_page_size), p.prefill);
  const int32_t padded = p.padding > 0 ? p.num_reqs + p.padding : 0;
  const int32_t b = padded > 0 ? padded : p.num_reqs;
  const PlanInput input = batch.input(p.slot_form, p.page_size, padded);
  int64_t total_pages = 0;
  for (int32_t len : batch.seq_lens) total_pages += (len + p.page_size - 1) / p.page_size;
  PlanStorage host(b, std::max<int64_t>(1, total_pages));
  const PlanSummary summary = plan(input, host.buffers());

  const DeviceTensor table =
      DeviceTensor::from_vector(p.slot_form ? batch.slots : batch.block_table);
  const DeviceTensor seq_lens = DeviceTensor::from_vector(batch.seq_lens);
  const DeviceTensor q_lens = p.prefill ? DeviceTensor::from_vector(batch.q_lens) : DeviceTensor();
  DevicePlan device(b, total_pages);
  cuda::DevicePlanInput in;
  in.table = table_view(table, p.num_reqs, p.slot_form ? batch.slot_stride : batch.block_stride);
  in.slot_table = p.slot_form;
  in.seq_lens = seq_lens.view();
  if (p.prefill) in.q_lens = q_lens.view();
  in.num_reqs = p.num_reqs;
  in.alloc_page_size = p.alloc_page_size;
  in.page_size = p.page_size;
  in.num_alloc_pages = batch.num_alloc_pages;
  in.padded_batch = padded;
  cuda::plan_on_device(in, device.buffers(), nullptr);
  cuda::read_plan_status(device.status.view(), nullptr);

  EXPECT_EQ(device_to_host(device.qo_indptr, b + 1), head(host.qo_indptr, b + 1));
  EXPECT_EQ(device_to_host(device.kv_indptr, b + 1), head(host.kv_indptr, b + 1));
  EXPECT_EQ(device_to_host(device.kv_last_page_len, b), head(host.kv_last_page_len, b));
  EXPECT_EQ(device_to_host(device.kv_lens, b), head(host.kv_lens, b));
  EXPECT_EQ(device_to_host(device.kv_indices, summary.num_pages),
            head(host.kv_indices, summary.num_pages));

  // The split-KV partition of that plan.
  const std::vector<int32_t> indptr = head(host.kv_indptr, b + 1);
  for (const SplitKvConfig config : {SplitKvConfig{true, 132, 1}, SplitKvConfig{true, 7, 2},
                                     SplitKvConfig{true, 1, 1}, SplitKvConfig{false, 132, 1}}) {
    SCOPED_TRACE(fmt::format("split enable {} target {} min_chunk {}", config.enable,
                             config.target_items, config.min_chunk_pages));
    const int64_t capacity = split_kv_capacity(b, summary.num_pages, config);
    std::vector<int32_t> work_request(capacity), work_chunk(capacity), merge(b + 1);
    const SplitKvSummary expected =
        split_kv_partition(indptr, b, config, {work_request, work_chunk, merge});
    DeviceTensor d_request = DeviceTensor::from_vector(std::vector<int32_t>(capacity, -1));
    DeviceTensor d_chunk = DeviceTensor::from_vector(std::vector<int32_t>(capacity, -1));
    DeviceTensor d_merge = DeviceTensor::from_vector(std::vector<int32_t>(b + 1, -1));
    DeviceTensor d_info = DeviceTensor::from_vector(std::vector<int32_t>(4, -1));
    cuda::split_kv_on_device(device.kv_indptr.view(), b, config,
                             {d_request.view(), d_chunk.view(), d_merge.view(), d_info.view()},
                             nullptr);
    const std::vector<int32_t> info = device_to_host(d_info, 4);
    EXPECT_EQ(info[0], expected.num_items);
    EXPECT_EQ(info[1], expected.chunk_pages);
    EXPECT_EQ(info[2] != 0, expected.any_split);
    EXPECT_EQ(info[3], 0);
    EXPECT_EQ(device_to_host(d_request, expected.num_items),
              head(work_request, expected.num_items));
    EXPECT_EQ(device_to_host(d_chunk, expected.num_items), head(work_chunk, expected.num_items));
    EXPECT_EQ(device_to_host(d_merge, b + 1), merge);
  }
}

std::vector<GpuPlanCase> gpu_plan_cases() {
  std::vector<GpuPlanCase> cases;
  for (bool slot_form : {false, true}) {
    for (bool prefill : {false, true}) {
      for (auto [page, alloc] : {std::pair{1, 1}, {16, 16}, {1, 16}, {4, 16}, {3, 12}, {64, 64}}) {
        cases.push_back({slot_form, prefill, page, alloc, 37, prefill ? 0 : 5});
      }
    }
  }
  cases.push_back({false, false, 16, 16, 1, 0});
  cases.push_back({false, false, 16, 16, 2500, 30});  // several scan blocks
  cases.push_back({true, true, 4, 16, 1500, 0});
  cases.push_back({false, false, 16, 16, 0, 4});  // only padding
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuPlannerTest, ::testing::ValuesIn(gpu_plan_cases()),
                         [](const auto& info) { return info.param.name(); });

// The decode split target is host arithmetic (no device needed): the H200's 132 SMs x 2 slots
// over 8 KV heads are 33 items; a batch below that gets a multiple of itself, so requests of one
// length split into equal chunks (16 x 8192 at P 16: 32 items of 256 pages, one wave), and a batch
// of 33 or more is the slot count.
TEST(DecodeSplitTarget, FillsOneWaveWithEqualChunks) {
  struct Case {
    int32_t sms, qo_heads, kv_heads, batch, target;
  };
  for (const Case& c : {
           Case{132, 32, 8, 1, 33},
           Case{132, 32, 8, 16, 32},
           Case{132, 32, 8, 10, 30},
           Case{132, 32, 8, 17, 17},
           Case{132, 32, 8, 33, 33},
           Case{132, 32, 8, 64, 33},
           Case{132, 32, 8, 0, 33},
           // MHA: 32 CTAs an item (one head each) -> 8 slots; MQA with 64 query heads: 4 tiles.
           Case{132, 32, 32, 1, 8},
           Case{132, 32, 32, 3, 6},
           Case{132, 64, 1, 1, 66},
           // More CTAs an item than slots: still one item.
           Case{2, 128, 128, 1, 1},
           // Group sizes that are not multiples of 16 round the head tiles up (group 20: 2).
           Case{132, 40, 2, 1, 66},
       }) {
    EXPECT_EQ(cuda::decode_split_target(c.sms, c.qo_heads, c.kv_heads, c.batch), c.target)
        << c.sms << " SMs, " << c.qo_heads << "/" << c.kv_heads << " heads, batch " << c.batch;
  }
}

// The MLA launch shape: 16-row blocks up to 16 rows per request (else 64), one wave of one-CTA
// items with the split target a multiple of the batch, chunks of at least 128 tokens, the grid
// bounded by the workspace's items, and no split when the partials do not fit.
TEST(MlaLaunchShape, RowBlocksSplitTargetAndCapacity) {
  const cuda::MlaCapacity big{132, 4096, int64_t{1} << 34, int64_t{1} << 30};
  struct Case {
    int32_t heads, page, batch;
    int64_t q_len;
    int block_rows;
    int64_t row_blocks;
    int32_t target, min_chunk_pages;
    int64_t grid_items;
  };
  for (const Case& c : {
           Case{128, 64, 64, 1, 64, 2, 64, 2, 128},  // 132 / (2 x 64): one CTA a request
           Case{128, 16, 1, 1, 64, 2, 66, 8, 67},
           Case{16, 64, 16, 1, 16, 1, 128, 2, 144},  // 132 / 16 = 8 a request
           Case{16, 1, 1, 1, 16, 1, 132, 128, 133},
           Case{16, 16, 128, 1, 16, 1, 128, 8, 256},  // more requests than SMs
           Case{8, 16, 4, 2, 16, 1, 132, 8, 136},     // 2 tokens x 8 heads: the small block
           Case{16, 16, 4, 4, 64, 1, 132, 8, 136},    // speculative, 64 rows
           Case{128, 256, 2, 2, 64, 4, 32, 1, 34},
       }) {
    const cuda::MlaShape shape = cuda::mla_launch_shape(big, c.heads, c.page, c.batch, c.q_len);
    const std::string what = std::to_string(c.heads) + " heads, P " + std::to_string(c.page) +
                             ", batch " + std::to_string(c.batch) + ", q_len " +
                             std::to_string(c.q_len);
    EXPECT_EQ(shape.partial_rows, c.q_len * c.heads) << what;
    EXPECT_EQ(shape.block_rows, c.block_rows) << what;
    EXPECT_EQ(shape.row_blocks, c.row_blocks) << what;
    EXPECT_TRUE(shape.config.enable) << what;
    EXPECT_EQ(shape.config.target_items, c.target) << what;
    EXPECT_EQ(shape.config.min_chunk_pages, c.min_chunk_pages) << what;
    EXPECT_EQ(shape.grid_items, c.grid_items) << what;
  }
  // The grid stops at the workspace's items; partials that do not fit mean one item a request.
  EXPECT_EQ(cuda::mla_launch_shape({132, 100, int64_t{1} << 34, int64_t{1} << 30}, 16, 16, 16, 1)
                .grid_items,
            100);
  const cuda::MlaShape tight = cuda::mla_launch_shape({132, 4096, 1000, 1000}, 16, 16, 16, 1);
  EXPECT_FALSE(tight.config.enable);
  EXPECT_EQ(tight.grid_items, 16);
}

// Clusters for the 16-row kernel: where c = SMs / batch CTAs a request is a power of two within
// max_cluster, a cluster of c CTAs takes each request as one item (target = batch, at least 128
// tokens per CTA); otherwise, and for 64-row blocks, none (c items a request).
TEST(MlaLaunchShape, ClustersForSixteenRowBlocks) {
  struct Case {
    int32_t max_cluster, heads, page, batch;
    int cluster;
    int32_t target, min_chunk_pages;
    int64_t grid_items;
  };
  for (const Case& c : {
           Case{8, 16, 64, 16, 8, 16, 16, 32},    // 8 CTAs a request: one cluster of 8
           Case{8, 16, 16, 33, 4, 33, 32, 66},    // 4
           Case{8, 16, 16, 64, 2, 64, 16, 128},   // 2
           Case{2, 16, 16, 64, 2, 64, 16, 128},   // 2 within a limit of 2
           Case{2, 16, 64, 16, 1, 128, 2, 144},   // 8 past a limit of 2: 8 items a request
           Case{8, 16, 1, 1, 1, 132, 128, 133},   // 132 past the limit
           Case{8, 16, 16, 20, 1, 120, 8, 140},   // 6: not a power of two
           Case{8, 16, 16, 128, 1, 128, 8, 256},  // 1: no cluster
           Case{8, 128, 64, 16, 1, 64, 2, 80},    // 64-row blocks: none
       }) {
    const cuda::MlaCapacity capacity{132, 4096, int64_t{1} << 34, int64_t{1} << 30,
                                     c.max_cluster};
    const cuda::MlaShape shape = cuda::mla_launch_shape(capacity, c.heads, c.page, c.batch, 1);
    const std::string what = "max cluster " + std::to_string(c.max_cluster) + ", " +
                             std::to_string(c.heads) + " heads, P " + std::to_string(c.page) +
                             ", batch " + std::to_string(c.batch);
    EXPECT_EQ(shape.cluster, c.cluster) << what;
    EXPECT_EQ(shape.config.target_items, c.target) << what;
    EXPECT_EQ(shape.config.min_chunk_pages, c.min_chunk_pages) << what;
    EXPECT_EQ(shape.grid_items, c.grid_items) << what;
  }
}

TEST(GpuPlanner, ReportsBadTables) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  EngineBatch batch = make_batch(rng, 16, {40, 20, 33}, false);
  const int32_t b = 3;
  for (int which = 0; which < 3; ++which) {
    EngineBatch bad = batch;
    std::string expected;
    bool slot_form = false;
    if (which == 0) {
      bad.block_table[1 * bad.block_stride + 1] = static_cast<int32_t>(bad.num_alloc_pages) + 3;
      expected = "block_table[1][1]";
    } else if (which == 1) {
      slot_form = true;
      bad.slots[2 * bad.slot_stride + 5] += 1;
      expected = "contiguous";
    } else {
      slot_form = true;
      bad.slots[0 * bad.slot_stride + 16] += 1;  // starts a page: unaligned
      expected = "slots[0][16]";
    }
    const DeviceTensor table = DeviceTensor::from_vector(slot_form ? bad.slots : bad.block_table);
    const DeviceTensor seq_lens = DeviceTensor::from_vector(bad.seq_lens);
    DevicePlan device(b, 64);
    cuda::DevicePlanInput in;
    in.table = table_view(table, b, slot_form ? bad.slot_stride : bad.block_stride);
    in.slot_table = slot_form;
    in.seq_lens = seq_lens.view();
    in.num_reqs = b;
    in.alloc_page_size = 16;
    in.page_size = 16;
    in.num_alloc_pages = bad.num_alloc_pages;
    cuda::plan_on_device(in, device.buffers(), nullptr);
    try {
      cuda::read_plan_status(device.status.view(), nullptr);
      ADD_FAILURE() << "no error for case " << which;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
    // Page ids stay in range whatever the table held.
    for (int32_t id : device_to_host(device.kv_indices, 6)) {
      EXPECT_TRUE(id >= 0 && id < bad.num_alloc_pages) << id;
    }
  }
}

}  // namespace
}  // namespace pagedattn::testing
