// Split-KV partition properties on random batches: every attention page of every request lies in
// exactly one item, items of a request are consecutive chunks 0..n-1 in request order, each chunk
// holds chunk_pages pages except a request's last, merge_indptr is the CSR of the items, the
// count stays within split_kv_capacity, and chunk_pages follows the rule in planner.h.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/planner.h"

namespace pagedattn {
namespace {

struct SplitCase {
  int32_t batch;
  int32_t max_pages_per_request;
  int32_t target_items;
  int32_t min_chunk_pages;
  bool enable;
};

std::string split_name(const ::testing::TestParamInfo<SplitCase>& info) {
  const SplitCase& c = info.param;
  return fmt::format("B{}_maxpages{}_target{}_minchunk{}_{}", c.batch, c.max_pages_per_request,
                     c.target_items, c.min_chunk_pages, c.enable ? "on" : "off");
}

class SplitKvProperty : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitKvProperty, EveryPageInExactlyOneItem) {
  const SplitCase& c = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 5; ++round) {
    std::vector<int32_t> indptr{0};
    for (int32_t r = 0; r < c.batch; ++r) {
      // A quarter of the requests empty (padding-like), the rest random up to the maximum.
      const bool empty = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
      const int32_t pages =
          empty ? 0 : std::uniform_int_distribution<int32_t>(1, c.max_pages_per_request)(rng);
      indptr.push_back(indptr.back() + pages);
    }
    const SplitKvConfig config{c.enable, c.target_items, c.min_chunk_pages};
    const int64_t capacity = split_kv_capacity(c.batch, indptr.back(), config);
    std::vector<int32_t> work_request(static_cast<size_t>(capacity), -1);
    std::vector<int32_t> work_chunk(static_cast<size_t>(capacity), -1);
    std::vector<int32_t> merge(static_cast<size_t>(c.batch) + 1, -1);
    const SplitKvSummary s =
        split_kv_partition(indptr, c.batch, config, {work_request, work_chunk, merge});

    // chunk_pages by the documented rule.
    const int64_t total = indptr.back();
    const int64_t target = std::max(1, c.target_items);
    const int64_t expected_chunk =
        c.enable ? std::max<int64_t>(c.min_chunk_pages, (total + target - 1) / target)
                 : std::max<int64_t>(1, total);
    ASSERT_EQ(s.chunk_pages, expected_chunk);
    ASSERT_LE(s.num_items, capacity);

    std::vector<int32_t> covered(static_cast<size_t>(total), 0);
    bool any_split = false;
    ASSERT_EQ(merge[0], 0);
    for (int32_t r = 0; r < c.batch; ++r) {
      const int32_t pages = indptr[r + 1] - indptr[r];
      const int32_t items = merge[r + 1] - merge[r];
      ASSERT_GE(items, 1) << "request " << r << " has no item";
      any_split |= items > 1;
      if (!c.enable) {
        ASSERT_EQ(items, 1);
      }
      for (int32_t i = 0; i < items; ++i) {
        const int32_t w = merge[r] + i;
        ASSERT_EQ(work_request[w], r);
        ASSERT_EQ(work_chunk[w], i);
        const int64_t begin = int64_t{i} * s.chunk_pages;
        const int64_t end = std::min<int64_t>(pages, begin + s.chunk_pages);
        if (pages == 0) continue;  // the one item of an empty request covers nothing
        ASSERT_LT(begin, end) << "request " << r << " item " << i << " is empty";
        if (i + 1 < items) {
          ASSERT_EQ(end - begin, s.chunk_pages);
        }
        for (int64_t p = begin; p < end; ++p) ++covered[indptr[r] + p];
      }
    }
    ASSERT_EQ(merge[c.batch], s.num_items);
    ASSERT_EQ(s.any_split, any_split);
    for (int64_t p = 0; p < total; ++p) ASSERT_EQ(covered[p], 1) << "page " << p;
    for (size_t i = static_cast<size_t>(s.num_items); i < work_request.size(); ++i) {
      ASSERT_EQ(work_request[i], -1) << "written past the items";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Planner, SplitKvProperty,
    ::testing::Values(SplitCase{1, 1, 132, 1, true}, SplitCase{1, 1000, 132, 1, true},
                      SplitCase{1, 1000, 8, 1, true}, SplitCase{7, 50, 16, 1, true},
                      SplitCase{64, 300, 132, 4, true}, SplitCase{200, 3, 132, 1, true},
                      SplitCase{33, 100, 0, 1, true}, SplitCase{33, 100, 132, 1000, true},
                      SplitCase{16, 100, 132, 1, false}, SplitCase{0, 1, 132, 1, true}),
    split_name);

TEST(SplitKv, LongSingleRequestIsSplitToTheTarget) {
  std::vector<int32_t> indptr{0, 1000};
  std::vector<int32_t> request(200), chunk(200), merge(2);
  const SplitKvSummary s = split_kv_partition(indptr, 1, {true, 10, 1}, {request, chunk, merge});
  EXPECT_EQ(s.chunk_pages, 100);
  EXPECT_EQ(s.num_items, 10);
  EXPECT_TRUE(s.any_split);
  EXPECT_EQ(merge[1], 10);
}

TEST(SplitKv, ErrorsNameTheArgument) {
  std::vector<int32_t> indptr{0, 10, 5};
  std::vector<int32_t> request(100), chunk(100), merge(3);
  try {
    split_kv_partition(indptr, 2, {}, {request, chunk, merge});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_indptr[2] = 5"), std::string::npos) << e.what();
  }
  indptr = {0, 100};
  std::vector<int32_t> small(3);
  using testing::error_containing;
  EXPECT_EQ(error_containing(
                [&] { split_kv_partition(indptr, 1, {true, 10, 1}, {small, chunk, merge}); },
                {"work_request holds 3 entries"}),
            "");
  EXPECT_EQ(error_containing(
                [&] { split_kv_partition(indptr, 1, {true, 10, 1}, {request, small, merge}); },
                {"work_chunk holds 3 entries"}),
            "");
  EXPECT_EQ(error_containing(
                [&] { split_kv_partition(indptr, 1, {true, 10, 1}, {request, chunk, {}}); },
                {"merge_indptr holds 0 entries", "batch + 1 = 2"}),
            "");
  EXPECT_EQ(error_containing([&] { split_kv_partition(indptr, 2, {}, {request, chunk, merge}); },
                             {"kv_indptr has 2 entries", "batch + 1 = 3"}),
            "");
  EXPECT_EQ(error_containing(
                [&] { split_kv_partition(indptr, 1, {true, 10, 0}, {request, chunk, merge}); },
                {"min_chunk_pages = 0"}),
            "");
}

}  // namespace
}  // namespace pagedattn
