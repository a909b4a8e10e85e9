// The CPU attention kernel: one work item (request, query tile, KV chunk) for one KV head or, in
// NHD decode, for all KV heads (block by block, every head's rows before the next block), then the
// merge of split items.
//
// Per item: the query tile (tokens x group heads) is converted to f32 and pre-multiplied by
// sm_scale (and the fp8 K scale), so that a dot product is the logit. The KV chunk is walked in
// blocks of kBlockTokens tokens: each token's K (and V) row is located through kv_indices
// (attention page -> allocation page + offset) and converted to f32 into a small block, then
// scores = Q K^T for the block, soft-cap, causal / window mask (only on blocks that straddle a
// boundary), the online-softmax update (running max m, sum l, rescale alpha) and acc += P V.
// MLA reads K = [ckv, kpe] into one block and uses its first kv_lora_rank columns as V.
// Decode (at most 8 rows, bf16/f32 KV) skips the f32 block: K and V are converted inside the FMA
// loops (simd::score_rows_fused / accumulate_rows_fused), and the next block is read ahead.
// Finally out = acc / l * v_scale and lse = m + log(l), or 0 and -inf for a row that saw nothing.
//
// Fault injection (CMake -DPAGEDATTN_INJECT_FAULT=<name>, see cpu/cpu_fault.h): each kFault*
// branch below compiles one deliberate bug, so that scripts/fault-check can prove the tests catch
// it. In a normal build every kFault* is false and the branches vanish.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "cpu/cpu_fault.h"
#include "cpu/cpu_plan.h"
#include "cpu/cpu_simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pagedattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Converts `dim` elements at `src` (dtype `dtype`) to f32 times `scale`.
void to_f32(const char* src, DType dtype, float* dst, int dim, float scale) {
  switch (dtype) {
    case DType::kF32:
      simd::convert_f32(reinterpret_cast<const float*>(src), dst, dim, scale);
      break;
    case DType::kF16:
      simd::convert_f16(reinterpret_cast<const uint16_t*>(src), dst, dim, scale);
      break;
    case DType::kBF16:
      simd::convert_bf16(reinterpret_cast<const uint16_t*>(src), dst, dim, scale);
      break;
    case DType::kFP8E4M3:
      simd::convert_fp8(reinterpret_cast<const uint8_t*>(src), dst, dim, scale);
      break;
    default:
      break;  // rejected by validation
  }
}

void from_f32(const float* src, char* dst, DType dtype, int dim, float scale) {
  switch (dtype) {
    case DType::kF32:
      simd::convert_f32(src, reinterpret_cast<float*>(dst), dim, scale);
      break;
    case DType::kF16:
      simd::store_f16(src, reinterpret_cast<uint16_t*>(dst), dim, scale);
      break;
    case DType::kBF16:
      simd::store_bf16(src, reinterpret_cast<uint16_t*>(dst), dim, scale);
      break;
    default:
      break;  // rejected by validation
  }
}

const char* row_ptr(const RowSource& s, int64_t row, int64_t head) {
  return s.data + (row * s.row_stride + head * s.head_stride) * dtype_size(s.dtype);
}

// Per-thread scratch, carved from the workspace (sizes from CpuWorkspace's constructor).
struct Scratch {
  float *q, *acc, *s, *m, *l, *alpha, *k, *v;
};

Scratch carve(float* base, int64_t max_rows, int32_t dim_qk_cap, int32_t dim_vo_cap) {
  auto take = [&base](int64_t n) {
    float* p = base;
    base += (n + 15) / 16 * 16;
    return p;
  };
  Scratch s;
  s.q = take(max_rows * dim_qk_cap);
  s.acc = take(max_rows * dim_vo_cap);
  s.s = take(max_rows * kBlockTokens);
  s.m = take(max_rows);
  s.l = take(max_rows);
  s.alpha = take(max_rows);
  s.k = take(int64_t{kBlockTokens} * dim_qk_cap);
  s.v = take(int64_t{kBlockTokens} * dim_vo_cap);
  return s;
}

// Runs `item` for KV heads [head0, head0 + num_heads). Head hh's rows sit at hh * rows in the
// scratch arrays (q, acc, s, m, l, alpha); the caller guarantees num_heads * rows <= max rows.
void run_item(const Problem& p, const WorkItem& item, int32_t head0, int32_t num_heads,
              const Scratch& sc, float* partial_out, float* partial_lse) {
  const int32_t r = item.request;
  const int64_t kv_len = p.kv_len(r);
  const int64_t q_len = p.q_end(r) - p.q_begin(r);
  const int64_t tokens = item.q_end - item.q_begin;
  const int32_t group = p.group;
  const int32_t rows = static_cast<int32_t>(tokens * group);  // per KV head
  const int32_t all_rows = rows * num_heads;
  const int32_t dqk = p.dim_qk, dvo = p.dim_vo;

  // Query tile, pre-scaled: row = hh * rows + token * group + g, head = (head0 + hh) * group + g.
  const float q_scale = p.sm_scale * p.k_scale * (kFaultSmScale ? 1.02f : 1.0f);
  for (int32_t hh = 0; hh < num_heads; ++hh) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int32_t g = 0; g < group; ++g) {
        const int64_t head = int64_t{head0 + hh} * group + g;
        float* dst = sc.q + (int64_t{hh} * rows + t * group + g) * dqk;
        to_f32(row_ptr(p.q, item.q_begin + t, head), p.q.dtype, dst, p.q.dim, q_scale);
        if (p.latent) {
          to_f32(row_ptr(p.q_rope, item.q_begin + t, head), p.q_rope.dtype, dst + p.q.dim,
                 p.q_rope.dim, q_scale);
        }
      }
    }
  }
  // Visible keys of token t: [lo(t), hi(t)]; both grow with t.
  const int64_t first_position = kv_len - q_len + (item.q_begin - p.q_begin(r));
  auto hi = [&](int64_t t) {
    return p.causal ? first_position + t + (kFaultCausalShift ? 1 : 0) : kv_len - 1;
  };
  auto lo = [&](int64_t t) {
    return p.window_left >= 0 ? first_position + t - p.window_left - (kFaultWindow ? 1 : 0)
                              : int64_t{0};
  };
  // kFaultSplitPage: a split request's chunks after the first lose their first page.
  const int64_t first_page =
      item.page_begin + (kFaultSplitPage && item.partial >= 0 && item.page_begin > 0 ? 1 : 0);
  const int64_t begin = std::max<int64_t>({first_page * p.page_size, lo(0), 0});
  const int64_t end = std::min<int64_t>(
      {int64_t{item.page_end} * p.page_size, kv_len - (kFaultLastKey ? 1 : 0), hi(tokens - 1) + 1});

  std::fill(sc.m, sc.m + all_rows, kNegInf);
  std::fill(sc.l, sc.l + all_rows, 0.0f);
  std::fill(sc.acc, sc.acc + int64_t{all_rows} * dvo, 0.0f);
  const int32_t* pages = p.kv_indices + p.kv_indptr[r];
  const float* v_block = p.latent ? sc.k : sc.v;
  const int32_t v_stride = p.latent ? dqk : dvo;

  // Row addresses of a block's tokens for head0, found by stepping through the request's pages
  // (no division per token): K rows (MLA: ckv) and V rows (MLA: kpe). Head head0 + hh is
  // hh * head_stride elements further.
  const int64_t element = dtype_size(p.kv_dtype);
  const PagedSource& second = p.latent ? p.k_rope : p.v;
  const int64_t k_head = p.latent ? 0 : int64_t{head0} * p.k.head_stride;
  const int64_t v_head = p.latent ? 0 : int64_t{head0} * p.v.head_stride;
  struct BlockRows {
    const char* k[kBlockTokens];
    const char* v[kBlockTokens];
    int32_t n = 0;
  };
  auto locate = [&](int64_t from, BlockRows& rows_out) {
    rows_out.n =
        static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(kBlockTokens, end - from)));
    int64_t page_index = from / p.page_size, in_page = from % p.page_size;
    int64_t k_base = 0, v_base = 0;
    auto page_bases = [&] {
      const int64_t page = pages[page_index];
      const int64_t alloc_page = page / p.pages_per_alloc;
      const int64_t first_token = kFaultAllocPage ? 0 : (page % p.pages_per_alloc) * p.page_size;
      k_base = alloc_page * p.k.page_stride + first_token * p.k.token_stride + k_head;
      v_base = alloc_page * second.page_stride + first_token * second.token_stride + v_head;
    };
    if (rows_out.n > 0) page_bases();
    for (int32_t j = 0; j < rows_out.n; ++j, ++in_page) {
      if (in_page == p.page_size) {
        ++page_index;
        in_page = 0;
        page_bases();
      }
      rows_out.k[j] = p.k.data + (k_base + in_page * p.k.token_stride) * element;
      rows_out.v[j] = second.data + (v_base + in_page * second.token_stride) * element;
    }
  };
  // Look-ahead one block: on the 2-core AMD development VM, plain prefetch instructions for the
  // next block changed nothing (they are dropped when they miss the TLB, and every page of a
  // request is a different 4 KiB page), so the first line of each next K/V row is touched with a
  // real load (which does the page walk) and its other lines are prefetched: decode went from
  // 7-10 to 13 GB/s. For several heads the run spans from head0's row to the last head's row end
  // (contiguous in NHD).
  const int64_t k_bytes = ((num_heads - 1) * p.k.head_stride + p.k.dim) * element;
  const int64_t v_bytes = ((num_heads - 1) * second.head_stride + second.dim) * element;
  auto look_ahead = [&](const BlockRows& rows_in) {
    int sink = 0;
    for (int32_t j = 0; j < rows_in.n; ++j) {
      sink += rows_in.k[j][0] + rows_in.v[j][0];
      for (int64_t b = 64; b < k_bytes; b += 64) __builtin_prefetch(rows_in.k[j] + b, 0, 3);
      for (int64_t b = 64; b < v_bytes; b += 64) __builtin_prefetch(rows_in.v[j] + b, 0, 3);
    }
    asm volatile("" : : "r"(sink));  // keeps the touching loads
  };
  // Few rows (decode: one GQA group) in bf16 or f32: K and V are converted inside the FMA loops
  // and streamed once for all rows (see simd::score_rows_fused).
  const bool fused = !p.latent && rows <= simd::kMaxFusedRows &&
                     (p.kv_dtype == DType::kBF16 || p.kv_dtype == DType::kF32);
  const simd::KvElem fused_elem =
      p.kv_dtype == DType::kBF16 ? simd::KvElem::kBF16 : simd::KvElem::kF32;
  // bf16 K / V with head dims that are multiples of 32: the pair-layout loops (a shift and a mask
  // per 32 elements instead of lane shuffles); q's rows and acc's rows are kept in the pair layout
  // for the item (sc.k, unused on the fused paths, is the scratch row for the permutations).
  const bool pairs = fused && p.kv_dtype == DType::kBF16 && dqk % simd::kPairBlock == 0 &&
                     dvo % simd::kPairBlock == 0;
  if (pairs) {
    for (int32_t row = 0; row < all_rows; ++row) {
      float* q_row = sc.q + int64_t{row} * dqk;
      simd::pair_layout(q_row, dqk, sc.k);
      std::copy(sc.k, sc.k + dqk, q_row);
    }
  }
  // Only for few rows (decode), where the block's bytes, not arithmetic, set the pace: with many
  // rows (prefill, MLA's 16-128 heads) it cost 5-13% by competing for L1 with the query tile.
  const bool read_ahead = rows <= simd::kMaxFusedRows;
  const int64_t k_head_bytes = p.k.head_stride * element,
                v_head_bytes = second.head_stride * element;
  BlockRows block, ahead, shifted;
  locate(begin, ahead);
  if (read_ahead) look_ahead(ahead);
  for (int64_t t0 = begin; t0 < end; t0 += kBlockTokens) {
    block = ahead;
    locate(t0 + kBlockTokens, ahead);  // n = 0 past the end
    if (read_ahead) look_ahead(ahead);
    const int32_t n = block.n;
    for (int32_t hh = 0; hh < num_heads; ++hh) {
      const BlockRows* rows_of = &block;
      if (hh > 0) {
        for (int32_t j = 0; j < n; ++j) {
          shifted.k[j] = block.k[j] + hh * k_head_bytes;
          shifted.v[j] = block.v[j] + hh * v_head_bytes;
        }
        rows_of = &shifted;
      }
      const int64_t row0 = int64_t{hh} * rows;
      const float* q = sc.q + row0 * dqk;
      float* scores = sc.s + row0 * kBlockTokens;
      float* acc = sc.acc + row0 * dvo;
      if (pairs) {
        simd::gemv_bf16_pairs(q, rows, rows_of->k, n, dqk, scores, kBlockTokens);
      } else if (fused) {
        simd::score_rows_fused(q, rows, rows_of->k, fused_elem, n, dqk, scores, kBlockTokens);
      } else {
        for (int32_t j = 0; j < n; ++j) {
          float* k_row = sc.k + int64_t{j} * dqk;
          to_f32(rows_of->k[j], p.kv_dtype, k_row, p.k.dim, 1.0f);
          to_f32(rows_of->v[j], p.kv_dtype, p.latent ? k_row + p.k.dim : sc.v + int64_t{j} * dvo,
                 second.dim, 1.0f);
        }
        simd::score_block(q, rows, sc.k, n, dqk, scores, kBlockTokens);
      }
      auto apply_soft_cap = [&] {
        if (p.soft_cap <= 0) return;
        const float cap = p.soft_cap, inv_cap = 1.0f / p.soft_cap;
        for (int32_t row = 0; row < rows; ++row) {
          float* s = scores + int64_t{row} * kBlockTokens;
          for (int32_t j = 0; j < n; ++j) s[j] = cap * std::tanh(s[j] * inv_cap);
        }
      };
      if (!kFaultSoftCapAfterMask) apply_soft_cap();
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t key_lo = lo(t), key_hi = hi(t);
        if (t0 >= key_lo && t0 + n - 1 <= key_hi) continue;  // block fully visible
        for (int32_t g = 0; g < group; ++g) {
          float* s = scores + (t * group + g) * kBlockTokens;
          for (int32_t j = 0; j < n; ++j) {
            if (t0 + j < key_lo || t0 + j > key_hi) s[j] = kNegInf;
          }
        }
      }
      if (kFaultSoftCapAfterMask) apply_soft_cap();  // masked -inf become -cap: still weighted
      simd::softmax_block(scores, rows, n, kBlockTokens, sc.m + row0, sc.l + row0, sc.alpha + row0);
      if (pairs) {
        simd::accumulate_bf16_pairs(acc, rows, sc.alpha + row0, scores, kBlockTokens, rows_of->v, n,
                                    dvo);
      } else if (fused) {
        simd::accumulate_rows_fused(acc, rows, sc.alpha + row0, scores, kBlockTokens, rows_of->v,
                                    fused_elem, n, dvo);
      } else {
        simd::accumulate_block(acc, rows, sc.alpha + row0, scores, kBlockTokens, v_block, v_stride,
                               n, dvo);
      }
    }
  }

  for (int32_t hh = 0; hh < num_heads; ++hh) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int32_t g = 0; g < group; ++g) {
        const int32_t row = static_cast<int32_t>(hh * rows + t * group + g);
        const int64_t head = int64_t{head0 + hh} * group + g;
        const bool seen = sc.l[row] > 0;
        float* acc = sc.acc + int64_t{row} * dvo;
        if (pairs) {  // natural order, in the scratch row (acc's own row is not read again)
          simd::unpair_layout(acc, dvo, sc.k);
          acc = sc.k;
        }
        const float scale = seen ? (kFaultVScale ? 1.0f : p.v_scale) / sc.l[row] : 0.0f;
        const float lse = seen ? sc.m[row] + std::log(sc.l[row]) : kNegInf;
        const int64_t abs_row = item.q_begin + t;
        if (item.partial >= 0) {
          const int64_t prow = item.partial + t * p.heads + head;
          simd::convert_f32(acc, partial_out + prow * dvo, dvo, scale);
          partial_lse[prow] = lse;
          continue;
        }
        if (!seen) std::fill(acc, acc + dvo, 0.0f);  // acc may hold 0 * NaN-free zeros anyway
        from_f32(acc,
                 p.out + (abs_row * p.out_row_stride + head * p.out_head_stride) *
                             dtype_size(p.out_dtype),
                 p.out_dtype, dvo, scale);
        if (p.lse && !kFaultLseNotWritten) {
          p.lse[abs_row * p.lse_row_stride + head * p.lse_head_stride] = lse;
        }
      }
    }
  }
}

// Combines a split (request, tile)'s partials for one query head: weights exp(lse_i - max) over
// its items. (One head at a time, so that a single split request's merge, e.g. decode at B = 1
// split 64 ways, spreads over the threads instead of running on one.)
void merge_group_head(const Problem& p, const CpuWorkspace& ws, const MergeGroup& group,
                      int32_t head, float* tmp) {
  const WorkItem& first = ws.items[group.first_item];
  const int32_t dvo = p.dim_vo;
  for (int64_t t = 0; t < first.q_end - first.q_begin; ++t) {
    float max_lse = kNegInf;
    for (int32_t i = 0; i < group.num_items; ++i) {
      const WorkItem& item = ws.items[group.first_item + i];
      max_lse = std::max(max_lse, ws.partial_lse[item.partial + t * p.heads + head]);
    }
    std::fill(tmp, tmp + dvo, 0.0f);
    float total = 0;
    // kFaultMergeLast: the last partial of a request split three or more ways is left out.
    const int32_t merged = group.num_items - (kFaultMergeLast && group.num_items >= 3 ? 1 : 0);
    if (max_lse != kNegInf) {
      for (int32_t i = 0; i < merged; ++i) {
        const WorkItem& item = ws.items[group.first_item + i];
        const int64_t prow = item.partial + t * p.heads + head;
        const float lse = ws.partial_lse[prow];
        if (lse == kNegInf) continue;
        const float w = std::exp(lse - max_lse);
        total += w;
        const float* src = ws.partial_out.data() + prow * dvo;
        for (int32_t d = 0; d < dvo; ++d) tmp[d] += w * src[d];
      }
    }
    const int64_t row = first.q_begin + t;
    from_f32(tmp,
             p.out + (row * p.out_row_stride + head * p.out_head_stride) * dtype_size(p.out_dtype),
             p.out_dtype, dvo, total > 0 ? 1.0f / total : 0.0f);
    if (p.lse && !kFaultLseNotWritten) {
      p.lse[row * p.lse_row_stride + head * p.lse_head_stride] =
          total > 0 ? max_lse + std::log(total) : kNegInf;
    }
  }
}

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace

void run_problem(CpuWorkspace& ws, const Problem& p) {
  const CpuPlan& plan = ws.plan;
  PA_CHECK(plan.ready, "workspace: no plan (call plan() with this step's metadata first)");
  const bool same_kind =
      is_mla(plan.op) == is_mla(p.op) &&
      (is_mla(p.op) || (plan.op == OpKind::kDecode) == (p.op == OpKind::kDecode));
  const int64_t total_pages = p.kv_indptr[p.batch] - p.kv_indptr[0];
  const int64_t total_rows = p.qo_indptr ? p.qo_indptr[p.batch] - p.qo_indptr[0] : p.batch;
  PA_CHECK(same_kind && plan.batch == p.batch && plan.heads == p.heads &&
               plan.kv_heads == p.kv_heads && plan.dim_qk == p.dim_qk && plan.dim_vo == p.dim_vo &&
               plan.page_size == p.page_size && plan.total_pages == total_pages &&
               plan.total_rows == total_rows &&
               plan.fingerprint == metadata_fingerprint(p.batch, p.kv_indptr, p.qo_indptr),
           "workspace: planned for {} (batch {}, heads {}/{}, dims {}/{}, P {}, {} pages, {} rows) "
           "but called for {} (batch {}, heads {}/{}, dims {}/{}, P {}, {} pages, {} rows) or "
           "for other per-request lengths; call plan() with this step's op and metadata",
           op_name(plan.op), plan.batch, plan.heads, plan.kv_heads, plan.dim_qk, plan.dim_vo,
           plan.page_size, plan.total_pages, plan.total_rows, op_name(p.op), p.batch, p.heads,
           p.kv_heads, p.dim_qk, p.dim_vo, p.page_size, total_pages, total_rows);

  const int32_t heads_per_unit = plan.heads_per_unit;
  const int64_t head_units = p.kv_heads / heads_per_unit;
  const int64_t units = int64_t{plan.num_items} * head_units;
  const int32_t dim_qk_cap = std::min((ws.limits().max_head_dim + 15) / 16 * 16, kMaxHeadDimQk);
  const int32_t dim_vo_cap = std::min(dim_qk_cap, kMaxHeadDimVo);
  const int64_t max_rows = ws.max_rows_per_item();
  float* partial_out = ws.partial_out.data();
  float* partial_lse = ws.partial_lse.data();
  // Small steps do not wake more threads than they have units or work for (cpu_plan.h).
  const int32_t item_threads = plan.threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(item_threads) if (item_threads > 1)
  for (int64_t u = 0; u < units; ++u) {
    const Scratch sc = carve(ws.scratch(thread_id()), max_rows, dim_qk_cap, dim_vo_cap);
    run_item(p, ws.items[u / head_units], static_cast<int32_t>(u % head_units) * heads_per_unit,
             heads_per_unit, sc, partial_out, partial_lse);
  }
  if (plan.num_merges == 0) return;
  // One unit per (split group, query head).
  const int64_t merge_units = int64_t{plan.num_merges} * p.heads;
  const int32_t merge_threads =
      static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(plan.threads, merge_units)));
#pragma omp parallel for schedule(dynamic, 1) num_threads(merge_threads) if (merge_threads > 1)
  for (int64_t u = 0; u < merge_units; ++u) {
    const Scratch sc = carve(ws.scratch(thread_id()), max_rows, dim_qk_cap, dim_vo_cap);
    merge_group_head(p, ws, ws.merges[u / p.heads], static_cast<int32_t>(u % p.heads), sc.acc);
  }
}

}  // namespace pagedattn::cpu
