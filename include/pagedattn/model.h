// The model runtime: a loaded checkpoint (ModelConfig + ModelWeights, see checkpoint.h) becomes a
// Model whose forward() runs one engine step, a batch of requests over a paged KV pool, and
// returns the logits of the rows asked for.
//
// A step: each request brings new tokens (a prefill chunk over its cached prefix, or one decode
// token), their positions and its block table (allocation-page ids covering cached + new tokens).
// forward() embeds the tokens, plans the attention metadata once (planner.h + Backend::plan),
// then runs every decoder layer: pre-norm (fused with the residual add), attention through the
// Backend exactly as an engine calls it (new K/V or latent stored with store_kv / store_latent,
// then run_decode when every request has one new token, else run_prefill; MLA: run_mla), post-
// norm, MLP or MoE; the final norm and lm_head run only on the rows asked for (the last row, or
// every row, of each request whose wants_logits is set).
//
// Families differ only in their layer recipe (layers.h): Llama (no biases), Qwen2 (q/k/v biases),
// Qwen3 (per-head q_norm / k_norm before RoPE), DeepSeek-V2/V3 (MLA with the 576-wide latent
// cache, absorbed: W_UK folded into q, W_UV applied after attention; MoE with shared experts after
// first_k_dense_replace dense layers).
//
// Activations are f32; GEMMs go through ops::Linear (weights as stored, f32 copies by default:
// ModelOptions::weight_mode), the attention through the selected Backend. This session's
// implementation runs on the CPU; the step structure (plan once, per-layer calls on views, no
// per-token work on the host) is the one a CUDA path fills with cuBLAS and device kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/checkpoint.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model {

// ---- the KV pool ----

struct KvPoolConfig {
  int32_t alloc_page_size = 16;  // tokens per allocation page (the engine's unit)
  int32_t page_size = 0;         // attention page size P (divides alloc_page_size); 0: = alloc
  DType dtype = DType::kBF16;    // f32 to compare with transformers bit for bit in f32
  KvLayout layout = KvLayout::kNHD;
  // The pool's size: num_pages if > 0, else as many pages as fit in byte_budget.
  int64_t num_pages = 0;
  int64_t byte_budget = 0;
};

// One paged cache per layer, on the host: K/V [pages, alloc, Hkv, D] for GQA, the latent
// [pages, alloc, kv_lora_rank + qk_rope] (ckv then kpe) for MLA.
class KvPool {
 public:
  KvPool(const ModelConfig& config, const KvPoolConfig& pool);
  // Bytes of one allocation page over all layers.
  static int64_t bytes_per_page(const ModelConfig& config, int32_t alloc_page_size, DType dtype);

  const KvPoolConfig& config() const { return config_; }
  int64_t num_pages() const { return config_.num_pages; }
  int32_t alloc_page_size() const { return config_.alloc_page_size; }
  int32_t page_size() const { return config_.page_size; }
  int64_t bytes() const;
  bool is_mla() const { return !latent_.empty(); }
  int64_t num_layers() const;
  PagedKv layer_kv(int64_t layer) const;
  PagedLatent layer_latent(int64_t layer) const;

 private:
  KvPoolConfig config_;
  std::vector<HostKvCache> kv_;
  std::vector<HostMlaCache> latent_;
};

// ---- a step ----

struct RequestStep {
  std::span<const int32_t> tokens;       // the new tokens (>= 1)
  int32_t cached_len = 0;                // tokens already in the KV; new token i is number
                                         // cached_len + i of the sequence (its KV slot)
  std::span<const int32_t> positions;    // RoPE positions of the new tokens; empty: cached_len + i
  std::span<const int32_t> block_table;  // allocation pages, >= ceil((cached + new) / alloc)
  // false: no logits row for this request (an engine's prefill chunk that does not reach the end
  // of the prompt); its rows skip the final norm and lm_head, whose cost at a large vocabulary is
  // that of a few layers.
  bool wants_logits = true;
};

enum class LogitsRows : uint8_t { kLastOfEachRequest, kAll };

struct Step {
  std::vector<RequestStep> requests;
  LogitsRows rows = LogitsRows::kLastOfEachRequest;
};

// logits [rows, vocab] row-major, f32, over the requests that want logits only, in request order:
// one row per such request (kLastOfEachRequest) or one per new token of it (kAll). rows may be 0.
struct Logits {
  int64_t rows = 0;
  int64_t vocab = 0;
  std::vector<float> values;
  std::span<const float> row(int64_t r) const {
    return {values.data() + r * vocab, static_cast<size_t>(vocab)};
  }
};

// ---- the model ----

struct ModelOptions {
  ops::WeightMode weight_mode = ops::WeightMode::kAuto;
  std::string backend =
      "auto";                 // a registry selection spec ("auto", "cpu", "prefill=..,decode=..")
  int threads = 0;            // OpenMP threads (0: OMP_NUM_THREADS or the core count)
  int64_t max_positions = 0;  // RoPE table length (0: max_position_embeddings)
};

class Model {
 public:
  // Builds the layers over `weights` (its views must outlive the Model: keep the Checkpoint).
  // Throws Error when the shapes are not a model the attention backend can run (e.g. a head_dim
  // the backend does not support), naming the value.
  Model(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& options = {});
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const;
  // Host bytes the Model owns beyond the checkpoint (f32 weight copies, RoPE tables).
  int64_t owned_bytes() const;
  KvPool make_kv_pool(const KvPoolConfig& pool) const { return KvPool(config(), pool); }

  // Runs one step over `pool` (whose pages the block tables index) and returns the logits of the
  // rows asked for. One step at a time: a Model keeps its activations between calls (one engine
  // thread steps it; its layers use OpenMP inside).
  // Throws Error naming the request and the problem for an empty request, a
  // block table too short, a page id outside the pool, a position outside the RoPE table, a
  // token id outside the vocabulary; nothing is written to the pool then.
  Logits forward(const Step& step, KvPool& pool);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedattn::model
