// RadixCache tests: explicit cases (whole-page matches cut at max_tokens, splits, shared
// reference counts, LRU eviction of unreferenced leaves only) and a property test of random
// request lifetimes over a small vocabulary (much sharing). The property test writes every
// token's id into a simulated pool through the allocator's block tables; a match must return
// pages whose contents are exactly the prompt's tokens (so a stale, freed or wrong page is
// caught), and while nothing was evicted its length must equal the longest whole-page prefix
// shared with any sequence inserted before (a naive scan). The allocator and the tree are
// checked for consistency after every operation, and at the end clearing the cache returns
// every page. Inserts that resume at a cursor: LRU order checked by hand on a small tree, and a
// random workload run side by side with root walks (same pages, counts and evictions).
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <random>
#include <span>

#include "pagedattn/engine_prefix_cache.h"

namespace pagedattn::engine {
namespace {

std::vector<int32_t> table_of(const PageAllocator& allocator, RequestId id) {
  const auto table = allocator.block_table(id);
  return {table.begin(), table.end()};
}

TEST(RadixCache, MatchesWholePagesUpToTheLimit) {
  PageAllocator allocator(16, 4);
  RadixCache cache(allocator);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 11), AllocStatus::kOk);  // pages 0, 1, 2 (2 partial)
  EXPECT_EQ(cache.insert(tokens, allocator.block_table(1).first(2)), 2);
  EXPECT_EQ(table_of(allocator, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(cache.num_cached_pages(), 2);
  EXPECT_EQ(allocator.ref_count(0), 2);  // request + tree
  EXPECT_EQ(allocator.ref_count(2), 1);
  // The same 8 tokens: a match of at most 8 - 1 tokens is one page.
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  RadixCache::Match match = cache.match(prompt, 7);
  EXPECT_EQ(match.pages, (std::vector<int32_t>{0}));
  EXPECT_EQ(match.num_tokens, 4);
  prompt.push_back(99);
  match = cache.match(prompt, 8);
  EXPECT_EQ(match.pages, (std::vector<int32_t>{0, 1}));
  // A prompt diverging inside the second page reuses the first only.
  match = cache.match(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 0, 8, 9}, 8);
  EXPECT_EQ(match.pages, (std::vector<int32_t>{0}));
  match = cache.match(std::vector<int32_t>{7, 2, 3, 4, 5}, 4);
  EXPECT_TRUE(match.pages.empty());
  cache.check_consistency();
  allocator.check_consistency();
  // Inserting again changes nothing.
  EXPECT_EQ(cache.insert(tokens, allocator.block_table(1).first(2)), 0);
  allocator.free(1);
  EXPECT_EQ(allocator.num_free_pages(), 14);  // the tree keeps pages 0 and 1
  EXPECT_EQ(cache.clear(), 2);
  EXPECT_EQ(allocator.num_free_pages(), 16);
  cache.check_consistency();
}

TEST(RadixCache, DivergingInsertSplitsAndEvictionKeepsUsedPages) {
  PageAllocator allocator(8, 2);
  RadixCache cache(allocator);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 6), AllocStatus::kOk);  // pages 0 1 2
  const std::vector<int32_t> a = {1, 1, 2, 2, 3, 3};
  EXPECT_EQ(cache.insert(a, allocator.block_table(1)), 3);
  // b shares the first page of a, then diverges: the node splits at one page.
  const std::vector<int32_t> b = {1, 1, 5, 5, 6, 6};
  RadixCache::Match match = cache.match(b, 5);
  ASSERT_EQ(match.pages, (std::vector<int32_t>{0}));
  allocator.add_shared_request(2, match.pages);
  ASSERT_EQ(allocator.grow(2, 6), AllocStatus::kOk);  // pages 3 4
  EXPECT_EQ(cache.insert(b, allocator.block_table(2)), 2);
  EXPECT_EQ(cache.num_cached_pages(), 5);
  cache.check_consistency();
  allocator.check_consistency();
  EXPECT_EQ(allocator.ref_count(0), 3);  // two requests + tree
  // Everything is in use: nothing evictable.
  EXPECT_EQ(cache.num_evictable_pages(), 0);
  EXPECT_EQ(cache.evict(8), 0);
  allocator.free(1);
  // a's tail (pages 1 2) is now unreferenced; page 0 is still used by request 2.
  EXPECT_EQ(cache.num_evictable_pages(), 2);
  EXPECT_EQ(cache.evict(1), 2);  // whole leaves
  EXPECT_EQ(cache.num_cached_pages(), 3);
  EXPECT_EQ(cache.match(a, 5).pages, (std::vector<int32_t>{0}));
  allocator.free(2);
  EXPECT_EQ(cache.evict(100), 3);
  EXPECT_EQ(allocator.num_free_pages(), 8);
  cache.check_consistency();
  allocator.check_consistency();
}

TEST(RadixCache, EvictsLeastRecentlyUsedFirst) {
  PageAllocator allocator(8, 1);
  RadixCache cache(allocator);
  for (int32_t id = 1; id <= 3; ++id) {
    allocator.add_request(id);
    ASSERT_EQ(allocator.grow(id, 2), AllocStatus::kOk);
    const std::vector<int32_t> tokens = {id * 10, id * 10 + 1};
    cache.insert(tokens, allocator.block_table(id));
    allocator.free(id);
  }
  // Touch sequence 1, so 2 is the oldest.
  cache.match(std::vector<int32_t>{10, 11, 0}, 2);
  EXPECT_EQ(cache.evict(2), 2);
  EXPECT_EQ(cache.match(std::vector<int32_t>{20, 21, 0}, 2).num_tokens, 0);
  EXPECT_EQ(cache.match(std::vector<int32_t>{10, 11, 0}, 2).num_tokens, 2);
  EXPECT_EQ(cache.match(std::vector<int32_t>{30, 31, 0}, 2).num_tokens, 2);
  cache.check_consistency();
}

// Inserts that resume at a cursor keep least-recently-used order as a walk from the root defines
// it: a node's time is that of the last walk through it. Page size 1, one page per token, one
// clock tick per insert:
//   x: [1] t1, [1 2] t2 (resumes at [1]), [1 2 3] t4 (resumes at [1 2]: [1] is not visited)
//   y: [7] t3, z: [8] t5
// A root walk would give [1] the time t4. With y still holding [7], evicting two pages takes
// [1 2 3] and [1 2] (t4; z's [8] is t5), which leaves [1] a leaf. Once y lets [7] go, the oldest
// leaf is [7] (t3), not [1]: an implementation that kept [1] at its own t2 would evict [1].
TEST(RadixCache, CursorInsertsKeepLeastRecentlyUsedOrder) {
  PageAllocator allocator(16, 1);
  RadixCache cache(allocator);
  auto sequence = [&](RequestId id, int64_t tokens) {
    allocator.add_request(id);
    EXPECT_EQ(allocator.grow(id, tokens), AllocStatus::kOk);
  };
  const std::vector<int32_t> x = {1, 2, 3};
  sequence(1, 3);
  RadixCache::Cursor cursor;
  const std::span<const int32_t> xs(x);
  EXPECT_EQ(cache.insert(xs.first(1), allocator.block_table(1).first(1), &cursor), 1);
  EXPECT_EQ(cache.insert(xs.first(2), allocator.block_table(1).first(2), &cursor), 1);
  sequence(2, 1);
  EXPECT_EQ(cache.insert(std::vector<int32_t>{7}, allocator.block_table(2)), 1);
  EXPECT_EQ(cache.insert(xs, allocator.block_table(1), &cursor), 1);
  sequence(3, 1);
  EXPECT_EQ(cache.insert(std::vector<int32_t>{8}, allocator.block_table(3)), 1);
  allocator.free(1);
  allocator.free(3);
  cache.check_consistency();
  auto cached = [&](int32_t token) {  // marks what it finds as used: probe only at the end
    return cache.match(std::vector<int32_t>{token, 0}, 1).num_tokens == 1;
  };
  EXPECT_EQ(cache.evict(2), 2);  // [1 2 3], [1 2]
  allocator.free(2);
  EXPECT_EQ(cache.evict(1), 1);  // [7] (t3), before [1] (t4)
  EXPECT_EQ(cache.num_cached_pages(), 2);
  EXPECT_FALSE(cached(7));
  EXPECT_TRUE(cached(1));
  EXPECT_TRUE(cached(8));
  EXPECT_FALSE(cache.match(std::vector<int32_t>{1, 2, 0}, 2).num_tokens == 2);
  cache.check_consistency();
  allocator.check_consistency();

  // An insert that adds nothing still marks the cursor's node as used: [5] t6, [6] t7, [5] again
  // t8, so [6] goes first.
  sequence(4, 1);
  sequence(5, 1);
  RadixCache::Cursor again;
  EXPECT_EQ(cache.insert(std::vector<int32_t>{5}, allocator.block_table(4), &again), 1);
  EXPECT_EQ(cache.insert(std::vector<int32_t>{6}, allocator.block_table(5)), 1);
  EXPECT_EQ(cache.insert(std::vector<int32_t>{5}, allocator.block_table(4), &again), 0);
  allocator.free(4);
  allocator.free(5);
  EXPECT_EQ(cache.evict(3), 3);  // [1] and [8] (last used by the probes above), then [6]
  EXPECT_TRUE(cached(5));
  EXPECT_FALSE(cached(6));
  cache.check_consistency();
}

// The same random workload on two caches over two identical allocators: one inserts with a
// cursor per sequence, the other walks from the root every time. Page ids are handed out
// deterministically, so any difference in what is cached, what a match returns or which pages an
// eviction frees (least-recently-used order) shows up as a difference in pages or counts.
TEST(RadixCache, CursorInsertsMatchRootWalks) {
  for (const int32_t page_size : {1, 2, 4}) {
    SCOPED_TRACE("page size " + std::to_string(page_size));
    const int32_t num_pages = 48;
    std::mt19937_64 rng(77 + static_cast<uint64_t>(page_size));
    auto uniform = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    PageAllocator root_allocator(num_pages, page_size), cursor_allocator(num_pages, page_size);
    RadixCache root_cache(root_allocator), cursor_cache(cursor_allocator);
    struct Live {
      std::vector<int32_t> tokens;
      RadixCache::Cursor cursor;
    };
    std::map<RequestId, Live> live;
    RequestId next = 0;
    // Grows `id` in both, evicting as the engine's KvManager does; false: no room even so.
    auto grow = [&](RequestId id, int64_t tokens) {
      const AllocStatus a = root_allocator.grow(id, tokens);
      const AllocStatus b = cursor_allocator.grow(id, tokens);
      EXPECT_EQ(a, b);
      if (a == AllocStatus::kOk) return true;
      const int32_t short_by =
          root_allocator.pages_needed(id, tokens) - root_allocator.num_free_pages();
      EXPECT_EQ(root_cache.evict(short_by), cursor_cache.evict(short_by));
      const AllocStatus c = root_allocator.grow(id, tokens);
      EXPECT_EQ(c, cursor_allocator.grow(id, tokens));
      return c == AllocStatus::kOk;
    };
    for (int op = 0; op < 4000; ++op) {
      const int64_t kind = uniform(0, 9);
      if (kind < 3 || live.empty()) {  // a new sequence: match, share, grow
        std::vector<int32_t> tokens(static_cast<size_t>(uniform(1, 12)));
        for (int32_t& token : tokens) token = static_cast<int32_t>(uniform(0, 1));
        const int64_t limit = static_cast<int64_t>(tokens.size()) - 1;
        const RadixCache::Match a = root_cache.match(tokens, limit);
        const RadixCache::Match b = cursor_cache.match(tokens, limit);
        ASSERT_EQ(a.pages, b.pages) << "op " << op;
        const RequestId id = next++;
        root_allocator.add_shared_request(id, a.pages);
        cursor_allocator.add_shared_request(id, b.pages);
        if (!grow(id, static_cast<int64_t>(tokens.size()))) {
          root_allocator.free(id);
          cursor_allocator.free(id);
          continue;
        }
        live.emplace(id, Live{tokens, {}});
      } else if (kind < 8) {  // a live sequence grows (decode or a chunk) and caches its pages
        auto it = live.begin();
        std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
        Live& sequence = it->second;
        const size_t added = static_cast<size_t>(uniform(1, 2 * page_size));
        for (size_t i = 0; i < added; ++i) {
          sequence.tokens.push_back(static_cast<int32_t>(uniform(0, 1)));
        }
        if (!grow(it->first, static_cast<int64_t>(sequence.tokens.size()))) {
          sequence.tokens.resize(sequence.tokens.size() - added);
          continue;
        }
        const size_t full = sequence.tokens.size() / static_cast<size_t>(page_size);
        const int32_t a =
            root_cache.insert(sequence.tokens, root_allocator.block_table(it->first).first(full));
        const int32_t b = cursor_cache.insert(
            sequence.tokens, cursor_allocator.block_table(it->first).first(full), &sequence.cursor);
        ASSERT_EQ(a, b) << "op " << op;
      } else if (kind < 9) {  // a sequence finishes
        auto it = live.begin();
        std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
        root_allocator.free(it->first);
        cursor_allocator.free(it->first);
        live.erase(it);
      } else {
        const int32_t count = static_cast<int32_t>(uniform(1, 4));
        ASSERT_EQ(root_cache.evict(count), cursor_cache.evict(count)) << "op " << op;
      }
      ASSERT_EQ(root_cache.num_cached_pages(), cursor_cache.num_cached_pages()) << "op " << op;
      ASSERT_EQ(root_allocator.num_free_pages(), cursor_allocator.num_free_pages());
      for (int32_t page = 0; page < num_pages; ++page) {
        ASSERT_EQ(root_allocator.ref_count(page), cursor_allocator.ref_count(page))
            << "op " << op << " page " << page;
      }
      cursor_cache.check_consistency();
      cursor_allocator.check_consistency();
    }
    for (const auto& [id, sequence] : live) {
      root_allocator.free(id);
      cursor_allocator.free(id);
    }
    EXPECT_EQ(root_cache.clear(), cursor_cache.clear());
    EXPECT_EQ(cursor_allocator.num_free_pages(), num_pages);
  }
}

class RadixCacheProperty : public ::testing::TestWithParam<std::tuple<int32_t, int32_t>> {};

TEST_P(RadixCacheProperty, MatchesAreCorrectAndMaximalAndNothingLeaks) {
  const auto [page_size, num_pages] = GetParam();
  const uint64_t seed = 1000 + static_cast<uint64_t>(page_size * 131 + num_pages);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  PageAllocator allocator(num_pages, page_size);
  std::vector<int32_t> pool(static_cast<size_t>(num_pages) * page_size, -1);
  std::vector<std::vector<int32_t>> inserted;  // for the maximality check
  bool evicted = false;
  const bool small_pool = num_pages < 100;
  {
    RadixCache cache(allocator);
    std::map<RequestId, std::vector<int32_t>> live;
    RequestId next = 0;
    for (int op = 0; op < 3000; ++op) {
      const int64_t kind = small_pool ? uniform(0, 9) : uniform(0, 8);
      if (kind < 6) {
        std::vector<int32_t> tokens(static_cast<size_t>(uniform(1, 40)));
        const int32_t lead = static_cast<int32_t>(uniform(0, 2));
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = i < 12 ? lead : static_cast<int32_t>(uniform(0, 2));
        }
        const int64_t limit = static_cast<int64_t>(tokens.size()) - 1;
        const RadixCache::Match match = cache.match(tokens, limit);
        ASSERT_LE(match.num_tokens, limit);
        ASSERT_EQ(match.num_tokens % page_size, 0);
        for (int64_t i = 0; i < match.num_tokens; ++i) {
          const int32_t page = match.pages[static_cast<size_t>(i / page_size)];
          ASSERT_EQ(pool[static_cast<size_t>(page * page_size + i % page_size)],
                    tokens[static_cast<size_t>(i)])
              << "match returned a page with other contents";
        }
        if (!evicted) {
          int64_t best = 0;
          for (const auto& other : inserted) {
            int64_t same = 0;
            while (same < static_cast<int64_t>(std::min(other.size(), tokens.size())) &&
                   other[size_t(same)] == tokens[size_t(same)]) {
              ++same;
            }
            best = std::max(best, std::min(same, limit) / page_size * page_size);
          }
          ASSERT_EQ(match.num_tokens, best) << "match is not the longest cached prefix";
        }
        const RequestId id = next++;
        allocator.add_shared_request(id, match.pages);
        const int64_t length = static_cast<int64_t>(tokens.size());
        if (allocator.grow(id, length) != AllocStatus::kOk) {
          const int32_t short_by = allocator.pages_needed(id, length) - allocator.num_free_pages();
          if (cache.evict(short_by) > 0) evicted = true;
          if (allocator.grow(id, length) != AllocStatus::kOk) {
            allocator.free(id);
            continue;
          }
        }
        const auto table = allocator.block_table(id);
        for (int64_t i = match.num_tokens; i < length; ++i) {
          const int32_t page = table[static_cast<size_t>(i / page_size)];
          ASSERT_EQ(allocator.ref_count(page), 1) << "a fresh page is shared";
          pool[static_cast<size_t>(page * page_size + i % page_size)] = tokens[size_t(i)];
        }
        const size_t full = static_cast<size_t>(length / page_size);
        cache.insert(tokens, table.first(full));
        inserted.push_back(std::vector<int32_t>(tokens.begin(), tokens.begin() + full * page_size));
        live.emplace(id, tokens);
      } else if (kind < 9 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
        allocator.free(it->first);
        live.erase(it);
      } else {
        if (cache.evict(static_cast<int32_t>(uniform(1, 4))) > 0) evicted = true;
      }
      if (small_pool || op % 50 == 0) {  // O(pool) checks: every op on the small pool
        allocator.check_consistency();
        cache.check_consistency();
        ASSERT_LE(cache.num_evictable_pages(), cache.num_cached_pages());
      }
    }
    for (const auto& [id, tokens] : live) allocator.free(id);
    // The large pool never evicts, so every match there was checked for maximality.
    EXPECT_EQ(evicted, small_pool);
    EXPECT_EQ(allocator.num_free_pages() + cache.num_cached_pages(), num_pages);
    EXPECT_EQ(cache.num_evictable_pages(), cache.num_cached_pages());
    cache.clear();
    EXPECT_EQ(allocator.num_free_pages(), num_pages);
  }
  allocator.check_consistency();
}

INSTANTIATE_TEST_SUITE_P(PagesAndPools, RadixCacheProperty,
                         ::testing::Combine(::testing::Values(1, 2, 4, 16),
                                            ::testing::Values(12, 16000)));

}  // namespace
}  // namespace pagedattn::engine
