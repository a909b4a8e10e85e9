// A validated attention call in the one form the CPU kernel runs: MHA/GQA/MQA decode and prefill
// and MLA all become "query rows x heads over a paged KV with Hkv heads", with raw pointers and
// element strides resolved. MLA is the case Hkv = 1, K = [ckv, kpe] (two sources per token) and
// V = ckv, which the kernel reads as the first kv_lora_rank columns of the converted K block.
//
// make_problem() checks every argument (shapes against each other and the metadata, dtypes,
// devices, head counts, page ids, kv_last_page_len, qo_indptr) before anything is written; its
// errors name the argument, the value and what was expected.
#pragma once

#include <cstdint>

#include "pagedattn/backend.h"

namespace pagedattn::cpu {

// A strided 3-D source [rows, heads, dim] (queries) or a 2-D output.
struct RowSource {
  const char* data = nullptr;
  DType dtype = DType::kF32;
  int64_t row_stride = 0;   // elements
  int64_t head_stride = 0;  // elements
  int32_t dim = 0;
};

// One per-token source of the paged cache (k or v; MLA: ckv or kpe).
struct PagedSource {
  const char* data = nullptr;
  int64_t page_stride = 0;   // per allocation page, elements
  int64_t token_stride = 0;  // per token within a page
  int64_t head_stride = 0;   // per KV head (0 for MLA)
  int32_t dim = 0;
};

struct Problem {
  OpKind op = OpKind::kDecode;
  int32_t batch = 0;
  int64_t rows = 0;  // T
  int32_t heads = 0, kv_heads = 0, group = 0;
  int32_t dim_qk = 0, dim_vo = 0;

  // Queries: q (MLA: q_nope as `q`, q_pe as `q_rope`, concatenated along dim).
  RowSource q, q_rope;
  // Cache: MHA k/v; MLA k = ckv, k_rope = kpe, v unused (V = the first dim_vo columns of K).
  DType kv_dtype = DType::kBF16;
  PagedSource k, k_rope, v;
  bool latent = false;
  int32_t page_size = 0;
  int32_t pages_per_alloc = 1;  // alloc_page_size / P
  float k_scale = 1.0f, v_scale = 1.0f;

  // Outputs.
  char* out = nullptr;
  DType out_dtype = DType::kF32;
  int64_t out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional
  int64_t lse_row_stride = 0, lse_head_stride = 0;

  // Options.
  float sm_scale = 0, soft_cap = 0;
  int32_t window_left = -1;
  bool causal = true;

  // Metadata (host, int32, contiguous). qo_indptr null: one row per request (decode).
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_last_page_len = nullptr;

  int64_t q_begin(int32_t r) const { return qo_indptr ? qo_indptr[r] : r; }
  int64_t q_end(int32_t r) const { return qo_indptr ? qo_indptr[r + 1] : r + 1; }
  int64_t num_pages(int32_t r) const { return kv_indptr[r + 1] - kv_indptr[r]; }
  int64_t kv_len(int32_t r) const {
    const int64_t pages = num_pages(r);
    return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[r];
  }
};

Problem make_problem(const DecodeArgs& args);
Problem make_problem(const PrefillArgs& args);
Problem make_problem(const MlaArgs& args);

// The limits of this backend, shared by supports() and make_problem().
inline constexpr int32_t kMaxHeadDimQk = 576;
inline constexpr int32_t kMaxHeadDimVo = 512;
inline constexpr int32_t kHeadDimMultiple = 16;

}  // namespace pagedattn::cpu
