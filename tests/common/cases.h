// The shared case generator: random paged KV caches with their planner-style CSR metadata, for
// decode, prefill/extend and MLA, used by the CPU and CUDA tests and by the benchmarks (the same
// table drives both, as ARCHITECTURE.md asks).
//
// A case is built from a CaseSpec: per-request KV lengths (and new-token counts for prefill /
// extend), head counts and dims, dtypes, attention page size P and allocation page size
// (a multiple of P), layout, padding. The logical data (q, K, V or latent) is drawn from the seed
// in an order that does not depend on P, the layout or the page shuffle, so the same spec with
// another P holds the same logical KV (page-size invariance tests). Allocation pages are assigned
// in a shuffled order (separate stream) with spare pages; every slot that holds no token is filled
// with NaN so that a kernel reading outside a request's tokens fails the comparison.
//
// Metadata follows planner.h: qo_indptr [B + 1], kv_indptr [B + 1], kv_indices (attention-page
// ids; attention page j of a request = alloc_page * (alloc / P) + j % (alloc / P)),
// kv_last_page_len [B] (0 for a request without KV). B includes `padded_batch` padding requests
// (no KV; one query row for decode, none for prefill).
//
// Implemented in tests/reference/cases.cpp (library pagedattn_reference) so that the tools
// (benchmarks, demo) link it without GoogleTest. All buffers are host memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/backend.h"
#include "pagedattn/tensor.h"

namespace pagedattn::testing {

struct CaseSpec {
  OpKind op = OpKind::kDecode;
  DType q_dtype = DType::kBF16;  // q and out
  DType kv_dtype = DType::kBF16;
  int32_t num_qo_heads = 8;
  int32_t num_kv_heads = 2;     // MLA: 1
  int32_t head_dim_qk = 128;    // MLA: kv_lora_rank + rope_dim
  int32_t head_dim_vo = 128;    // MLA: kv_lora_rank
  int32_t page_size = 16;       // attention page size P
  int32_t alloc_page_size = 0;  // 0: P; else a multiple of P
  KvLayout layout = KvLayout::kNHD;
  std::vector<int32_t> kv_lens;  // per request (the whole KV, new tokens included)
  std::vector<int32_t> q_lens;   // prefill / extend: new tokens per request; decode: empty (1)
  int32_t padded_batch = 0;      // 0: none; else the batch is padded to this many requests
  bool shuffle_pages = true;
  int32_t spare_pages = 3;  // unused allocation pages in the pool
  float kv_scale = 1.0f;    // fp8 dequantisation scale (K, V, latent)
  float v_scale = 0.0f;     // > 0: V's own fp8 scale (K keeps kv_scale); GQA caches only
  float sm_scale = 0.0f;    // 0: 1 / sqrt(head_dim_qk)
  float logits_soft_cap = 0.0f;
  int32_t window_left = -1;
  bool causal = true;
  bool with_lse = true;
  float value_range = 1.0f;  // inputs uniform in [-range, range)
  // Power of the inputs (issue 20). Uniform inputs with sm_scale 1/sqrt(D) give logits of standard
  // deviation ~1/3: nearly flat softmax, an output ~0.58/sqrt(L) that hides a dropped key below
  // the output's rounding, and a running max that hardly moves. Real models' logits spread more.
  float logit_std = 0;        // > 0: q's range is set so that the logits have this std
  int32_t dominant_keys = 0;  // > 0: per request the first key, the last and (n - 2) at random
                              // positions get logits ~`dominant_boost` above the rest (q and
                              // those keys share a direction u), so the softmax has sharp maxima
  float dominant_boost = 8.0f;
  float v_mean = 0;  // > 0: V of each request is offset by its own mean, |mean| in [v/2, v)

  std::string name() const;  // readable and GoogleTest-safe ([A-Za-z0-9_])
};

class AttentionCase {
 public:
  AttentionCase(const CaseSpec& spec, uint64_t seed);

  const CaseSpec& spec() const { return spec_; }
  int32_t batch_size() const { return batch_; }  // padded
  int64_t num_rows() const { return rows_; }     // T
  const StepMetadata& meta() const { return meta_; }
  OpDesc op_desc() const;

  // Arguments for the run_* calls (and the references); out/lse are this case's buffers.
  DecodeArgs decode_args() const;
  PrefillArgs prefill_args() const;
  MlaArgs mla_args() const;
  // The float64 reference of this case's operation (its out; its lse into `lse` when not null).
  std::vector<double> reference(std::vector<double>* lse) const;

  TensorView out() const { return out_.view(); }
  TensorView lse() const { return spec_.with_lse ? lse_.view() : TensorView{}; }

  // Host copies of the metadata (for building views on another device).
  const std::vector<int32_t>& qo_indptr() const { return qo_indptr_; }
  const std::vector<int32_t>& kv_indptr() const { return kv_indptr_; }
  const std::vector<int32_t>& kv_indices() const { return kv_indices_; }
  const std::vector<int32_t>& kv_last_page_len() const { return kv_last_page_len_; }
  const std::vector<int32_t>& kv_lens() const { return kv_lens_; }  // padded

  // Bytes of KV one run reads once (MLA: the latent once, V being a slice of it).
  int64_t kv_bytes() const;
  // Multiply-adds * 2 of the QK and PV products over the visible (query, key) pairs.
  double flops() const;

  // The raw owned tensors (q for decode/prefill, q_nope/q_pe for MLA; k/v or latent).
  const HostTensor& q_tensor() const { return q_; }
  const HostTensor& q_pe_tensor() const { return q_pe_; }
  const HostTensor& k_tensor() const { return k_; }
  const HostTensor& v_tensor() const { return v_; }
  const HostTensor& latent_tensor() const { return k_; }

 private:
  CaseSpec spec_;
  int32_t batch_ = 0;
  int64_t rows_ = 0;
  int64_t num_alloc_pages_ = 0;
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_, kv_last_page_len_, kv_lens_, q_lens_;
  HostTensor q_, q_pe_, k_, v_, out_, lse_;
  HostTensor qo_indptr_t_, kv_indptr_t_, kv_indices_t_, kv_last_page_len_t_;
  PagedKv kv_;
  PagedLatent latent_;
  StepMetadata meta_;
};

// Benchmark / smoke cases shared by the benchmarks and the device tests: the targets
// (decode: Hq 32, Hkv 8, D 128, bf16 KV, B 16, kv_len 4096, P 16; prefill; MLA decode).
// Turns on the inputs with power (logits of std `logit_std`, 3 dominant keys, V with a mean).
CaseSpec with_power(CaseSpec spec, float logit_std = 2.5f);

CaseSpec decode_target_case();
CaseSpec prefill_target_case();
CaseSpec mla_decode_target_case();

}  // namespace pagedattn::testing
