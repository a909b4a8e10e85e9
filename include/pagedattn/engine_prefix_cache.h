// The radix prefix cache: a tree over the token ids of full allocation pages, whose pages are
// held in the page allocator itself, so reference counts are shared with the requests.
//
// Each edge of the tree is a run of whole pages: a node holds `tokens` (a multiple of the page
// size P) and the `pages` that hold their KV. The node owns its pages through an allocator
// request of its own (a negative id) created with add_shared_request, so a cached page has
// reference count 1 + the number of requests using it; check_consistency() on the allocator
// keeps working. A node is evictable when it is a leaf and every page has count 1 (the tree is
// its only user); eviction frees least-recently-used evictable leaves (a parent whose last child
// goes becomes a candidate in turn).
//
// Reuse is whole pages only: the partial last page of a prompt is never shared (no copy-on-write
// of a partial page), and a match is cut to at most max_tokens tokens (the engine passes
// prompt_len - 1, so at least one token is computed and gives the logits). Matching splits a
// node where the match ends inside it, so evictability stays per node.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {

class RadixCache {
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

  // Caches the first pages.size() full pages of `tokens` (tokens.size() >= pages.size() * P), whose
  // KV is in `pages` (in use by the caller). Pages already cached for the same tokens are kept as
  // they are (the caller's duplicate stays the caller's). Returns how many pages became cached.
  int32_t insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

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
  struct Node {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pages;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;  // by first page's tokens
    Node* parent = nullptr;
    RequestId holder = 0;  // the allocator request holding `pages`
    uint64_t last_used = 0;
  };

  std::vector<int32_t> key_at(std::span<const int32_t> tokens, size_t page) const;
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
  int32_t num_cached_pages_ = 0;
};

}  // namespace pagedattn::engine
