// KvManager (see engine_kv.h): the allocator calls, with eviction from the prefix cache on
// shortage.
#include <algorithm>
#include <vector>

#include "core/check.h"
#include "pagedattn/engine_kv.h"

namespace pagedattn::engine {

KvManager::KvManager(PageAllocator& allocator, bool prefix_cache) : allocator_(allocator) {
  if (prefix_cache) cache_ = std::make_unique<RadixCache>(allocator_);
}

int64_t KvManager::admit(SequenceId sequence, std::span<const int32_t> tokens, bool use_cache) {
  PA_CHECK(sequence >= 0, "sequence: id {} (expected >= 0)", sequence);
  if (!cache_ || !use_cache || tokens.size() < 2) {
    allocator_.add_request(sequence);
    return 0;
  }
  const RadixCache::Match match = cache_->match(tokens, static_cast<int64_t>(tokens.size()) - 1);
  allocator_.add_shared_request(sequence, match.pages);
  hit_tokens_ += match.num_tokens;
  query_tokens_ += static_cast<int64_t>(tokens.size());
  return match.num_tokens;
}

void KvManager::admit_shared(SequenceId sequence, SequenceId source, int32_t num_pages) {
  PA_CHECK(sequence >= 0, "sequence: id {} (expected >= 0)", sequence);
  const auto table = allocator_.block_table(source);
  PA_CHECK(num_pages >= 0 && static_cast<size_t>(num_pages) <= table.size(),
           "num_pages: {} (source {} holds {})", num_pages, source, table.size());
  allocator_.add_shared_request(sequence, table.first(static_cast<size_t>(num_pages)));
}

bool KvManager::grow(SequenceId sequence, int64_t num_tokens) {
  if (allocator_.grow(sequence, num_tokens) == AllocStatus::kOk) return true;
  if (!cache_) return false;
  const int32_t short_by =
      allocator_.pages_needed(sequence, num_tokens) - allocator_.num_free_pages();
  cache_->evict(short_by);
  return allocator_.grow(sequence, num_tokens) == AllocStatus::kOk;
}

int32_t KvManager::cache(SequenceId sequence, std::span<const int32_t> tokens, int64_t num_computed,
                         int32_t num_offered) {
  const int32_t full = static_cast<int32_t>(num_computed / page_size());
  if (!cache_ || full <= num_offered) return std::max(full, num_offered);
  const auto table = allocator_.block_table(sequence);
  cache_->insert(tokens.first(static_cast<size_t>(full) * static_cast<size_t>(page_size())),
                 table.first(static_cast<size_t>(full)), &cursors_[sequence]);
  return full;
}

void KvManager::release(SequenceId sequence) {
  allocator_.free(sequence);
  cursors_.erase(sequence);
}

int32_t KvManager::pages_for(int64_t num_tokens) const {
  return static_cast<int32_t>((num_tokens + page_size() - 1) / page_size());
}

bool KvManager::fits_alone(int64_t num_tokens) const {
  return (num_tokens + page_size() - 1) / page_size() <= allocator_.num_pages();
}

}  // namespace pagedattn::engine
