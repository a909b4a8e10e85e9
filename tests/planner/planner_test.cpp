// Planner property tests against a naive token-by-token model: for every token t of every
// request, the slot the plan's metadata gives it (kv_indices[kv_indptr[r] + t / P] * P + t % P)
// is the slot the engine's table gives it, every slot is hit at most once, the lengths and
// indptrs add up, padding requests are empty, and nothing past the outputs is written. Both
// table forms must give identical metadata, and validate = false must not change a valid plan.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "pagedattn/error.h"
#include "planner/batch_maker.h"

namespace pagedattn {
namespace {

using testing::EngineBatch;

constexpr int32_t kSentinel = 0x5a5a5a5a;

struct PlanCase {
  int32_t alloc_page_size;
  int32_t page_size;
  int32_t num_reqs;
  int32_t padding;  // extra padding requests
  bool prefill;
};

std::string case_name(const ::testing::TestParamInfo<PlanCase>& info) {
  const PlanCase& c = info.param;
  return fmt::format("A{}_P{}_B{}_pad{}_{}", c.alloc_page_size, c.page_size, c.num_reqs, c.padding,
                     c.prefill ? "prefill" : "decode");
}

std::vector<PlanCase> all_cases() {
  std::vector<PlanCase> cases;
  for (int32_t alloc : {1, 16, 64, 256}) {
    std::vector<int32_t> sizes;
    for (int32_t p : {1, 2, 4, 16, alloc}) {
      if (p <= alloc && alloc % p == 0 && std::find(sizes.begin(), sizes.end(), p) == sizes.end())
        sizes.push_back(p);
    }
    for (int32_t p : sizes)
      for (int32_t b : {1, 7})
        for (int32_t pad : {0, 3})
          for (bool prefill : {false, true}) cases.push_back({alloc, p, b, pad, prefill});
  }
  return cases;
}

// Storage with every entry set to the sentinel, so unwritten and over-written entries show.
PlanStorage poisoned_storage(int32_t max_batch, int64_t max_pages) {
  PlanStorage storage(max_batch, max_pages);
  for (auto* v : {&storage.qo_indptr, &storage.kv_indptr, &storage.kv_indices,
                  &storage.kv_last_page_len, &storage.kv_lens}) {
    std::fill(v->begin(), v->end(), kSentinel);
  }
  return storage;
}

int64_t model_pages(const EngineBatch& batch, int32_t page_size) {
  int64_t pages = 0;
  for (int32_t len : batch.seq_lens) pages += (len + page_size - 1) / page_size;
  return pages;
}

// The naive model: checks every output entry of `storage` for `batch` planned with P.
void expect_matches_model(const EngineBatch& batch, int32_t page_size, int32_t padded_batch,
                          const PlanStorage& s, const PlanSummary& summary) {
  const int32_t n = batch.num_reqs();
  const int32_t b = padded_batch > 0 ? padded_batch : n;
  const bool prefill = !batch.q_lens.empty();
  ASSERT_EQ(summary.batch_size, b);
  ASSERT_EQ(summary.num_reqs, n);
  ASSERT_EQ(s.qo_indptr[0], 0);
  ASSERT_EQ(s.kv_indptr[0], 0);
  std::vector<int32_t> hits(static_cast<size_t>(batch.num_alloc_pages * batch.alloc_page_size));
  int32_t max_q = 0, max_kv = 0;
  for (int32_t r = 0; r < b; ++r) {
    SCOPED_TRACE(fmt::format("request {}", r));
    const int32_t len = r < n ? batch.seq_lens[r] : 0;
    const int32_t q_len = !prefill ? 1 : (r < n ? batch.q_lens[r] : 0);
    max_q = std::max(max_q, q_len);
    max_kv = std::max(max_kv, len);
    const int32_t pages = s.kv_indptr[r + 1] - s.kv_indptr[r];
    ASSERT_EQ(s.qo_indptr[r + 1] - s.qo_indptr[r], q_len);
    ASSERT_EQ(s.kv_lens[r], len);
    if (len == 0) {
      ASSERT_EQ(pages, 0);
      ASSERT_EQ(s.kv_last_page_len[r], 0);
      continue;
    }
    const int32_t last = s.kv_last_page_len[r];
    ASSERT_GE(last, 1);
    ASSERT_LE(last, page_size);
    ASSERT_EQ(int64_t{pages - 1} * page_size + last, len);
    for (int32_t t = 0; t < len; ++t) {
      const int64_t page = s.kv_indices[s.kv_indptr[r] + t / page_size];
      const int64_t slot = page * page_size + t % page_size;
      ASSERT_EQ(slot, batch.slot_of(r, t)) << "token " << t;
      ASSERT_EQ(++hits[static_cast<size_t>(slot)], 1) << "slot " << slot << " hit twice";
    }
  }
  ASSERT_EQ(summary.num_pages, s.kv_indptr[b]);
  ASSERT_EQ(summary.num_pages, model_pages(batch, page_size));
  ASSERT_EQ(summary.num_qo_rows, s.qo_indptr[b]);
  ASSERT_EQ(summary.max_q_len, max_q);
  ASSERT_EQ(summary.max_kv_len, max_kv);
  // Nothing written past the outputs.
  for (size_t i = static_cast<size_t>(summary.num_pages); i < s.kv_indices.size(); ++i) {
    ASSERT_EQ(s.kv_indices[i], kSentinel) << "kv_indices[" << i << "] written past the end";
  }
  for (size_t i = static_cast<size_t>(b); i < s.kv_lens.size(); ++i) {
    ASSERT_EQ(s.kv_lens[i], kSentinel);
    ASSERT_EQ(s.kv_last_page_len[i], kSentinel);
    ASSERT_EQ(s.kv_indptr[i + 1], kSentinel);
    ASSERT_EQ(s.qo_indptr[i + 1], kSentinel);
  }
}

class PlannerProperty : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlannerProperty, MatchesTokenByTokenModelInBothForms) {
  const PlanCase& c = GetParam();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 3; ++round) {
    const EngineBatch batch =
        testing::make_batch(rng, c.alloc_page_size,
                            testing::corner_lengths(rng, c.num_reqs, c.alloc_page_size), c.prefill);
    const int32_t padded = c.padding > 0 ? c.num_reqs + c.padding : 0;
    const int32_t capacity_batch = c.num_reqs + c.padding + 2;
    const int64_t capacity_pages = model_pages(batch, c.page_size) + 5;

    PlanStorage from_blocks = poisoned_storage(capacity_batch, capacity_pages);
    const PlanSummary s1 = plan(batch.input(false, c.page_size, padded), from_blocks.buffers());
    expect_matches_model(batch, c.page_size, padded, from_blocks, s1);

    PlanStorage from_slots = poisoned_storage(capacity_batch, capacity_pages);
    const PlanSummary s2 = plan(batch.input(true, c.page_size, padded), from_slots.buffers());
    expect_matches_model(batch, c.page_size, padded, from_slots, s2);

    // Both forms: identical metadata, entry for entry.
    EXPECT_EQ(from_blocks.qo_indptr, from_slots.qo_indptr);
    EXPECT_EQ(from_blocks.kv_indptr, from_slots.kv_indptr);
    EXPECT_EQ(from_blocks.kv_indices, from_slots.kv_indices);
    EXPECT_EQ(from_blocks.kv_last_page_len, from_slots.kv_last_page_len);
    EXPECT_EQ(from_blocks.kv_lens, from_slots.kv_lens);

    // The trusted hot path gives the same plan.
    for (bool slot_form : {false, true}) {
      PlanStorage trusted = poisoned_storage(capacity_batch, capacity_pages);
      PlanInput in = batch.input(slot_form, c.page_size, padded);
      in.validate = false;
      plan(in, trusted.buffers());
      EXPECT_EQ(trusted.kv_indices, from_blocks.kv_indices) << "slot_form " << slot_form;
      EXPECT_EQ(trusted.kv_indptr, from_blocks.kv_indptr);
      EXPECT_EQ(trusted.kv_last_page_len, from_blocks.kv_last_page_len);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Planner, PlannerProperty, ::testing::ValuesIn(all_cases()), case_name);

// ---- explicit corners ----

TEST(Planner, PageSizeOneIsTheFlattenedLayout) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  const EngineBatch batch = testing::make_batch(rng, 16, {37, 16, 1}, false);
  PlanStorage s(3, 64);
  plan(batch.input(false, 1), s.buffers());
  for (int32_t r = 0; r < 3; ++r) {
    for (int32_t t = 0; t < batch.seq_lens[r]; ++t) {
      EXPECT_EQ(s.kv_indices[s.kv_indptr[r] + t], batch.slot_of(r, t));
    }
    EXPECT_EQ(s.kv_last_page_len[r], 1);
  }
}

TEST(Planner, PageSizeEqualToAllocationPageCopiesTheBlockTable) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (PAGEDATTN_TEST_SEED to reproduce)", seed));
  std::mt19937_64 rng(seed);
  const EngineBatch batch = testing::make_batch(rng, 64, {64 * 3, 65, 63}, false);
  PlanStorage s(3, 16);
  plan(batch.input(true, 64), s.buffers());
  const std::vector<int32_t> expected = {batch.block_table[0],
                                         batch.block_table[1],
                                         batch.block_table[2],
                                         batch.block_table[batch.block_stride],
                                         batch.block_table[batch.block_stride + 1],
                                         batch.block_table[2 * batch.block_stride]};
  EXPECT_EQ(std::vector<int32_t>(s.kv_indices.begin(), s.kv_indices.begin() + 6), expected);
  EXPECT_EQ(s.kv_last_page_len, (std::vector<int32_t>{64, 1, 63}));
}

TEST(Planner, EmptyBatchWithPaddingIsAllEmptyRequests) {
  PlanInput in;
  in.table = BlockTableInput{{}, 0};
  in.alloc_page_size = 16;
  in.page_size = 16;
  in.padded_batch = 4;
  PlanStorage s(4, 0);
  const PlanSummary summary = plan(in, s.buffers());
  EXPECT_EQ(summary.batch_size, 4);
  EXPECT_EQ(summary.num_pages, 0);
  EXPECT_EQ(s.kv_indptr, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(s.qo_indptr, (std::vector<int32_t>{0, 1, 2, 3, 4}));  // decode: one row each
  EXPECT_EQ(s.kv_last_page_len, (std::vector<int32_t>{0, 0, 0, 0}));
}

TEST(Planner, EmptyBatchWithoutPaddingWritesOnlyTheIndptrHeads) {
  PlanInput in;
  in.table = SlotTableInput{{}, 0};
  in.alloc_page_size = 1;
  in.page_size = 1;
  PlanStorage s(0, 0);
  const PlanSummary summary = plan(in, s.buffers());
  EXPECT_EQ(summary.batch_size, 0);
  EXPECT_EQ(summary.max_q_len, 0);
  EXPECT_EQ(s.kv_indptr, (std::vector<int32_t>{0}));
}

TEST(Planner, NonPowerOfTwoPageSizes) {
  // A = 48, P = 3 / 16 / 48: the runtime-ratio paths.
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  for (int32_t p : {1, 3, 6, 16, 24, 48}) {
    const EngineBatch batch = testing::make_batch(rng, 48, {0, 1, 47, 48, 49, 200}, true);
    PlanStorage a = poisoned_storage(6, 400), b = poisoned_storage(6, 400);
    const PlanSummary sa = plan(batch.input(false, p), a.buffers());
    expect_matches_model(batch, p, 0, a, sa);
    const PlanSummary sb = plan(batch.input(true, p), b.buffers());
    expect_matches_model(batch, p, 0, b, sb);
    EXPECT_EQ(a.kv_indices, b.kv_indices);
  }
}

TEST(Planner, PlanStorageSizesItsBuffers) {
  PlanStorage s(5, 100);
  const PlanBuffers b = s.buffers();
  EXPECT_EQ(b.qo_indptr.size(), 6u);
  EXPECT_EQ(b.kv_indptr.size(), 6u);
  EXPECT_EQ(b.kv_indices.size(), 100u);
  EXPECT_EQ(b.kv_last_page_len.size(), 5u);
  EXPECT_EQ(b.kv_lens.size(), 5u);
  EXPECT_EQ(testing::error_containing([] { PlanStorage(-1, 1); }, {"PlanStorage: max_batch = -1"}),
            "");
  EXPECT_EQ(testing::error_containing([] { PlanStorage(1, -1); }, {"PlanStorage: max_pages = -1"}),
            "");
}

}  // namespace
}  // namespace pagedattn
