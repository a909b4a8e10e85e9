// Naive float64 references for the attention operations over the paged KV cache: the oracle of
// the CPU and CUDA tests and of the demo's checks. Deliberately simple and independent of the
// backends: each request's keys and values are read token by token through the metadata
// (kv_indptr / kv_indices / kv_last_page_len, attention page p = tokens [(p % r) * P,
// (p % r + 1) * P) of allocation page p / r, r = alloc_page_size / P), every score is computed
// in double precision, then a plain softmax and a weighted sum.
//
// Semantics (the contract every backend must meet):
//   query row i of a request with q_len Lq and kv_len L sits at position L - Lq + i;
//   causal: it sees keys at positions <= its own; window_left >= 0: keys >= position - window;
//   decode is the case Lq = 1 (causal or not makes no difference);
//   logits = sm_scale * q.k (fp8 caches dequantised with their scale), then the soft-cap
//   cap * tanh(logits / cap) when cap > 0, then masking;
//   a row that sees no key (kv_len 0, e.g. batch padding) gives out = 0 and lse = -inf;
//   lse = natural log of the sum of exp(logits) over the visible keys.
//   MLA is attention with one KV head, K = [ckv, kpe] and V = ckv.
//
// All views (q, caches, metadata) must be readable on the host. Outputs are row-major doubles:
//   out [T, H, head_dim_vo], lse [T, H] (T = query rows; decode: T = batch_size).
// The args' out/lse views are not touched. Inputs are validated only as far as needed to read
// safely; invalid inputs throw pagedattn::Error.
#pragma once

#include <vector>

#include "pagedattn/backend.h"

namespace pagedattn::testing {

// Element at an offset (in elements) of a host view as a double: f32 / f16 / bf16, fp8 e4m3
// times `scale`, i32 / i64.
double read_element(const TensorView& view, int64_t offset, double scale = 1.0);

std::vector<double> reference_decode(const DecodeArgs& args, std::vector<double>* lse = nullptr);
std::vector<double> reference_prefill(const PrefillArgs& args, std::vector<double>* lse = nullptr);
std::vector<double> reference_mla(const MlaArgs& args, std::vector<double>* lse = nullptr);

}  // namespace pagedattn::testing
