// The radix prefix cache (see engine_prefix_cache.h for the design).
//
// Walks compare whole pages: a child is found by its first page's tokens (the map key), then
// compared page by page. A split gives the head and the tail fresh allocator holders before the
// old holder is freed, so no page's count ever passes through zero.
#include <algorithm>
#include <queue>
#include <utility>

#include "core/check.h"
#include "pagedattn/engine_prefix_cache.h"

namespace pagedattn::engine {

RadixCache::RadixCache(PageAllocator& allocator)
    : allocator_(allocator), page_size_(allocator.page_size()) {}

RadixCache::~RadixCache() {
  // Free every holder, deepest first, without throwing.
  std::vector<Node*> stack = {&root_};
  std::vector<Node*> order;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    order.push_back(node);
    for (auto& [key, child] : node->children) stack.push_back(child.get());
  }
  for (Node* node : order) {
    if (node != &root_ && allocator_.has_request(node->holder)) allocator_.free(node->holder);
  }
}

std::vector<int32_t> RadixCache::key_at(std::span<const int32_t> tokens, size_t page) const {
  const size_t begin = page * static_cast<size_t>(page_size_);
  return {tokens.begin() + static_cast<ptrdiff_t>(begin),
          tokens.begin() + static_cast<ptrdiff_t>(begin + static_cast<size_t>(page_size_))};
}

size_t RadixCache::common_pages(const Node& node, std::span<const int32_t> tokens, size_t page,
                                size_t limit) const {
  const size_t p = static_cast<size_t>(page_size_);
  limit = std::min(limit, node.pages.size());
  size_t same = 0;
  while (same < limit && std::equal(node.tokens.begin() + static_cast<ptrdiff_t>(same * p),
                                    node.tokens.begin() + static_cast<ptrdiff_t>((same + 1) * p),
                                    tokens.begin() + static_cast<ptrdiff_t>((page + same) * p))) {
    ++same;
  }
  return same;
}

RequestId RadixCache::hold(std::span<const int32_t> pages) {
  const RequestId holder = next_holder_--;
  allocator_.add_shared_request(holder, pages);
  return holder;
}

RadixCache::Node* RadixCache::split(Node* node, size_t num_pages) {
  const size_t p = static_cast<size_t>(page_size_);
  auto head = std::make_unique<Node>();
  head->tokens.assign(node->tokens.begin(),
                      node->tokens.begin() + static_cast<ptrdiff_t>(num_pages * p));
  head->pages.assign(node->pages.begin(), node->pages.begin() + static_cast<ptrdiff_t>(num_pages));
  head->parent = node->parent;
  head->last_used = node->last_used;
  head->holder = hold(head->pages);
  const RequestId old_holder = node->holder;
  node->tokens.erase(node->tokens.begin(),
                     node->tokens.begin() + static_cast<ptrdiff_t>(num_pages * p));
  node->pages.erase(node->pages.begin(), node->pages.begin() + static_cast<ptrdiff_t>(num_pages));
  node->holder = hold(node->pages);
  allocator_.free(old_holder);

  Node* parent = node->parent;
  auto it = parent->children.find(page_at(head->tokens, 0));
  PA_CHECK(it != parent->children.end() && it->second.get() == node,
           "prefix cache: split lost its node");
  std::unique_ptr<Node> tail = std::move(it->second);
  Node* head_raw = head.get();
  tail->parent = head_raw;
  head_raw->children.emplace(key_at(tail->tokens, 0), std::move(tail));
  it->second = std::move(head);
  return head_raw;
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_tokens) {
  Match result;
  const size_t limit = static_cast<size_t>(
      std::clamp<int64_t>(max_tokens, 0, static_cast<int64_t>(tokens.size())) / page_size_);
  ++clock_;
  Node* node = &root_;
  size_t page = 0;
  while (page < limit) {
    const auto it = node->children.find(page_at(tokens, page));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const size_t same = common_pages(*child, tokens, page, limit - page);
    if (same < child->pages.size()) child = split(child, same);
    child->last_used = clock_;
    result.pages.insert(result.pages.end(), child->pages.begin(), child->pages.end());
    page += same;
    node = child;
  }
  result.num_tokens = static_cast<int64_t>(result.pages.size()) * page_size_;
  return result;
}

int32_t RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                           Cursor* cursor) {
  const size_t p = static_cast<size_t>(page_size_);
  PA_CHECK(tokens.size() >= pages.size() * p,
           "prefix cache: {} tokens cannot fill {} pages of {} tokens", tokens.size(), pages.size(),
           p);
  ++clock_;
  Node* node = &root_;
  size_t page = 0;
  if (cursor != nullptr && cursor->node != nullptr && cursor->evictions == evictions_ &&
      cursor->pages <= pages.size()) {
    // The walk from the root would reach the cursor's node: every node above it matches these
    // tokens whole, and only an eviction removes nodes. It would also mark each node on the way as
    // used; only the cursor's node is marked here, and its ancestors take its time when it is
    // evicted (see evict), which is the only moment their times are read.
    node = cursor->node;
    page = cursor->pages;
    node->last_used = clock_;
  }
  int32_t added = 0;
  while (page < pages.size()) {
    const auto it = node->children.find(page_at(tokens, page));
    if (it == node->children.end()) {
      auto fresh = std::make_unique<Node>();
      fresh->tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(page * p),
                           tokens.begin() + static_cast<ptrdiff_t>(pages.size() * p));
      fresh->pages.assign(pages.begin() + static_cast<ptrdiff_t>(page), pages.end());
      fresh->parent = node;
      fresh->last_used = clock_;
      fresh->holder = hold(fresh->pages);
      added = static_cast<int32_t>(fresh->pages.size());
      Node* fresh_raw = fresh.get();
      node->children.emplace(key_at(fresh->tokens, 0), std::move(fresh));
      num_cached_pages_ += added;
      node = fresh_raw;
      break;
    }
    Node* child = it->second.get();
    const size_t same = common_pages(*child, tokens, page, pages.size() - page);
    if (same < child->pages.size()) child = split(child, same);
    child->last_used = clock_;
    page += same;
    node = child;
  }
  // The walk ends where the inserted pages end (a split cut the last node there if need be).
  if (cursor != nullptr && node != &root_) *cursor = Cursor{node, pages.size(), evictions_};
  return added;
}

bool RadixCache::evictable(const Node& node) const {
  if (&node == &root_ || !node.children.empty()) return false;
  return std::all_of(node.pages.begin(), node.pages.end(),
                     [&](int32_t page) { return allocator_.ref_count(page) == 1; });
}

int32_t RadixCache::evict(int32_t num_pages) {
  using Entry = std::pair<uint64_t, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> leaves;
  std::vector<Node*> stack = {&root_};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (evictable(*node)) leaves.emplace(node->last_used, node);
    for (auto& [key, child] : node->children) stack.push_back(child.get());
  }
  int32_t freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    Node* node = leaves.top().second;
    leaves.pop();
    Node* parent = node->parent;
    const int32_t count = static_cast<int32_t>(node->pages.size());
    allocator_.free(node->holder);
    freed += count;
    num_cached_pages_ -= count;
    // A walk through `node` passed its parent too: the parent's time is at least node's (inserts
    // that resume at a cursor mark only the node they resume at, not its ancestors).
    parent->last_used = std::max(parent->last_used, node->last_used);
    parent->children.erase(key_at(node->tokens, 0));  // destroys `node`
    ++evictions_;
    if (evictable(*parent)) leaves.emplace(parent->last_used, parent);
  }
  return freed;
}

int32_t RadixCache::num_evictable_pages() const {
  // A node is reclaimable when its whole subtree is unreferenced (leaves go first, then it).
  int32_t total = 0;
  auto visit = [&](auto&& self, const Node& node) -> bool {
    bool all = true;
    for (const auto& [key, child] : node.children) all = self(self, *child) && all;
    if (&node == &root_) return all;
    const bool free_here = all && std::all_of(node.pages.begin(), node.pages.end(), [&](int32_t p) {
                             return allocator_.ref_count(p) == 1;
                           });
    if (free_here) total += static_cast<int32_t>(node.pages.size());
    return free_here;
  };
  visit(visit, root_);
  return total;
}

void RadixCache::check_node(const Node& node, int32_t* total) const {
  const size_t p = static_cast<size_t>(page_size_);
  for (const auto& [key, child] : node.children) {
    PA_CHECK(child->parent == &node, "prefix cache: a child does not name its parent");
    PA_CHECK(!child->pages.empty() && child->tokens.size() == child->pages.size() * p,
             "prefix cache: a node has {} tokens for {} pages of {}", child->tokens.size(),
             child->pages.size(), p);
    PA_CHECK(key == key_at(child->tokens, 0), "prefix cache: a child's key is not its first page");
    const auto table = allocator_.block_table(child->holder);
    PA_CHECK(std::equal(table.begin(), table.end(), child->pages.begin(), child->pages.end()),
             "prefix cache: holder {} does not hold the node's pages", child->holder);
    *total += static_cast<int32_t>(child->pages.size());
    check_node(*child, total);
  }
}

void RadixCache::check_consistency() const {
  int32_t total = 0;
  check_node(root_, &total);
  PA_CHECK(total == num_cached_pages_, "prefix cache: {} pages in the tree, {} counted", total,
           num_cached_pages_);
}

}  // namespace pagedattn::engine
