// KV page management for the scheduler: the page allocator plus, when enabled, the radix prefix
// cache. Admission gives a sequence its longest cached prefix (whole pages, leaving at least one
// token to compute); growth allocates the pages the next step needs, evicting least-recently-used
// cached pages when the free list runs short; caching offers a sequence's computed full pages to
// the tree; release drops the sequence's references (cached pages stay in the tree).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>

#include "pagedattn/engine_model_runner.h"
#include "pagedattn/engine_prefix_cache.h"
#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {

class KvManager {
 public:
  // Sequence ids must be >= 0 (the cache uses negative allocator ids).
  KvManager(PageAllocator& allocator, bool prefix_cache);

  int32_t page_size() const { return allocator_.page_size(); }
  bool prefix_cache_enabled() const { return cache_ != nullptr; }
  const PageAllocator& allocator() const { return allocator_; }
  RadixCache* prefix_cache() { return cache_.get(); }

  // Creates `sequence` holding the longest cached prefix of `tokens` of at most tokens.size() - 1
  // tokens, in whole pages; returns its length in tokens (0 without the cache, or when
  // `use_cache` is false: the sequence starts empty; its pages may still be cached later).
  int64_t admit(SequenceId sequence, std::span<const int32_t> tokens, bool use_cache = true);
  // Creates `sequence` sharing the first `num_pages` (full, computed) pages of `source`.
  void admit_shared(SequenceId sequence, SequenceId source, int32_t num_pages);
  // Grows `sequence` to `num_tokens` tokens of pages, evicting cached pages if need be. false:
  // not enough pages even so (the sequence is unchanged).
  bool grow(SequenceId sequence, int64_t num_tokens);
  // Offers the full pages among the first `num_computed` tokens to the cache; returns how many
  // full pages that is (the caller passes it back as `num_offered` to skip them next time). The
  // sequence's tokens may only have grown since its previous call (its walk of the tree resumes
  // where that one ended: RadixCache::Cursor); release() forgets that.
  int32_t cache(SequenceId sequence, std::span<const int32_t> tokens, int64_t num_computed,
                int32_t num_offered);
  void release(SequenceId sequence);

  // Whether `num_tokens` tokens could ever be held: by the whole pool, with nothing else in it.
  bool fits_alone(int64_t num_tokens) const;
  int32_t pages_for(int64_t num_tokens) const;
  std::span<const int32_t> block_table(SequenceId sequence) const {
    return allocator_.block_table(sequence);
  }

  int64_t prefix_hit_tokens() const { return hit_tokens_; }      // over all admissions
  int64_t prefix_query_tokens() const { return query_tokens_; }  // prompt tokens looked up

 private:
  PageAllocator& allocator_;
  std::unique_ptr<RadixCache> cache_;
  std::unordered_map<SequenceId, RadixCache::Cursor> cursors_;  // of sequences that cached pages
  int64_t hit_tokens_ = 0;
  int64_t query_tokens_ = 0;
};

}  // namespace pagedattn::engine
