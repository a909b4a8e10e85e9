// Random engine batches for the planner tests, in both table forms, and the naive model the
// planner is checked against.
//
// A batch draws distinct allocation pages from a pool in shuffled order, so a bug that confuses
// positions and ids cannot pass by accident. Unused table entries hold a poison value (-7) that
// the planner must never read (it would be out of range, and the expected output never holds it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "pagedattn/planner.h"

namespace pagedattn::testing {

inline constexpr int32_t kUnusedEntry = -7;

struct EngineBatch {
  int32_t alloc_page_size = 16;  // A
  int64_t num_alloc_pages = 0;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> q_lens;       // empty: decode
  std::vector<int32_t> block_table;  // [num_reqs, block_stride]
  int64_t block_stride = 0;
  std::vector<int32_t> slots;  // [num_reqs, slot_stride]
  int64_t slot_stride = 0;

  int32_t num_reqs() const { return static_cast<int32_t>(seq_lens.size()); }

  // The true slot of token `t` of request `r`, read token by token from the block table.
  int64_t slot_of(int32_t r, int64_t t) const {
    return int64_t{block_table[r * block_stride + t / alloc_page_size]} * alloc_page_size +
           t % alloc_page_size;
  }

  PlanInput input(bool slot_form, int32_t page_size, int32_t padded_batch = 0) const {
    PlanInput in;
    if (slot_form) {
      in.table = SlotTableInput{slots, slot_stride};
    } else {
      in.table = BlockTableInput{block_table, block_stride};
    }
    in.num_reqs = num_reqs();
    in.seq_lens = seq_lens;
    in.q_lens = q_lens;
    in.alloc_page_size = alloc_page_size;
    in.page_size = page_size;
    in.num_alloc_pages = num_alloc_pages;
    in.padded_batch = padded_batch;
    return in;
  }
};

// Builds the batch for the given lengths: pages drawn without replacement from a pool with
// `spare_pages` more than needed, tables with `extra` unused entries per row.
inline EngineBatch make_batch(std::mt19937_64& rng, int32_t alloc_page_size,
                              std::vector<int32_t> seq_lens, bool prefill, int64_t spare_pages = 5,
                              int64_t extra = 2) {
  EngineBatch batch;
  batch.alloc_page_size = alloc_page_size;
  batch.seq_lens = std::move(seq_lens);
  const int32_t n = batch.num_reqs();
  int64_t needed = 0, max_blocks = 0, max_tokens = 0;
  for (int32_t len : batch.seq_lens) {
    const int64_t blocks = (len + alloc_page_size - 1) / alloc_page_size;
    needed += blocks;
    max_blocks = std::max(max_blocks, blocks);
    max_tokens = std::max<int64_t>(max_tokens, len);
  }
  batch.num_alloc_pages = needed + spare_pages;
  std::vector<int32_t> pool(static_cast<size_t>(batch.num_alloc_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  batch.block_stride = max_blocks + extra;
  batch.slot_stride = max_tokens + extra;
  batch.block_table.assign(static_cast<size_t>(n * batch.block_stride), kUnusedEntry);
  batch.slots.assign(static_cast<size_t>(n * batch.slot_stride), kUnusedEntry);
  size_t next = 0;
  for (int32_t r = 0; r < n; ++r) {
    const int32_t len = batch.seq_lens[r];
    for (int64_t b = 0; b * alloc_page_size < len; ++b) {
      batch.block_table[r * batch.block_stride + b] = pool[next++];
    }
    for (int64_t t = 0; t < len; ++t) {
      batch.slots[r * batch.slot_stride + t] = static_cast<int32_t>(batch.slot_of(r, t));
    }
    if (prefill) {
      batch.q_lens.push_back(std::uniform_int_distribution<int32_t>(0, len)(rng));
    }
  }
  return batch;
}

// Random lengths that hit the corners for page sizes up to `alloc_page_size`: empty requests,
// one token, exactly full allocation pages, and partial last pages.
inline std::vector<int32_t> corner_lengths(std::mt19937_64& rng, int32_t num_reqs,
                                           int32_t alloc_page_size) {
  std::vector<int32_t> lens;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const int32_t pages = std::uniform_int_distribution<int32_t>(0, 3)(rng);
    switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
      case 0:
        lens.push_back(0);
        break;
      case 1:
        lens.push_back(1);
        break;
      case 2:
        lens.push_back(std::max(1, pages) * alloc_page_size);
        break;
      default:
        lens.push_back(pages * alloc_page_size +
                       std::uniform_int_distribution<int32_t>(1, alloc_page_size)(rng));
    }
  }
  return lens;
}

}  // namespace pagedattn::testing
