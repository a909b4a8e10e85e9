// The page allocator: reference-counted allocation pages and per-request block tables.
//
// Requests grow a token at a time (decode) or many at once (prefill); a request holds
// ceil(num_tokens / page_size) pages. fork() lets a new request share another's full pages (their
// reference count goes up) and gives it a private copy of the partial last page; the caller
// copies that page's contents (copy_tokens in kv_cache.h). Pages are only ever appended to, so a
// shared page is always full and never written again. Running out of pages is an ordinary
// result (AllocStatus::kOutOfPages) that leaves the allocator exactly as it was, so the engine
// can queue or preempt. Misuse (an unknown request id, a double free) throws Error.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace pagedattn {

using RequestId = int64_t;

enum class AllocStatus : uint8_t { kOk, kOutOfPages };

// A partial last page that fork() could not share: the caller copies `num_tokens` tokens of
// page `src` into page `dst`.
struct PageCopy {
  int32_t src = 0;
  int32_t dst = 0;
  int32_t num_tokens = 0;
};

class PageAllocator {
 public:
  PageAllocator(int32_t num_pages, int32_t page_size);

  int32_t num_pages() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t page_size() const { return page_size_; }
  int32_t num_free_pages() const { return static_cast<int32_t>(free_pages_.size()); }
  int32_t num_used_pages() const { return num_pages() - num_free_pages(); }
  // Pages needed to grow `request` (or a new request, when `request` is unknown) to `num_tokens`
  // tokens; 0 when it already holds them.
  int32_t pages_needed(RequestId request, int64_t num_tokens) const;

  // Creates an empty request.
  void add_request(RequestId request);
  // Creates `request` holding `pages` as its first pages, all full (num_tokens = pages.size() *
  // page_size); each page's reference count goes up by one. Every page must already be in use
  // (reference count > 0): sharing is how a prefix cache holds pages and hands a cached prefix to
  // a new request without copying. `request` must be new.
  void add_shared_request(RequestId request, std::span<const int32_t> pages);
  bool has_request(RequestId request) const;
  // Grows `request` to hold `num_tokens` tokens in total, allocating pages as needed; all or
  // nothing. Fewer tokens than it holds is an Error (requests never shrink).
  AllocStatus grow(RequestId request, int64_t num_tokens);
  // Creates `child` sharing `parent`'s full pages; the partial last page, if any, gets a fresh
  // page, described in `copy` (num_tokens 0 when there is none). `child` must be new.
  AllocStatus fork(RequestId parent, RequestId child, PageCopy* copy);
  // Drops the request's references; pages whose count reaches zero return to the free list.
  void free(RequestId request);

  int64_t num_tokens(RequestId request) const;
  std::span<const int32_t> block_table(RequestId request) const;
  int32_t ref_count(int32_t page) const;  // Error for a page id out of range
  std::vector<RequestId> requests() const;

  // Throws Error if any invariant is broken: each page's count equals the number of block-table
  // entries naming it; free pages have count zero and appear once; every page is free or used.
  void check_consistency() const;

 private:
  struct Request {
    std::vector<int32_t> pages;
    int64_t num_tokens = 0;
  };
  const Request& get(RequestId request) const;
  Request& get(RequestId request);

  int32_t page_size_;
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_pages_;  // a stack: recently freed pages are reused first
  std::unordered_map<RequestId, Request> requests_;
};

}  // namespace pagedattn
