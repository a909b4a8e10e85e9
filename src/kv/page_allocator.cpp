// The page allocator: a free stack of page ids, a reference count per page and a block table per
// request.
//
// Invariants (check_consistency verifies them): ref_counts_[p] equals the number of block-table
// entries naming p over all requests; a page is on the free stack exactly when its count is zero,
// and appears there once; request r holds ceil(num_tokens(r) / page_size) pages. Every mutating
// operation first decides whether it can succeed (pages available, ids valid) and only then
// changes state, so kOutOfPages and a thrown Error both leave the allocator as it was.
#include "pagedattn/page_allocator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/check.h"

namespace pagedattn {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

PageAllocator::PageAllocator(int32_t num_pages, int32_t page_size) : page_size_(page_size) {
  PA_CHECK(num_pages >= 0, "num_pages: {} (expected >= 0)", num_pages);
  PA_CHECK(page_size >= 1, "page_size: {} (expected >= 1)", page_size);
  ref_counts_.assign(static_cast<size_t>(num_pages), 0);
  free_pages_.reserve(static_cast<size_t>(num_pages));
  // Pushed in reverse so that a fresh allocator hands out 0, 1, 2, ...
  for (int32_t page = num_pages - 1; page >= 0; --page) free_pages_.push_back(page);
}

const PageAllocator::Request& PageAllocator::get(RequestId request) const {
  const auto it = requests_.find(request);
  PA_CHECK(it != requests_.end(), "request: id {} is not a live request (never added, or freed)",
           request);
  return it->second;
}

PageAllocator::Request& PageAllocator::get(RequestId request) {
  return const_cast<Request&>(std::as_const(*this).get(request));
}

int32_t PageAllocator::ref_count(int32_t page) const {
  PA_CHECK(page >= 0 && page < num_pages(), "page: id {} is out of range [0, {})", page,
           num_pages());
  return ref_counts_[static_cast<size_t>(page)];
}

int32_t PageAllocator::pages_needed(RequestId request, int64_t num_tokens) const {
  PA_CHECK(num_tokens >= 0, "num_tokens: {} (expected >= 0)", num_tokens);
  const int64_t total = ceil_div(num_tokens, page_size_);
  PA_CHECK(total <= std::numeric_limits<int32_t>::max(),
           "num_tokens: {} needs {} pages, more than any allocator holds", num_tokens, total);
  const auto it = requests_.find(request);
  const int64_t held = it == requests_.end() ? 0 : static_cast<int64_t>(it->second.pages.size());
  return static_cast<int32_t>(std::max<int64_t>(0, total - held));
}

void PageAllocator::add_request(RequestId request) {
  PA_CHECK(!requests_.contains(request), "request: id {} already exists", request);
  requests_.emplace(request, Request{});
}

void PageAllocator::add_shared_request(RequestId request, std::span<const int32_t> pages) {
  PA_CHECK(!requests_.contains(request), "request: id {} already exists", request);
  for (const int32_t page : pages) {
    PA_CHECK(page >= 0 && page < num_pages(), "pages: id {} is out of range [0, {})", page,
             num_pages());
    PA_CHECK(ref_counts_[static_cast<size_t>(page)] > 0,
             "pages: page {} is free; only pages in use can be shared", page);
  }
  Request entry;
  entry.pages.assign(pages.begin(), pages.end());
  entry.num_tokens = static_cast<int64_t>(pages.size()) * page_size_;
  for (const int32_t page : pages) ++ref_counts_[static_cast<size_t>(page)];
  requests_.emplace(request, std::move(entry));
}

bool PageAllocator::has_request(RequestId request) const { return requests_.contains(request); }

AllocStatus PageAllocator::grow(RequestId request, int64_t num_tokens) {
  Request& entry = get(request);
  PA_CHECK(num_tokens >= entry.num_tokens,
           "num_tokens: {} is fewer than request {} already holds ({}); requests never shrink",
           num_tokens, request, entry.num_tokens);
  if (num_tokens <= static_cast<int64_t>(entry.pages.size()) * page_size_) {
    entry.num_tokens = num_tokens;  // its pages hold them already (a decode, mostly)
    return AllocStatus::kOk;
  }
  const int32_t needed = pages_needed(request, num_tokens);
  if (needed > num_free_pages()) return AllocStatus::kOutOfPages;
  entry.pages.reserve(entry.pages.size() + static_cast<size_t>(needed));
  for (int32_t i = 0; i < needed; ++i) {
    const int32_t page = free_pages_.back();
    free_pages_.pop_back();
    ref_counts_[static_cast<size_t>(page)] = 1;
    entry.pages.push_back(page);
  }
  entry.num_tokens = num_tokens;
  return AllocStatus::kOk;
}

AllocStatus PageAllocator::fork(RequestId parent, RequestId child, PageCopy* copy) {
  PA_CHECK(copy != nullptr, "copy: null (fork reports the partial page to copy there)");
  const Request& source = get(parent);
  PA_CHECK(!requests_.contains(child), "child: id {} already exists (fork creates it)", child);
  const int32_t partial = static_cast<int32_t>(source.num_tokens % page_size_);
  if (partial > 0 && free_pages_.empty()) return AllocStatus::kOutOfPages;

  Request forked;
  forked.num_tokens = source.num_tokens;
  forked.pages = source.pages;
  *copy = PageCopy{};
  const size_t shared = source.pages.size() - (partial > 0 ? 1 : 0);
  for (size_t i = 0; i < shared; ++i) ++ref_counts_[static_cast<size_t>(source.pages[i])];
  if (partial > 0) {
    const int32_t page = free_pages_.back();
    free_pages_.pop_back();
    ref_counts_[static_cast<size_t>(page)] = 1;
    *copy = PageCopy{source.pages.back(), page, partial};
    forked.pages.back() = page;
  }
  requests_.emplace(child, std::move(forked));  // `source` is not used past this point
  return AllocStatus::kOk;
}

void PageAllocator::free(RequestId request) {
  Request& entry = get(request);
  // Pushed in reverse so that the request's first page is the next one handed out.
  for (auto it = entry.pages.rbegin(); it != entry.pages.rend(); ++it) {
    int32_t& count = ref_counts_[static_cast<size_t>(*it)];
    if (--count == 0) free_pages_.push_back(*it);
  }
  requests_.erase(request);
}

int64_t PageAllocator::num_tokens(RequestId request) const { return get(request).num_tokens; }

std::span<const int32_t> PageAllocator::block_table(RequestId request) const {
  return get(request).pages;
}

std::vector<RequestId> PageAllocator::requests() const {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, entry] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void PageAllocator::check_consistency() const {
  std::vector<int32_t> counts(ref_counts_.size(), 0);
  for (const auto& [id, entry] : requests_) {
    PA_CHECK(static_cast<int64_t>(entry.pages.size()) == ceil_div(entry.num_tokens, page_size_),
             "allocator: request {} holds {} pages for {} tokens (page_size {})", id,
             entry.pages.size(), entry.num_tokens, page_size_);
    for (const int32_t page : entry.pages) {
      PA_CHECK(page >= 0 && page < num_pages(), "allocator: request {} names page {} (of {})", id,
               page, num_pages());
      ++counts[static_cast<size_t>(page)];
    }
  }
  std::vector<bool> on_free_stack(ref_counts_.size(), false);
  for (const int32_t page : free_pages_) {
    PA_CHECK(page >= 0 && page < num_pages(), "allocator: free page {} out of range [0, {})", page,
             num_pages());
    PA_CHECK(!on_free_stack[static_cast<size_t>(page)], "allocator: page {} is free twice", page);
    on_free_stack[static_cast<size_t>(page)] = true;
  }
  for (int32_t page = 0; page < num_pages(); ++page) {
    const size_t p = static_cast<size_t>(page);
    PA_CHECK(ref_counts_[p] == counts[p],
             "allocator: page {} has reference count {} but {} block-table entries", page,
             ref_counts_[p], counts[p]);
    PA_CHECK(on_free_stack[p] == (counts[p] == 0),
             "allocator: page {} is {} with {} references (leaked or double-freed)", page,
             on_free_stack[p] ? "free" : "not free", counts[p]);
  }
}

}  // namespace pagedattn
