// PageAllocator: explicit cases (growth, fork of a full and of a partial last page, running out
// of pages, misuse) and a property test of long random sequences of add / grow / fork / free
// against a simple independent model.
//
// The model keeps, per request, its token count and the token *contents* it should see: every
// token written gets a unique value, stored in a simulated pool [num_pages][page_size] through
// the allocator's block table (fork's PageCopy is applied to the pool). After every operation:
// each request reads back exactly its own tokens through its block table (so a shared page was
// never written, a copy was made where needed), page reference counts recomputed from all block
// tables equal ref_count(), the free count equals the pages no table names, and
// check_consistency() passes. An operation that reports kOutOfPages or throws must leave every
// block table, count and the free count exactly as they were.
#include "pagedattn/page_allocator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "pagedattn/error.h"

namespace pagedattn {
namespace {

std::vector<int32_t> table(const PageAllocator& allocator, RequestId id) {
  const auto span = allocator.block_table(id);
  return {span.begin(), span.end()};
}

TEST(PageAllocator, GrowAllocatesCeilPagesAndFreeReturnsThem) {
  PageAllocator allocator(8, 4);
  EXPECT_EQ(allocator.num_free_pages(), 8);
  allocator.add_request(1);
  EXPECT_EQ(allocator.pages_needed(1, 9), 3);
  EXPECT_EQ(allocator.pages_needed(99, 4), 1);  // an unknown request counts as new
  ASSERT_EQ(allocator.grow(1, 9), AllocStatus::kOk);
  EXPECT_EQ(table(allocator, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(allocator.num_tokens(1), 9);
  ASSERT_EQ(allocator.grow(1, 12), AllocStatus::kOk);  // fills the last page: no new page
  EXPECT_EQ(table(allocator, 1).size(), 3u);
  ASSERT_EQ(allocator.grow(1, 13), AllocStatus::kOk);
  EXPECT_EQ(table(allocator, 1).size(), 4u);
  EXPECT_EQ(allocator.num_used_pages(), 4);
  allocator.check_consistency();
  allocator.free(1);
  EXPECT_EQ(allocator.num_free_pages(), 8);
  EXPECT_FALSE(allocator.has_request(1));
  allocator.check_consistency();
}

TEST(PageAllocator, ForkOfFullPagesSharesEverything) {
  PageAllocator allocator(8, 4);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 8), AllocStatus::kOk);
  PageCopy copy{-1, -1, -1};
  ASSERT_EQ(allocator.fork(1, 2, &copy), AllocStatus::kOk);
  EXPECT_EQ(copy.num_tokens, 0);
  EXPECT_EQ(table(allocator, 2), table(allocator, 1));
  EXPECT_EQ(allocator.num_tokens(2), 8);
  for (int32_t page : table(allocator, 1)) EXPECT_EQ(allocator.ref_count(page), 2);
  EXPECT_EQ(allocator.num_used_pages(), 2);
  // Both grow into private pages.
  ASSERT_EQ(allocator.grow(1, 9), AllocStatus::kOk);
  ASSERT_EQ(allocator.grow(2, 9), AllocStatus::kOk);
  EXPECT_NE(table(allocator, 1)[2], table(allocator, 2)[2]);
  allocator.free(1);
  for (int32_t page : table(allocator, 2)) EXPECT_EQ(allocator.ref_count(page), 1);
  allocator.check_consistency();
}

TEST(PageAllocator, ForkOfPartialLastPageCopiesIt) {
  PageAllocator allocator(8, 4);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 10), AllocStatus::kOk);  // pages 0, 1 full; page 2 holds 2 tokens
  PageCopy copy;
  ASSERT_EQ(allocator.fork(1, 2, &copy), AllocStatus::kOk);
  const std::vector<int32_t> parent = table(allocator, 1), child = table(allocator, 2);
  ASSERT_EQ(child.size(), 3u);
  EXPECT_EQ(child[0], parent[0]);
  EXPECT_EQ(child[1], parent[1]);
  EXPECT_NE(child[2], parent[2]);
  EXPECT_EQ(copy.src, parent[2]);
  EXPECT_EQ(copy.dst, child[2]);
  EXPECT_EQ(copy.num_tokens, 2);
  EXPECT_EQ(allocator.ref_count(parent[0]), 2);
  EXPECT_EQ(allocator.ref_count(parent[2]), 1);
  EXPECT_EQ(allocator.ref_count(child[2]), 1);
  allocator.check_consistency();
}

TEST(PageAllocator, ForkOfEmptyRequest) {
  PageAllocator allocator(2, 4);
  allocator.add_request(1);
  PageCopy copy;
  ASSERT_EQ(allocator.fork(1, 2, &copy), AllocStatus::kOk);
  EXPECT_TRUE(table(allocator, 2).empty());
  EXPECT_EQ(copy.num_tokens, 0);
  allocator.check_consistency();
}

TEST(PageAllocator, OutOfPagesChangesNothing) {
  PageAllocator allocator(4, 2);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 5), AllocStatus::kOk);  // 3 pages, last partial
  allocator.add_request(2);
  EXPECT_EQ(allocator.grow(2, 3), AllocStatus::kOutOfPages);  // needs 2, 1 free
  EXPECT_EQ(allocator.num_tokens(2), 0);
  EXPECT_TRUE(table(allocator, 2).empty());
  EXPECT_EQ(allocator.num_free_pages(), 1);
  ASSERT_EQ(allocator.grow(2, 2), AllocStatus::kOk);  // takes the last page
  PageCopy copy{7, 7, 7};
  EXPECT_EQ(allocator.fork(1, 3, &copy), AllocStatus::kOutOfPages);  // partial page, none free
  EXPECT_FALSE(allocator.has_request(3));
  EXPECT_EQ(copy.num_tokens, 7);  // untouched
  EXPECT_EQ(allocator.grow(1, 7), AllocStatus::kOutOfPages);
  EXPECT_EQ(allocator.num_tokens(1), 5);
  ASSERT_EQ(allocator.grow(1, 6), AllocStatus::kOk);         // fits the partial page
  ASSERT_EQ(allocator.fork(1, 3, &copy), AllocStatus::kOk);  // now full: shares, needs none
  EXPECT_EQ(copy.num_tokens, 0);
  allocator.check_consistency();
}

TEST(PageAllocator, ZeroPagesPool) {
  PageAllocator allocator(0, 16);
  allocator.add_request(1);
  EXPECT_EQ(allocator.grow(1, 0), AllocStatus::kOk);
  EXPECT_EQ(allocator.grow(1, 1), AllocStatus::kOutOfPages);
  allocator.check_consistency();
}

void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << part << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
  }
}

TEST(PageAllocator, MisuseThrowsAndChangesNothing) {
  expect_error([] { PageAllocator(-1, 4); }, "num_pages: -1");
  expect_error([] { PageAllocator(4, 0); }, "page_size: 0");
  PageAllocator allocator(4, 2);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 3), AllocStatus::kOk);
  expect_error([&] { allocator.add_request(1); }, "request: id 1 already exists");
  expect_error([&] { allocator.grow(7, 1); }, "request: id 7 is not a live request");
  expect_error([&] { allocator.grow(1, 2); }, "num_tokens: 2 is fewer than request 1");
  expect_error([&] { allocator.pages_needed(1, -1); }, "num_tokens: -1");
  PageCopy copy;
  expect_error([&] { allocator.fork(7, 8, &copy); }, "id 7");
  expect_error([&] { allocator.fork(1, 1, &copy); }, "child: id 1 already exists");
  expect_error([&] { allocator.fork(1, 2, nullptr); }, "copy: null");
  expect_error([&] { allocator.ref_count(4); }, "page: id 4 is out of range [0, 4)");
  expect_error([&] { allocator.num_tokens(3); }, "id 3");
  expect_error([&] { allocator.block_table(3); }, "id 3");
  allocator.free(1);
  expect_error([&] { allocator.free(1); }, "request: id 1 is not a live request");  // double free
  EXPECT_EQ(allocator.num_free_pages(), 4);
  allocator.check_consistency();
}

TEST(PageAllocator, SharedRequestHoldsPagesInUse) {
  PageAllocator allocator(6, 4);
  allocator.add_request(1);
  ASSERT_EQ(allocator.grow(1, 10), AllocStatus::kOk);  // pages 0, 1, 2 (2 partial)
  const std::vector<int32_t> shared = {0, 1};
  allocator.add_shared_request(-5, shared);
  EXPECT_EQ(table(allocator, -5), shared);
  EXPECT_EQ(allocator.num_tokens(-5), 8);
  EXPECT_EQ(allocator.ref_count(0), 2);
  EXPECT_EQ(allocator.ref_count(2), 1);
  allocator.check_consistency();
  // The shared request grows into a private page.
  ASSERT_EQ(allocator.grow(-5, 9), AllocStatus::kOk);
  EXPECT_EQ(table(allocator, -5)[2], 3);
  allocator.free(1);  // pages 0 and 1 stay held by -5; page 2 returns
  EXPECT_EQ(allocator.ref_count(0), 1);
  EXPECT_EQ(allocator.num_free_pages(), 3);
  allocator.check_consistency();
  const std::vector<int32_t> free_page = {2};
  expect_error([&] { allocator.add_shared_request(9, free_page); },
               "pages: page 2 is free; only pages in use can be shared");
  const std::vector<int32_t> bad = {6};
  expect_error([&] { allocator.add_shared_request(9, bad); }, "pages: id 6 is out of range");
  expect_error([&] { allocator.add_shared_request(-5, shared); }, "request: id -5 already");
  EXPECT_FALSE(allocator.has_request(9));
  allocator.free(-5);
  EXPECT_EQ(allocator.num_free_pages(), 6);
  allocator.check_consistency();
}

// ---- property test ----

struct ModelRequest {
  std::vector<int64_t> tokens;  // the values this request must read back, in order
};

class Simulation {
 public:
  Simulation(int32_t num_pages, int32_t page_size, uint64_t seed)
      : allocator_(num_pages, page_size),
        page_size_(page_size),
        pool_(static_cast<size_t>(num_pages) * page_size, -1),
        rng_(seed) {}

  void run(int steps) {
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(fmt::format("step {}", step));
      one_operation();
      check();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    }
    EXPECT_GT(out_of_pages_, 0) << "the sequence never ran out of pages (pool too large?)";
    EXPECT_GT(forks_, 0);
    // Free everything: no page may be left behind.
    for (const auto& [id, model] : model_) allocator_.free(id);
    model_.clear();
    EXPECT_EQ(allocator_.num_free_pages(), allocator_.num_pages());
    allocator_.check_consistency();
  }

 private:
  struct Snapshot {
    std::map<RequestId, std::vector<int32_t>> tables;
    std::map<RequestId, int64_t> tokens;
    std::vector<bool> free_count;  // per page: free (no references)
    int32_t num_free = 0;
    friend bool operator==(const Snapshot&, const Snapshot&) = default;
  };

  RequestId pick_live() {
    auto it = model_.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, model_.size() - 1)(rng_));
    return it->first;
  }

  // Writes the model's new tokens [from, to) of `id` through its block table into the pool.
  void write_tokens(RequestId id, size_t from) {
    const auto pages = allocator_.block_table(id);
    const std::vector<int64_t>& tokens = model_[id].tokens;
    for (size_t t = from; t < tokens.size(); ++t) {
      pool_[static_cast<size_t>(pages[t / page_size_]) * page_size_ + t % page_size_] = tokens[t];
    }
  }

  void one_operation() {
    const int choice = std::uniform_int_distribution<int>(0, 99)(rng_);
    const Snapshot before = snapshot();
    if (model_.empty() || choice < 15) {  // add, and usually prefill; queued when out of pages
      const RequestId id = next_id_++;
      allocator_.add_request(id);
      model_[id];
      if (!grow(id, std::uniform_int_distribution<int64_t>(0, 5 * page_size_)(rng_), snapshot())) {
        allocator_.free(id);
        model_.erase(id);
      }
    } else if (choice < 60) {  // decode-like growth: 1 token, or a small extend
      const RequestId id = pick_live();
      const int64_t extra =
          choice < 55 ? 1 : std::uniform_int_distribution<int64_t>(0, 3 * page_size_)(rng_);
      grow(id, static_cast<int64_t>(model_[id].tokens.size()) + extra, before);
    } else if (choice < 72) {  // fork
      const RequestId parent = pick_live(), child = next_id_++;
      PageCopy copy{-5, -5, -5};
      const AllocStatus status = allocator_.fork(parent, child, &copy);
      if (status == AllocStatus::kOutOfPages) {
        ++out_of_pages_;
        EXPECT_NE(model_[parent].tokens.size() % page_size_, 0u) << "fork of full pages needs none";
        EXPECT_EQ(snapshot(), before) << "kOutOfPages changed the allocator";
        return;
      }
      ++forks_;
      const size_t partial = model_[parent].tokens.size() % page_size_;
      ASSERT_EQ(copy.num_tokens, static_cast<int32_t>(partial));
      if (partial > 0) {
        EXPECT_EQ(before.free_count[copy.dst], true) << "copy destination was not free";
        EXPECT_EQ(copy.src, allocator_.block_table(parent).back());
        EXPECT_EQ(copy.dst, allocator_.block_table(child).back());
        for (size_t i = 0; i < partial; ++i) {
          pool_[static_cast<size_t>(copy.dst) * page_size_ + i] =
              pool_[static_cast<size_t>(copy.src) * page_size_ + i];
        }
      }
      model_[child] = model_[parent];
    } else if (choice < 97) {  // finish
      const RequestId id = pick_live();
      allocator_.free(id);
      model_.erase(id);
    } else {  // misuse: must throw and change nothing
      const RequestId id = pick_live();
      if (choice == 97) {
        EXPECT_THROW(allocator_.free(next_id_ + 100), Error);
      } else if (choice == 98 && !model_[id].tokens.empty()) {
        EXPECT_THROW(allocator_.grow(id, static_cast<int64_t>(model_[id].tokens.size()) - 1),
                     Error);
      } else {
        PageCopy copy;
        EXPECT_THROW(allocator_.fork(id, id, &copy), Error);
      }
      EXPECT_EQ(snapshot(), before) << "a rejected call changed the allocator";
    }
  }

  // Returns whether the growth succeeded.
  bool grow(RequestId id, int64_t num_tokens, const Snapshot& before) {
    const size_t old_size = model_[id].tokens.size();
    const std::vector<int32_t> old_table = table(allocator_, id);
    const AllocStatus status = allocator_.grow(id, num_tokens);
    const int64_t needed_pages =
        (num_tokens + page_size_ - 1) / page_size_ - static_cast<int64_t>(old_table.size());
    const int64_t free_before =
        std::count(before.free_count.begin(), before.free_count.end(), true);
    if (status == AllocStatus::kOutOfPages) {
      ++out_of_pages_;
      EXPECT_GT(needed_pages, free_before) << "kOutOfPages although enough pages were free";
      EXPECT_EQ(snapshot(), before) << "kOutOfPages changed the allocator";
      return false;
    }
    EXPECT_LE(needed_pages, free_before);
    const std::vector<int32_t> new_table = table(allocator_, id);
    EXPECT_GE(new_table.size(), old_table.size());
    EXPECT_TRUE(new_table.size() >= old_table.size() &&
                std::equal(old_table.begin(), old_table.end(), new_table.begin()))
        << "grow changed existing block-table entries";
    for (size_t i = old_table.size(); i < new_table.size(); ++i) {
      EXPECT_TRUE(before.free_count[new_table[i]])
          << "grow handed out page " << new_table[i] << " which was in use";
    }
    for (int64_t t = static_cast<int64_t>(old_size); t < num_tokens; ++t) {
      model_[id].tokens.push_back(next_value_++);
    }
    write_tokens(id, old_size);
    return true;
  }

  Snapshot snapshot() const {
    Snapshot s;
    for (RequestId id : allocator_.requests()) {
      s.tables[id] = table(allocator_, id);
      s.tokens[id] = allocator_.num_tokens(id);
    }
    s.free_count.assign(static_cast<size_t>(allocator_.num_pages()), false);
    for (int32_t p = 0; p < allocator_.num_pages(); ++p)
      s.free_count[p] = allocator_.ref_count(p) == 0;
    s.num_free = allocator_.num_free_pages();
    return s;
  }

  void check() {
    ASSERT_NO_THROW(allocator_.check_consistency());
    std::vector<int32_t> counts(static_cast<size_t>(allocator_.num_pages()), 0);
    std::vector<RequestId> ids;
    for (const auto& [id, model] : model_) ids.push_back(id);
    ASSERT_EQ(allocator_.requests(), ids);
    for (const auto& [id, model] : model_) {
      const auto pages = allocator_.block_table(id);
      ASSERT_EQ(allocator_.num_tokens(id), static_cast<int64_t>(model.tokens.size()));
      ASSERT_EQ(static_cast<int64_t>(pages.size()),
                (static_cast<int64_t>(model.tokens.size()) + page_size_ - 1) / page_size_);
      std::set<int32_t> distinct(pages.begin(), pages.end());
      ASSERT_EQ(distinct.size(), pages.size()) << "request " << id << " holds a page twice";
      for (int32_t page : pages) ++counts[static_cast<size_t>(page)];
      for (size_t t = 0; t < model.tokens.size(); ++t) {
        const int64_t got =
            pool_[static_cast<size_t>(pages[t / page_size_]) * page_size_ + t % page_size_];
        ASSERT_EQ(got, model.tokens[t])
            << "request " << id << " token " << t << " was overwritten through a shared page";
      }
    }
    int32_t unused = 0;
    for (int32_t p = 0; p < allocator_.num_pages(); ++p) {
      ASSERT_EQ(allocator_.ref_count(p), counts[static_cast<size_t>(p)]) << "page " << p;
      unused += counts[static_cast<size_t>(p)] == 0;
    }
    ASSERT_EQ(allocator_.num_free_pages(), unused) << "leak or double free";
  }

  PageAllocator allocator_;
  int32_t page_size_;
  std::vector<int64_t> pool_;  // [num_pages * page_size] token values
  std::mt19937_64 rng_;
  std::map<RequestId, ModelRequest> model_;
  RequestId next_id_ = 0;
  int64_t next_value_ = 0;
  int64_t out_of_pages_ = 0;
  int64_t forks_ = 0;
};

struct PropertyCase {
  int32_t num_pages;
  int32_t page_size;
};

class PageAllocatorProperty : public ::testing::TestWithParam<PropertyCase> {};

TEST_P(PageAllocatorProperty, RandomSequencesNeverLeakOrDoubleFree) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  Simulation simulation(GetParam().num_pages, GetParam().page_size, seed);
  simulation.run(3000);
}

INSTANTIATE_TEST_SUITE_P(Pools, PageAllocatorProperty,
                         ::testing::Values(PropertyCase{8, 1}, PropertyCase{16, 4},
                                           PropertyCase{64, 16}, PropertyCase{40, 3}),
                         [](const ::testing::TestParamInfo<PropertyCase>& info) {
                           return fmt::format("pages{}_size{}", info.param.num_pages,
                                              info.param.page_size);
                         });

}  // namespace
}  // namespace pagedattn
