// The radix prefix cache: a tree over the token ids of full allocation pages, whose pages are
// held in the page allocator itself, so reference counts are shared with the requests.
//
// Each edge of the tree is a run of whole pages: a node holds `tokens` (a multiple of the page
// size P) and the `pages` that hold their KV. The node owns its pages through an allocator
// request of its own (a negative id) created with add_shared_request, so a cached page has
// reference count 1 + the number of requests using it; check_consistency() on the allocator
// keeps working. A node is evictable when it is a leaf and every page has count 1 (the tree is
// its only user); eviction frees least-recently-used evictable leaves (a parent whose last child
// goes becomes a candidate in turn). A node's time of last use counts every walk through it: its
// own time, or a descendant's (an insert resumed at a Cursor marks only the node it resumes at;
// an evicted node hands its time to its parent, before the parent can be a leaf).
//
// Reuse is whole pages only: the partial last page of a prompt is never shared (no copy-on-write
// of a partial page), and a match is cut to at most max_tokens tokens (the engine passes
// prompt_len - 1, so at least one token is computed and gives the logits). Matching splits a
// node where the match ends inside it, so evictability stays per node.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {

class RadixCache {
  struct Node;

 public:
  explicit RadixCache(PageAllocator& allocator);
  ~RadixCache();  // releases every page it holds (the allocator must outlive the cache)
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  struct Match {
    std::vector<int32_t> pages;  // the cached pages of the prefix, in order
    int64_t num_tokens = 0;      // pages.size() * page_size
  };
  // The longest cached prefix of `tokens` in whole pages, of at most `max_tokens` tokens. Marks
  // the path as recently used. The caller takes its references (add_shared_request) before any
  // eviction can run.
  Match match(std::span<const int32_t> tokens, int64_t max_tokens);

  // Where an insert's walk ended, kept by the caller per sequence: the sequence's next insert
  // (the same tokens and more) resumes there instead of at the root, so caching a decode's new
  // page costs one lookup, not one per page of its context. An eviction since (which may have
  // freed the node) makes it stale, and the walk starts at the root again; splits keep it valid
  // (the node it names keeps its end). A default Cursor is empty.
  struct Cursor {
    Node* node = nullptr;  // its end is `pages` pages from the root
    size_t pages = 0;
    uint64_t evictions = 0;  // the cache's count when it was taken
  };

  // Caches the first pages.size() full pages of `tokens` (tokens.size() >= pages.size() * P), whose
  // KV is in `pages` (in use by the caller). Pages already cached for the same tokens are kept as
  // they are (the caller's duplicate stays the caller's). Returns how many pages became cached.
  // With `cursor` (from this caller's previous insert, whose tokens these extend): the same
  // result, the walk resumed at the cursor; the cursor is updated.
  int32_t insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                 Cursor* cursor = nullptr);

  // Frees least-recently-used unreferenced leaves until at least `num_pages` pages were returned
  // to the allocator or nothing more is evictable. Returns the pages freed.
  int32_t evict(int32_t num_pages);
  // Frees everything unreferenced.
  int32_t clear() { return evict(num_cached_pages()); }

  int32_t num_cached_pages() const { return num_cached_pages_; }
  int32_t num_evictable_pages() const;  // walks the tree
  int32_t page_size() const { return page_size_; }

  // Throws Error if the tree is malformed or its pages disagree with the allocator.
  void check_consistency() const;

 private:
  // Orders keys (a page of tokens) lexicographically, as std::less of the vectors does, and finds
  // them by a span into a caller's tokens, so a lookup copies nothing.
  struct PageLess {
    using is_transparent = void;
    bool operator()(std::span<const int32_t> a, std::span<const int32_t> b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
    }
  };
  struct Node {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pages;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>, PageLess> children;  // by first page
    Node* parent = nullptr;
    RequestId holder = 0;  // the allocator request holding `pages`
    uint64_t last_used = 0;
  };

  std::vector<int32_t> key_at(std::span<const int32_t> tokens, size_t page) const;
  std::span<const int32_t> page_at(std::span<const int32_t> tokens, size_t page) const {
    return tokens.subspan(page * static_cast<size_t>(page_size_), static_cast<size_t>(page_size_));
  }
  // Whole pages that `node` shares with tokens[page * P ..], at most `limit` pages.
  size_t common_pages(const Node& node, std::span<const int32_t> tokens, size_t page,
                      size_t limit) const;
  // Cuts `node` after `num_pages` pages: returns the new head (holding the first num_pages).
  Node* split(Node* node, size_t num_pages);
  RequestId hold(std::span<const int32_t> pages);
  bool evictable(const Node& node) const;
  void check_node(const Node& node, int32_t* total) const;

  PageAllocator& allocator_;
  int32_t page_size_;
  Node root_;
  RequestId next_holder_ = -1;
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;  // nodes evicted so far (Cursor)
  int32_t num_cached_pages_ = 0;
};

}  // namespace pagedattn::engine
