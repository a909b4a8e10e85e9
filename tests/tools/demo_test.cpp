// The demo's engine loop in small configurations: it must serve every request to the end with
// every check passing (sampled rows against the float64 reference, padding rows, allocator
// consistency, no leaked page), under page pressure (queueing and preemption) too, and reject
// bad options with errors naming the option.
#include "tools/demo/demo.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/registry.h"
#include "tools/demo/demo_attention.h"

namespace pagedattn::tools {
namespace {

DemoOptions small_options(uint64_t seed) {
  DemoOptions options;
  options.num_requests = 6;
  options.decode_steps = 6;
  options.seed = seed;
  options.max_prompt = 40;
  options.max_batch = 3;
  options.num_qo_heads = 8;
  options.num_kv_heads = 2;
  options.head_dim = 64;
  options.page_sizes = {1, 4, 16};
  options.backend = "auto";
  return options;
}

std::string failures(const DemoResult& result) {
  std::string text;
  for (const std::string& message : result.failure_messages) text += "\n  " + message;
  return text;
}

void expect_served(const DemoResult& result, const DemoOptions& options) {
  EXPECT_TRUE(result.ok()) << failures(result);
  EXPECT_EQ(result.failures, 0) << failures(result);
  EXPECT_EQ(result.requests, options.num_requests);
  EXPECT_GE(result.decode_tokens, options.num_requests * std::max(1, options.decode_steps / 2));
  EXPECT_LE(result.decode_tokens, options.num_requests * options.decode_steps);
  EXPECT_GT(result.prefill_batches, 0);
  EXPECT_LE(result.peak_pages_used, result.num_pages);
  ASSERT_EQ(result.per_page_size.size(), options.page_sizes.size());
  for (const PageSizeStats& stats : result.per_page_size) {
    EXPECT_GT(stats.checks, 0) << "P=" << stats.page_size;
    EXPECT_EQ(stats.failures, 0) << "P=" << stats.page_size;
    EXPECT_EQ(static_cast<int64_t>(stats.decode_step_seconds.size()), result.decode_batches);
  }
}

struct DemoCase {
  KvLayout layout;
  bool slot_table;
};

class DemoConfig : public ::testing::TestWithParam<DemoCase> {};

TEST_P(DemoConfig, ServesEveryRequestWithAllChecksPassing) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  DemoOptions options = small_options(seed);
  options.layout = GetParam().layout;
  options.slot_table = GetParam().slot_table;
  int64_t progress_calls = 0;
  options.progress = [&](const DemoProgress& p) {
    ++progress_calls;
    EXPECT_LE(p.finished, p.total);
  };
  const DemoResult result = run_demo(options);
  expect_served(result, options);
  EXPECT_EQ(progress_calls, result.steps);
  const std::string table = format_demo_table(result);
  for (const char* part : {"P=1", "P=4", "P=16", "decode KV read (GB/s)", "OK\n"}) {
    EXPECT_NE(table.find(part), std::string::npos) << part << " missing from\n" << table;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, DemoConfig,
                         ::testing::Values(DemoCase{KvLayout::kNHD, false},
                                           DemoCase{KvLayout::kHND, false},
                                           DemoCase{KvLayout::kNHD, true}),
                         [](const ::testing::TestParamInfo<DemoCase>& info) {
                           return fmt::format("{}_{}", layout_name(info.param.layout),
                                              info.param.slot_table ? "SlotTable" : "BlockTable");
                         });

// A pool as small as the trace allows: admissions queue, decode preempts and recomputes, shared
// prefixes are forked (partial last pages copied), and still every check passes.
TEST(Demo, PagePressureQueuesPreemptsAndStaysCorrect) {
  DemoOptions options = small_options(7);
  options.num_requests = 8;
  options.decode_steps = 16;
  options.max_batch = 4;
  options.alloc_page_size = 4;
  options.page_sizes = {1, 2, 4};
  // The smallest pool the demo accepts for this trace, found from its own error message.
  options.num_pages = 1;
  std::string message;
  try {
    run_demo(options);
  } catch (const Error& error) {
    message = error.what();
  }
  const size_t at = message.find("expected >= ");
  ASSERT_NE(at, std::string::npos) << message;
  options.num_pages = std::stoi(message.substr(at + 12));
  const DemoResult result = run_demo(options);
  expect_served(result, options);
  EXPECT_GT(result.preemptions, 0);
  EXPECT_GT(result.queued_admissions, 0);
  EXPECT_GT(result.forks, 0);
  EXPECT_GT(result.partial_page_copies, 0);
}

TEST(Demo, RejectsBadOptionsNamingThem) {
  auto expect_error = [](const std::function<void(DemoOptions&)>& change, const std::string& part) {
    DemoOptions options = small_options(1);
    change(options);
    try {
      run_demo(options);
      ADD_FAILURE() << "no Error; expected one mentioning '" << part << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
    }
  };
  expect_error([](DemoOptions& o) { o.num_requests = 0; }, "--requests: 0");
  expect_error([](DemoOptions& o) { o.decode_steps = 0; }, "--steps: 0");
  expect_error(
      [](DemoOptions& o) {
        o.page_sizes = {1, 3};
      },
      "--page-size: 3 does not divide the allocation page size 16");
  expect_error([](DemoOptions& o) { o.page_sizes = {}; }, "--page-size: empty");
  expect_error([](DemoOptions& o) { o.max_batch = 0; }, "--max-batch: 0");
  expect_error([](DemoOptions& o) { o.num_pages = 3; }, "--num-pages: 3 is too small");
  expect_error([](DemoOptions& o) { o.backend = "nope"; }, "'nope'");
  expect_error([](DemoOptions& o) { o.num_kv_heads = 3; }, "not a multiple of 3 KV heads");
}

// The checks can fail: one attention batch run directly through the demo's runner passes while
// the cache holds what the requests' logical K/V say, and fails, naming the request, once one
// cached value differs from it.
TEST(DemoAttention, ChecksCatchACorruptedCache) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const demo::ModelShape shape{4, 2, 32};
  const int64_t token = int64_t{shape.kv_heads} * shape.head_dim;
  HostKvCache cache({8, 4, shape.kv_heads, shape.head_dim, KvLayout::kNHD, DType::kBF16});
  demo::AttentionRunner runner(shape, cache, {1, 2, 4}, Selection::parse("auto"), 4, 12, 12,
                               /*slot_table=*/false);
  // Three requests of 5, 9 and 2 tokens on shuffled pages; logical K/V in bf16.
  const std::vector<std::vector<int32_t>> tables = {{6, 1}, {3, 0, 7}, {5}};
  const std::vector<int32_t> lengths = {5, 9, 2};
  std::vector<HostTensor> k, v;
  std::vector<demo::BatchEntry> batch;
  for (size_t r = 0; r < tables.size(); ++r) {
    k.emplace_back(DType::kBF16,
                   std::initializer_list<int64_t>{lengths[r], shape.kv_heads, shape.head_dim});
    v.emplace_back(DType::kBF16,
                   std::initializer_list<int64_t>{lengths[r], shape.kv_heads, shape.head_dim});
    testing::fill_uniform(k.back().view(), rng);
    testing::fill_uniform(v.back().view(), rng);
    HostTensor slots(DType::kI32, {lengths[r]});
    for (int32_t t = 0; t < lengths[r]; ++t)
      slots.data<int32_t>()[t] = tables[r][t / 4] * 4 + t % 4;
    store_kv(cache.paged(4), k.back().view(), v.back().view(), slots.view());
    batch.push_back({tables[r], lengths[r], 1, k.back().data<uint16_t>(), v.back().data<uint16_t>(),
                     static_cast<int64_t>(r)});
  }
  HostTensor q(DType::kBF16, {3, shape.qo_heads, shape.head_dim});
  testing::fill_uniform(q.view(), rng, -4.0f, 4.0f);
  const std::vector<int32_t> sample = {0, 1, 2};

  DemoResult good;
  good.per_page_size.resize(3);
  runner.run(0, /*prefill=*/false, batch, q.view(), sample, good);
  EXPECT_EQ(good.failures, 0) << failures(good);
  EXPECT_GT(good.checks, 9);  // 3 rows x 3 page sizes, plus finiteness and padding checks

  // Request 1's token 6 (its second page, 0, offset 2), value of head 1, dim 3: in the cache, not
  // the logical.
  uint16_t* cached =
      cache.paged(4).v.data_as<uint16_t>() + (0 * 4 + 2) * token + shape.head_dim + 3;
  *cached = float_to_bf16(bf16_to_float(*cached) + 64.0f);
  DemoResult bad;
  bad.per_page_size.resize(3);
  runner.run(0, /*prefill=*/false, batch, q.view(), sample, bad);
  EXPECT_EQ(bad.failures, 3) << failures(bad);  // request 1, at every page size
  ASSERT_FALSE(bad.failure_messages.empty());
  EXPECT_NE(bad.failure_messages[0].find("request 1"), std::string::npos)
      << bad.failure_messages[0];
}

}  // namespace
}  // namespace pagedattn::tools
