// CUDA-graph decode steps (include/pagedattn/cuda_graph.h): a runner captures the planner and
// decode for padded batch sizes 1..32 once, then many steps with changing batch sizes, lengths
// (empty requests included) and page tables replay those graphs; every replay's out and lse must
// equal, bit for bit, the same step launched eagerly, and a sample of steps is checked against the
// float64 reference (the step's metadata rebuilt with the host planner) over the last layer's own
// cache.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>

#include "common/test_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "pagedattn/cuda_graph.h"
#include "pagedattn/planner.h"
#include "reference/reference.h"

namespace pagedattn::testing {
namespace {

struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream); }
};

std::vector<unsigned char> download(const TensorView& view, int64_t bytes, cudaStream_t stream) {
  std::vector<unsigned char> host(static_cast<size_t>(bytes));
  PA_CUDA_CHECK(cudaMemcpyAsync(host.data(), view.data, bytes, cudaMemcpyDeviceToHost, stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

// A layer's cache: uniform values on the host, copied to the device.
struct LayerCache {
  LayerCache(const KvCacheConfig& config, int32_t page_size, std::mt19937_64& rng)
      : host(config), host_kv(filled(host.paged(page_size), rng)), k(host_kv.k), v(host_kv.v) {
    device_kv = host_kv;
    device_kv.k = k.view();
    device_kv.v = v.view();
  }
  static PagedKv filled(PagedKv kv, std::mt19937_64& rng) {
    fill_uniform(kv.k, rng);
    fill_uniform(kv.v, rng);
    return kv;
  }
  HostKvCache host;
  PagedKv host_kv;
  DeviceTensor k, v;
  PagedKv device_kv;
};

TEST(CudaGraph, ReplaysMatchEagerAndReference) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  constexpr int32_t kHeads = 8, kKvHeads = 2, kDim = 128, kAlloc = 16, kPage = 4;
  constexpr int32_t kStride = 24;  // blocks per request: up to 384 tokens
  constexpr int64_t kPool = 32 * kStride;
  KvCacheConfig config;
  config.num_pages = kPool;
  config.alloc_page_size = kAlloc;
  config.num_kv_heads = kKvHeads;
  config.head_dim = kDim;
  config.layout = KvLayout::kHND;
  const LayerCache layer_1(config, kPage, rng);
  // A second layer with its own cache: each step's out is the last layer's, over this one.
  const LayerCache layer_2(config, kPage, rng);
  const PagedKv& device_kv = layer_1.device_kv;
  const PagedKv& device_kv_2 = layer_2.device_kv;
  const PagedKv& host_kv_2 = layer_2.host_kv;

  Stream stream;
  cuda::DecodeGraphConfig graph_config;
  graph_config.kv = device_kv;
  graph_config.num_qo_heads = kHeads;
  graph_config.options.sm_scale = 0.088f;
  graph_config.batch_sizes = {1, 2, 4, 8, 16, 32};
  graph_config.max_blocks_per_request = kStride;
  graph_config.num_layers = 2;
  // Rejected: a cache for one of the two layers, and a second cache of another page size.
  graph_config.layer_kv = {device_kv};
  EXPECT_THROW(cuda::DecodeGraphRunner(graph_config, stream.stream), Error);
  PagedKv other_page_size = device_kv_2;
  other_page_size.page_size = kPage / 2;
  graph_config.layer_kv = {device_kv, other_page_size};
  EXPECT_THROW(cuda::DecodeGraphRunner(graph_config, stream.stream), Error);
  graph_config.layer_kv = {device_kv, device_kv_2};
  cuda::DecodeGraphRunner runner(graph_config, stream.stream);

  const int64_t q_row_bytes = int64_t{kHeads} * kDim * 2;
  for (int step = 0; step < 40; ++step) {
    const int32_t num_reqs = std::uniform_int_distribution<int32_t>(1, 32)(rng);
    std::vector<int32_t> pages(kPool);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int32_t> block_table(num_reqs * kStride, -1), seq_lens(num_reqs);
    size_t next = 0;
    for (int32_t r = 0; r < num_reqs; ++r) {
      const int kind = std::uniform_int_distribution<int>(0, 5)(rng);
      seq_lens[r] =
          kind == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, kStride * kAlloc)(rng);
      for (int32_t b = 0; b * kAlloc < seq_lens[r]; ++b)
        block_table[r * kStride + b] = pages[next++];
    }
    HostTensor q(DType::kBF16, {num_reqs, kHeads, kDim});
    fill_uniform(q.view(), rng);
    PA_CUDA_CHECK(cudaMemcpyAsync(runner.q().data, q.view().data, num_reqs * q_row_bytes,
                                  cudaMemcpyHostToDevice, stream.stream));
    // Poison out and lse (full capacity) so that a replay that skips either one shows.
    PA_CUDA_CHECK(cudaMemsetAsync(runner.out().data, 0xff, runner.out().numel() * 2, stream.stream));
    PA_CUDA_CHECK(cudaMemsetAsync(runner.lse().data, 0xff, runner.lse().numel() * 4, stream.stream));
    const int32_t batch = runner.step(block_table, seq_lens, /*use_graph=*/true);
    ASSERT_GE(batch, num_reqs);
    const auto graph_out = download(runner.out(), int64_t{batch} * q_row_bytes, stream.stream);
    const auto graph_lse = download(runner.lse(), int64_t{batch} * kHeads * 4, stream.stream);
    runner.check_last_step();
    // Poison, then the same step eagerly.
    PA_CUDA_CHECK(cudaMemsetAsync(runner.out().data, 0xff, batch * q_row_bytes, stream.stream));
    PA_CUDA_CHECK(cudaMemsetAsync(runner.lse().data, 0xff, runner.lse().numel() * 4, stream.stream));
    runner.step(block_table, seq_lens, /*use_graph=*/false);
    const auto eager_out = download(runner.out(), int64_t{batch} * q_row_bytes, stream.stream);
    const auto eager_lse = download(runner.lse(), int64_t{batch} * kHeads * 4, stream.stream);
    ASSERT_EQ(graph_out, eager_out) << "step " << step << ": replay differs from eager";
    ASSERT_EQ(graph_lse, eager_lse) << "step " << step << ": replay lse differs from eager";

    if (step % 8 != 0) continue;
    // Against the reference: the host planner's metadata for the same tables.
    PlanStorage plan_storage(batch, int64_t{batch} * kStride * (kAlloc / kPage));
    PlanInput input;
    input.table = BlockTableInput{block_table, kStride};
    input.num_reqs = num_reqs;
    input.seq_lens = seq_lens;
    input.alloc_page_size = kAlloc;
    input.page_size = kPage;
    input.num_alloc_pages = kPool;
    input.padded_batch = batch;
    plan(input, plan_storage.buffers());
    HostTensor q_padded(DType::kBF16, {batch, kHeads, kDim});
    std::memcpy(q_padded.view().data, q.view().data, num_reqs * q_row_bytes);
    HostTensor out(DType::kBF16, {batch, kHeads, kDim});
    std::memcpy(out.view().data, graph_out.data(), graph_out.size());
    DecodeArgs args;
    args.q = q_padded.view();
    args.kv = host_kv_2;  // the last layer's cache
    args.meta.batch_size = batch;
    args.meta.qo_indptr =
        TensorView::contiguous(plan_storage.qo_indptr.data(), DType::kI32, {batch + 1});
    args.meta.kv_indptr =
        TensorView::contiguous(plan_storage.kv_indptr.data(), DType::kI32, {batch + 1});
    args.meta.kv_indices =
        TensorView::contiguous(plan_storage.kv_indices.data(), DType::kI32,
                               {static_cast<int64_t>(plan_storage.kv_indices.size())});
    args.meta.kv_last_page_len =
        TensorView::contiguous(plan_storage.kv_last_page_len.data(), DType::kI32, {batch});
    args.out = out.view();
    args.options = graph_config.options;
    std::vector<double> expected_lse;
    const std::vector<double> expected = reference_decode(args, &expected_lse);
    std::string report = compare_rows(to_doubles(out.view()), expected, kDim,
                                      gpu_row_tolerance(DType::kBF16), "replay vs reference");
    // The replay's lse against float64 too (graph == eager alone passes a replay and an eager
    // step that both leave lse unwritten).
    std::vector<double> replay_lse(static_cast<size_t>(batch) * kHeads);
    for (size_t i = 0; i < replay_lse.size(); ++i) {
      float value;
      std::memcpy(&value, graph_lse.data() + i * 4, 4);
      replay_lse[i] = value;
    }
    report += compare(replay_lse, expected_lse, kGpuLseTolerance, "replay lse vs reference");
    ASSERT_TRUE(report.empty()) << "step " << step << "\n" << report;
  }
}

// The decode kernel's phase stamps (DecodeGraphConfig::trace, a diagnostic): a traced runner's
// outputs equal an untraced one's bit for bit; every CTA that read a work item stamped its phases
// in order (first K/V, counted and merge read only where they apply) and its end; one CTA per KV
// head of each split request merged, after it counted; every CTA of a layer passed its wait for
// the previous kernel only after the previous layer's last CTA ended; and a CTA without an item
// stamped only its start and end; every CTA's SM cycles beside its start and end stamps give a
// clock rate a GPU can have.
TEST(CudaGraph, TraceStampsPhasesInOrder) {
  PA_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int32_t kHeads = 32, kKvHeads = 8, kDim = 128, kPage = 16, kStride = 256;
  KvCacheConfig config;
  config.num_pages = 2 * kStride;
  config.alloc_page_size = kPage;
  config.num_kv_heads = kKvHeads;
  config.head_dim = kDim;
  const LayerCache cache(config, kPage, rng);
  cuda::DecodeGraphConfig graph_config;
  graph_config.kv = cache.device_kv;
  graph_config.num_qo_heads = kHeads;
  graph_config.options.sm_scale = 0.088f;
  graph_config.batch_sizes = {2};
  graph_config.max_blocks_per_request = kStride;
  graph_config.num_layers = 3;
  Stream stream;
  cuda::DecodeGraphRunner plain(graph_config, stream.stream);
  graph_config.trace = true;
  cuda::DecodeGraphRunner traced(graph_config, stream.stream);

  // One short request and one long enough to be split into several items.
  const std::vector<int32_t> seq_lens = {300, 4000};
  std::vector<int32_t> block_table(2 * kStride);
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  HostTensor q(DType::kBF16, {2, kHeads, kDim});
  fill_uniform(q.view(), rng);
  const int64_t out_bytes = int64_t{2} * kHeads * kDim * 2;
  std::vector<unsigned char> outs[2];
  for (int i = 0; i < 2; ++i) {
    cuda::DecodeGraphRunner& runner = i == 0 ? plain : traced;
    PA_CUDA_CHECK(cudaMemcpyAsync(runner.q().data, q.view().data, out_bytes, cudaMemcpyHostToDevice,
                                  stream.stream));
    runner.step(block_table, seq_lens, /*use_graph=*/true);
    outs[i] = download(runner.out(), out_bytes, stream.stream);
    runner.check_last_step();
  }
  ASSERT_EQ(outs[0], outs[1]) << "the traced step's out differs from the plain one's";
  EXPECT_THROW(plain.trace(), Error);

  const cuda::DecodeTrace trace = traced.trace();
  ASSERT_EQ(trace.layers, 3);
  ASSERT_EQ(trace.stamps.size(),
            static_cast<size_t>(trace.layers * trace.ctas * cuda::DecodeTrace::kPhases));
  ASSERT_EQ(trace.sm_clocks.size(), static_cast<size_t>(trace.layers * trace.ctas * 2));
  enum {
    kStart,
    kMeta,
    kPages,
    kWait,
    kQ,
    kFirstKv,
    kLoop,
    kCombined,
    kWritten,
    kCounted,
    kMergeRead,
    kEnd
  };
  uint64_t previous_end = 0;
  for (int32_t layer = 0; layer < trace.layers; ++layer) {
    int64_t working = 0, counted = 0, merged = 0;
    uint64_t last_end = 0, first_wait = UINT64_MAX;
    for (int64_t cta = 0; cta < trace.ctas; ++cta) {
      const uint64_t* t =
          trace.stamps.data() + (layer * trace.ctas + cta) * cuda::DecodeTrace::kPhases;
      const std::string where = fmt::format("layer {}, CTA {}", layer, cta);
      if (t[kStart] == 0) {  // past the grid
        for (int phase = 0; phase < cuda::DecodeTrace::kPhases; ++phase) {
          ASSERT_EQ(t[phase], 0u) << where;
        }
        continue;
      }
      ASSERT_GE(t[kEnd], t[kStart]) << where;
      last_end = std::max(last_end, t[kEnd]);
      // The SM's cycles beside the start and end stamps: a clock rate a GPU can have (0.3 to 4
      // GHz), where the CTA lived long enough for the timer's steps not to matter.
      const uint64_t* cycles = trace.sm_clocks.data() + (layer * trace.ctas + cta) * 2;
      ASSERT_GT(cycles[1], cycles[0]) << where;
      if (t[kEnd] - t[kStart] >= 5000) {
        const double ghz =
            static_cast<double>(cycles[1] - cycles[0]) / static_cast<double>(t[kEnd] - t[kStart]);
        EXPECT_GT(ghz, 0.3) << where;
        EXPECT_LT(ghz, 4.0) << where;
      }
      if (t[kMeta] == 0) {  // no work item: start and end only
        for (int phase = kMeta; phase < kEnd; ++phase) ASSERT_EQ(t[phase], 0u) << where;
        continue;
      }
      ++working;
      uint64_t before = t[kStart];
      for (int phase = kMeta; phase <= kEnd; ++phase) {
        if ((phase == kFirstKv || phase == kCounted || phase == kMergeRead) && t[phase] == 0)
          continue;
        ASSERT_NE(t[phase], 0u) << where << ", phase " << cuda::DecodeTrace::kPhaseNames[phase];
        ASSERT_GE(t[phase], before) << where << ", phase " << cuda::DecodeTrace::kPhaseNames[phase];
        before = t[phase];
      }
      counted += t[kCounted] != 0;
      merged += t[kMergeRead] != 0;
      if (t[kMergeRead] != 0) {
        ASSERT_NE(t[kCounted], 0u) << where << ": merged without counting";
      }
      first_wait = std::min(first_wait, t[kWait]);
    }
    // 8 KV heads: every head of both requests has at least one item, and the long request's items
    // count their arrivals.
    EXPECT_GE(working, 2 * kKvHeads) << "layer " << layer;
    EXPECT_GT(counted, 0) << "layer " << layer;
    // The long request is split, the short one may be: a merge per KV head of each split one.
    EXPECT_TRUE(merged == kKvHeads || merged == 2 * kKvHeads)
        << "layer " << layer << ": " << merged;
    if (layer > 0) {
      EXPECT_GE(first_wait, previous_end)
          << "layer " << layer << ": a CTA passed its wait before the previous layer ended";
    }
    previous_end = last_end;
  }
}

TEST(CudaGraph, RejectsBadConfig) {
  PA_REQUIRE_GPU();
  cuda::DecodeGraphConfig config;
  EXPECT_THROW(cuda::DecodeGraphRunner(config, nullptr), Error);
}

}  // namespace
}  // namespace pagedattn::testing
