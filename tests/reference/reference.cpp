// Naive float64 references (see reference.h): one generic routine over "a query row, a KV head,
// a token" accessors, instantiated for MHA/GQA caches and for the MLA latent cache.
#include "reference/reference.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace pagedattn::testing {
namespace {

[[noreturn]] void fail(const std::string& message) { throw_error("reference: " + message); }

// Element at an offset (in elements) of a host view, dequantised with `scale` when fp8.
double read(const TensorView& view, int64_t offset, double scale = 1.0) {
  const char* base = static_cast<const char*>(view.data);
  switch (view.dtype) {
    case DType::kF32:
      return reinterpret_cast<const float*>(base)[offset];
    case DType::kF16:
      return half_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kBF16:
      return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kFP8E4M3:
      return double{fp8e4m3_to_float(reinterpret_cast<const uint8_t*>(base)[offset])} * scale;
    case DType::kI32:
      return reinterpret_cast<const int32_t*>(base)[offset];
    case DType::kI64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(base)[offset]);
  }
  return 0;
}

int64_t read_index(const TensorView& view, int64_t i, const char* name) {
  if (!view.defined() || view.ndim != 1 || i >= view.shape[0]) {
    fail(fmt::format("{}: needs at least {} entries", name, i + 1));
  }
  return static_cast<int64_t>(read(view, i * view.strides[0]));
}

// Where token `t` of request `r` lives: allocation page and offset within it.
struct TokenSlot {
  int64_t alloc_page;
  int64_t offset;
};

struct Problem {
  int32_t batch = 0;
  int64_t rows = 0;  // T
  int32_t heads = 0, kv_heads = 0, dim_qk = 0, dim_vo = 0;
  int32_t page_size = 0, alloc_page_size = 0;
  int64_t num_alloc_pages = 0;
  double sm_scale = 0, soft_cap = 0;
  int32_t window_left = -1;
  bool causal = true;
  bool decode = false;  // one query row per request, qo_indptr not needed
  const StepMetadata* meta = nullptr;
  std::function<double(int64_t row, int32_t head, int32_t d)> query;
  std::function<double(TokenSlot, int32_t kv_head, int32_t d)> key;
  std::function<double(TokenSlot, int32_t kv_head, int32_t d)> value;
};

std::vector<double> solve(const Problem& p, std::vector<double>* lse_out) {
  if (p.sm_scale <= 0 || !std::isfinite(p.sm_scale)) {
    fail(fmt::format("sm_scale {} must be > 0", p.sm_scale));
  }
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0) {
    fail(fmt::format("num_qo_heads {} is not a multiple of num_kv_heads {}", p.heads, p.kv_heads));
  }
  if (p.page_size <= 0 || p.alloc_page_size % p.page_size != 0) {
    fail(fmt::format("page_size {} does not divide alloc_page_size {}", p.page_size,
                     p.alloc_page_size));
  }
  const int32_t group = p.heads / p.kv_heads;
  const int64_t ratio = p.alloc_page_size / p.page_size;
  const StepMetadata& meta = *p.meta;
  std::vector<double> out(static_cast<size_t>(p.rows * p.heads * p.dim_vo), 0.0);
  if (lse_out) {
    lse_out->assign(static_cast<size_t>(p.rows * p.heads),
                    -std::numeric_limits<double>::infinity());
  }
  for (int32_t r = 0; r < p.batch; ++r) {
    const int64_t q_begin = p.decode ? r : read_index(meta.qo_indptr, r, "qo_indptr");
    const int64_t q_end = p.decode ? r + 1 : read_index(meta.qo_indptr, r + 1, "qo_indptr");
    if (q_end < q_begin || q_end > p.rows) fail(fmt::format("qo_indptr[{}] out of range", r + 1));
    const int64_t page_begin = read_index(meta.kv_indptr, r, "kv_indptr");
    const int64_t num_pages = read_index(meta.kv_indptr, r + 1, "kv_indptr") - page_begin;
    const int64_t last = read_index(meta.kv_last_page_len, r, "kv_last_page_len");
    if (num_pages < 0) fail(fmt::format("kv_indptr decreases at request {}", r));
    if (num_pages > 0 && (last < 1 || last > p.page_size)) {
      fail(fmt::format("kv_last_page_len[{}] = {} not in [1, {}]", r, last, p.page_size));
    }
    const int64_t kv_len = num_pages == 0 ? 0 : (num_pages - 1) * p.page_size + last;
    std::vector<TokenSlot> slots(static_cast<size_t>(kv_len));
    for (int64_t t = 0; t < kv_len; ++t) {
      const int64_t page = read_index(meta.kv_indices, page_begin + t / p.page_size, "kv_indices");
      if (page < 0 || page >= p.num_alloc_pages * ratio) {
        fail(fmt::format("kv_indices: page {} out of range", page));
      }
      slots[t] = {page / ratio, (page % ratio) * p.page_size + t % p.page_size};
    }
    const int64_t q_len = q_end - q_begin;
    std::vector<double> logits(static_cast<size_t>(kv_len));
    std::vector<double> query_row(static_cast<size_t>(p.dim_qk));
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t row = q_begin + i;
      const int64_t position = kv_len - q_len + i;
      for (int32_t h = 0; h < p.heads; ++h) {
        const int32_t kv_head = h / group;
        for (int32_t d = 0; d < p.dim_qk; ++d) query_row[d] = p.query(row, h, d);
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int64_t t = 0; t < kv_len; ++t) {
          const bool visible =
              (!p.causal || t <= position) && (p.window_left < 0 || t >= position - p.window_left);
          if (!visible) {
            logits[t] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0;
          for (int32_t d = 0; d < p.dim_qk; ++d) {
            dot += query_row[d] * p.key(slots[t], kv_head, d);
          }
          double logit = dot * p.sm_scale;
          if (p.soft_cap > 0) logit = p.soft_cap * std::tanh(logit / p.soft_cap);
          logits[t] = logit;
          max_logit = std::max(max_logit, logit);
        }
        if (max_logit == -std::numeric_limits<double>::infinity()) continue;  // out 0, lse -inf
        double sum = 0;
        for (int64_t t = 0; t < kv_len; ++t) sum += std::exp(logits[t] - max_logit);
        double* o = &out[static_cast<size_t>((row * p.heads + h) * p.dim_vo)];
        for (int64_t t = 0; t < kv_len; ++t) {
          const double weight = std::exp(logits[t] - max_logit) / sum;
          if (weight == 0) continue;
          for (int32_t d = 0; d < p.dim_vo; ++d) o[d] += weight * p.value(slots[t], kv_head, d);
        }
        if (lse_out) (*lse_out)[static_cast<size_t>(row * p.heads + h)] = max_logit + std::log(sum);
      }
    }
  }
  return out;
}

void require_3d(const TensorView& view, const char* name) {
  if (view.ndim != 3 || view.data == nullptr) fail(fmt::format("{}: expected a 3-D view", name));
}

// MHA/GQA/MQA over a PagedKv; shared by decode and prefill.
Problem kv_problem(const TensorView& q, const PagedKv& kv, const StepMetadata& meta,
                   const AttentionOptions& options, bool decode) {
  require_3d(q, "q");
  if (kv.k.ndim != 4 || kv.v.ndim != 4) fail("k, v: expected 4-D views");
  Problem p;
  p.batch = meta.batch_size;
  p.rows = q.shape[0];
  p.heads = static_cast<int32_t>(q.shape[1]);
  p.kv_heads = kv.num_kv_heads();
  p.dim_qk = static_cast<int32_t>(q.shape[2]);
  p.dim_vo = static_cast<int32_t>(kv.v.shape[3]);
  if (kv.head_dim() != p.dim_qk) fail("k: head_dim differs from q's");
  p.page_size = kv.page_size;
  p.alloc_page_size = kv.alloc_page_size();
  p.num_alloc_pages = kv.num_alloc_pages();
  p.sm_scale = options.sm_scale;
  p.soft_cap = options.logits_soft_cap;
  p.window_left = options.window_left;
  p.causal = options.causal;
  p.decode = decode;
  p.meta = &meta;
  if (decode && p.rows != p.batch) fail("decode: q rows must equal batch_size");
  p.query = [q](int64_t row, int32_t h, int32_t d) {
    return read(q, row * q.strides[0] + h * q.strides[1] + d * q.strides[2]);
  };
  const bool nhd = kv.layout == KvLayout::kNHD;
  auto accessor = [nhd](const TensorView& t, double scale) {
    return [t, nhd, scale](TokenSlot s, int32_t kv_head, int32_t d) {
      const int64_t token_stride = nhd ? t.strides[1] : t.strides[2];
      const int64_t head_stride = nhd ? t.strides[2] : t.strides[1];
      return read(t,
                  s.alloc_page * t.strides[0] + s.offset * token_stride + kv_head * head_stride +
                      d * t.strides[3],
                  scale);
    };
  };
  p.key = accessor(kv.k, kv.k_scale);
  p.value = accessor(kv.v, kv.v_scale);
  return p;
}

}  // namespace

double read_element(const TensorView& view, int64_t offset, double scale) {
  return read(view, offset, scale);
}

std::vector<double> reference_decode(const DecodeArgs& args, std::vector<double>* lse) {
  AttentionOptions options = args.options;
  options.causal = true;  // one query row at the end of the KV: nothing to mask
  return solve(kv_problem(args.q, args.kv, args.meta, options, /*decode=*/true), lse);
}

std::vector<double> reference_prefill(const PrefillArgs& args, std::vector<double>* lse) {
  return solve(kv_problem(args.q, args.kv, args.meta, args.options, /*decode=*/false), lse);
}

std::vector<double> reference_mla(const MlaArgs& args, std::vector<double>* lse) {
  require_3d(args.q_nope, "q_nope");
  require_3d(args.q_pe, "q_pe");
  require_3d(args.kv.ckv, "ckv");
  require_3d(args.kv.kpe, "kpe");
  Problem p;
  p.batch = args.meta.batch_size;
  p.rows = args.q_nope.shape[0];
  p.heads = static_cast<int32_t>(args.q_nope.shape[1]);
  p.kv_heads = 1;
  const int32_t rank = args.kv.kv_lora_rank();
  const int32_t rope = args.kv.rope_dim();
  if (args.q_nope.shape[2] != rank || args.q_pe.shape[2] != rope) {
    fail("q_nope/q_pe: last dimensions differ from ckv/kpe");
  }
  p.dim_qk = rank + rope;
  p.dim_vo = rank;
  p.page_size = args.kv.page_size;
  p.alloc_page_size = args.kv.alloc_page_size();
  p.num_alloc_pages = args.kv.num_alloc_pages();
  p.sm_scale = args.sm_scale;
  p.causal = args.causal;
  p.meta = &args.meta;
  const TensorView qn = args.q_nope, qp = args.q_pe;
  p.query = [qn, qp, rank](int64_t row, int32_t h, int32_t d) {
    if (d < rank) return read(qn, row * qn.strides[0] + h * qn.strides[1] + d * qn.strides[2]);
    return read(qp, row * qp.strides[0] + h * qp.strides[1] + (d - rank) * qp.strides[2]);
  };
  const TensorView ckv = args.kv.ckv, kpe = args.kv.kpe;
  const double scale = args.kv.scale;
  p.value = [ckv, scale](TokenSlot s, int32_t, int32_t d) {
    return read(ckv, s.alloc_page * ckv.strides[0] + s.offset * ckv.strides[1] + d * ckv.strides[2],
                scale);
  };
  p.key = [ckv, kpe, rank, scale](TokenSlot s, int32_t, int32_t d) {
    if (d < rank) {
      return read(ckv,
                  s.alloc_page * ckv.strides[0] + s.offset * ckv.strides[1] + d * ckv.strides[2],
                  scale);
    }
    return read(
        kpe,
        s.alloc_page * kpe.strides[0] + s.offset * kpe.strides[1] + (d - rank) * kpe.strides[2],
        scale);
  };
  return solve(p, lse);
}

}  // namespace pagedattn::testing
