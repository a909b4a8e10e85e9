// check_metadata_values (metadata_check.h): the host's full check of a step's metadata, in the
// order the header gives, each message naming the array, the entry and its value.
#include "planner/metadata_check.h"

#include "core/check.h"

namespace pagedattn {

void check_metadata_values(const MetadataArrays& m, const MetadataBounds& b) {
  const int32_t batch = m.batch;
  PA_CHECK(batch >= 0, "meta.batch_size: {} must be >= 0", batch);
  const int32_t* kv_indptr = m.kv_indptr;
  PA_CHECK(kv_indptr[0] >= 0, "meta.kv_indptr[0]: {} must be >= 0", kv_indptr[0]);
  for (int32_t r = 0; r < batch; ++r) {
    const int64_t pages = int64_t{kv_indptr[r + 1]} - kv_indptr[r];
    PA_CHECK(pages >= 0, "meta.kv_indptr: decreases at request {} ({} then {})", r, kv_indptr[r],
             kv_indptr[r + 1]);
    const int32_t last = m.kv_last_page_len[r];
    const int32_t lowest = pages == 0 ? 0 : 1;
    PA_CHECK(last >= lowest && last <= b.page_size,
             "meta.kv_last_page_len[{}]: {} is out of range (expected [{}, {}] for a request with "
             "{} pages)",
             r, last, lowest, b.page_size, pages);
  }
  const int64_t total_pages = kv_indptr[batch];
  PA_CHECK(m.num_indices >= total_pages, "meta.kv_indices: {} entries, expected at least {}",
           m.num_indices, total_pages);
  if (b.num_attention_pages >= 0) {
    for (int64_t i = kv_indptr[0]; i < total_pages; ++i) {
      PA_CHECK(m.kv_indices[i] >= 0 && m.kv_indices[i] < b.num_attention_pages,
               "meta.kv_indices[{}]: page {} is out of range (the cache has {} attention pages of "
               "{} tokens)",
               i, m.kv_indices[i], b.num_attention_pages, b.page_size);
    }
  }
  const int32_t* qo = m.qo_indptr;
  if (qo == nullptr) return;
  if (b.one_row_per_request) {
    for (int32_t r = 0; r <= batch; ++r) {
      PA_CHECK(qo[r] == r, "meta.qo_indptr[{}]: {}, expected {} (decode: one row per request)", r,
               qo[r], r);
    }
    return;
  }
  PA_CHECK(qo[0] == 0, "meta.qo_indptr[0]: {}, expected 0", qo[0]);
  for (int32_t r = 0; r < batch; ++r) {
    PA_CHECK(qo[r + 1] >= qo[r], "meta.qo_indptr: decreases at request {} ({} then {})", r, qo[r],
             qo[r + 1]);
  }
  PA_CHECK(b.rows < 0 || qo[batch] == b.rows,
           "meta.qo_indptr[{}]: {} query rows, but q has {} rows", batch, qo[batch], b.rows);
  for (int32_t r = 0; r < batch; ++r) {
    const int64_t q_len = int64_t{qo[r + 1]} - qo[r];
    PA_CHECK(m.max_q_len <= 0 || q_len <= m.max_q_len,
             "meta.max_q_len: {}, but request {} has {} query rows (qo_indptr[{}..{}] = {}, {}); "
             "the hint must bound every request's q_len",
             m.max_q_len, r, q_len, r, r + 1, qo[r], qo[r + 1]);
    const int64_t pages = int64_t{kv_indptr[r + 1]} - kv_indptr[r];
    const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * b.page_size + m.kv_last_page_len[r];
    PA_CHECK(q_len <= kv_len || (q_len == 1 && kv_len == 0),
             "meta.qo_indptr: request {} has {} query rows (qo_indptr[{}..{}] = {}, {}) but {} KV "
             "tokens (expected q_len <= kv_len: a request's new tokens are the last of its KV)",
             r, q_len, r, r + 1, qo[r], qo[r + 1], kv_len);
  }
}

}  // namespace pagedattn
