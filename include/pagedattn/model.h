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
// norm, MLP or MoE; the final norm and lm_head run only on the rows asked for (the last
// num_logit_rows rows, or every row, of each request whose wants_logits is set).
//
// Families differ only in their layer recipe (layers.h): Llama (no biases), Qwen2 (q/k/v biases),
// Qwen3 (per-head q_norm / k_norm before RoPE), DeepSeek-V2/V3 (MLA with the 576-wide latent
// cache, absorbed: W_UK folded into q, W_UV applied after attention; MoE with shared experts after
// first_k_dense_replace dense layers).
//
// Two devices (ModelOptions::device):
//  - cpu: activations are f32; GEMMs go through ops::Linear (weights as stored, f32 copies by
//    default: ModelOptions::weight_mode), the attention through the selected CPU backend.
//  - cuda: weights are uploaded once, tensor by tensor, into device memory in the compute dtype
//    (ModelOptions::compute_dtype); GEMMs run on cuBLAS (compute-dtype inputs, f32 accumulation
//    and outputs); the residual stream, norms, RoPE and softmax statistics stay f32; q and the
//    KV pool (on the device) are in the pool's dtype; the attention runs on the CUDA backends
//    ("cuda", or "cuda_generic" for shapes it does not cover). Activations live in fixed device
//    buffers sized at construction (ModelOptions::max_step_tokens). The logits come back to the
//    host as f32 (src/model/cuda/), except for the rows Step::sampling has sampled on the device:
//    only their token and logprob come back.
// The step structure is the same on both: plan once, per-layer calls on views, no per-token work
// on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/checkpoint.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/linear.h"
#include "pagedattn/model_config.h"
#include "pagedattn/sampling.h"

namespace pagedattn::model {

// ---- the KV pool ----

struct KvPoolConfig {
  int32_t alloc_page_size = 16;  // tokens per allocation page (the engine's unit)
  int32_t page_size = 0;         // attention page size P (divides alloc_page_size); 0: = alloc
  DType dtype = DType::kBF16;    // f32 to compare with transformers bit for bit in f32
  // fp8_e4m3 pools store value / scale (saturated) and the kernels read stored * scale: one
  // scale for every layer's K and one for V (MLA's latent takes k_scale). 1 (uncalibrated, what
  // vLLM's --kv-cache-dtype fp8 uses without scales) unless set; other dtypes require 1.
  float k_scale = 1.0f, v_scale = 1.0f;
  KvLayout layout = KvLayout::kNHD;
  // The pool's size: num_pages if > 0, else as many pages as fit in byte_budget.
  int64_t num_pages = 0;
  int64_t byte_budget = 0;
  // Where the pages live: host memory, or (cuda:N) device memory, zeroed, one allocation for all
  // layers. Model::make_kv_pool sets the model's device.
  Device device = Device::cpu();
};

// One paged cache per layer, on the pool's device: K/V [pages, alloc, Hkv, D] for GQA, the
// latent [pages, alloc, kv_lora_rank + qk_rope] (ckv then kpe) for MLA.
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
  Device device() const { return config_.device; }
  bool is_mla() const { return mla_; }
  int64_t num_layers() const;
  PagedKv layer_kv(int64_t layer) const;
  PagedLatent layer_latent(int64_t layer) const;
  // Unique to this pool in the process (a moved pool keeps it): what a CUDA graph captured over
  // the pool is keyed by. Its addresses are not: a new pool may get a freed one's memory.
  uint64_t id() const { return id_; }

 private:
  KvPoolConfig config_;
  uint64_t id_ = 0;
  bool mla_ = false;
  std::vector<HostKvCache> kv_;  // host pools
  std::vector<HostMlaCache> latent_;
  std::shared_ptr<void> device_memory_;  // device pools: one allocation, viewed per layer
  std::vector<PagedKv> device_kv_;
  std::vector<PagedLatent> device_latent_;
  int64_t device_bytes_ = 0;
  void make_device_caches(const ModelConfig& config);
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
  // With wants_logits under LogitsRows::kLastOfEachRequest: logits of the last num_logit_rows new
  // tokens, 1 to tokens.size() (1: the next-token row of a decode or of a prompt's last chunk;
  // every row of a chunk: an engine's prompt-logprobs prefill, which scores each prompt token).
  int32_t num_logit_rows = 1;
};

enum class LogitsRows : uint8_t { kLastOfEachRequest, kAll };

struct Step {
  std::vector<RequestStep> requests;
  LogitsRows rows = LogitsRows::kLastOfEachRequest;
  // Sampling by the model, one entry per logits row (empty: every row's logits come back). A row
  // whose entry has `sample` set gets its token drawn where the model runs (pagedattn/sampling.h's
  // algorithm: the CUDA kernel on the GPU, ops::RowSampler on the CPU) and returns only that
  // token and its logprob; its logits never leave the device. The other rows return their logits.
  std::vector<ops::RowSampling> sampling;
};

// The logits rows are those of the requests that want logits only, in request order: the last
// num_logit_rows rows of each such request in token order (kLastOfEachRequest) or one per new
// token of it (kAll). rows may be 0.
// values [value_rows, vocab] row-major, f32: every row without Step::sampling; with it, only the
// rows it leaves to the caller (sample unset), in row order. sampled [rows] with Step::sampling:
// the token drawn and its logprob (token -1 for the rows left to the caller); else empty.
struct Logits {
  int64_t rows = 0;
  int64_t vocab = 0;
  std::vector<float> values;
  std::vector<ops::SampledToken> sampled;
  int64_t value_rows() const { return vocab ? static_cast<int64_t>(values.size()) / vocab : 0; }
  std::span<const float> row(int64_t r) const {  // r-th row of values
    return {values.data() + r * vocab, static_cast<size_t>(vocab)};
  }
};

// ---- the model ----

struct ModelOptions {
  ops::WeightMode weight_mode = ops::WeightMode::kAuto;  // cpu
  std::string backend =
      "auto";                 // a registry selection spec ("auto", "cpu", "prefill=..,decode=..")
  int threads = 0;            // OpenMP threads (0: OMP_NUM_THREADS or the core count)
  int64_t max_positions = 0;  // RoPE table length (0: max_position_embeddings)
  // Where the model runs: "cpu", "cuda", "cuda:N", or "auto": the device of the backends the
  // `backend` spec names when it names only CPU ones, else cuda:0 when a CUDA device is usable,
  // else the CPU. "cuda" without a usable device (or in a build without CUDA) is an Error that
  // says why.
  std::string device = "auto";
  // cuda: the dtype of the weights on the device and of every GEMM input (bf16, f16 or f32; the
  // GEMMs accumulate in f32 either way). Absent: the checkpoint's dtype, f32 included (rounding
  // the f32 fixture qwen2_f32's weights to bf16 alone moves its log-probs by up to 0.046 against
  // transformers; ask for bf16 to halve the memory and double the GEMM rate).
  std::optional<DType> compute_dtype;
  // cuda: the activations' fixed device buffers hold steps of up to this many tokens (0: 4096);
  // a larger step is an Error naming this option. ModelRuntime caps the engine's budget at it.
  int64_t max_step_tokens = 0;
  // cuda: decode steps (one new token and its logits per request) of models without MoE layers
  // replay a CUDA graph of the whole step, captured per padded batch size (1, 2, 4, 8, then
  // multiples of 16) up to this many requests, after that size's first step (0: every step is
  // launched kernel by kernel; the engines' --enforce-eager). Larger batches run eagerly.
  int64_t cuda_graph_max_batch = 256;
  // Debugging: every attention plan and run checks the step's metadata on the host before it
  // launches anything (WorkspaceLimits::validate_metadata: a host sync per call on a GPU).
  // Without it the device kernels guard the metadata themselves and a violation is an Error of
  // the step's collect / forward (Workspace::check_device_errors).
  bool validate_metadata = false;
};

// What ModelOptions::device resolves to (see there); throws Error for an unknown device, or
// "cuda" where no CUDA device can be used, saying why.
Device resolve_model_device(const ModelOptions& options);

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
  Device device() const;
  // Bytes the Model owns beyond the checkpoint: host (f32 weight copies, RoPE tables) on the
  // CPU; device memory (weights, RoPE tables, activation buffers) on CUDA.
  int64_t owned_bytes() const;
  // The most tokens one step may hold (cuda: ModelOptions::max_step_tokens; cpu: 0, no bound).
  int64_t max_step_tokens() const;
  // Device memory free now on the model's device (cuda; 0 on the CPU): what a KV pool can take
  // once the weights and buffers are in place.
  int64_t free_device_bytes() const;
  // A pool on the model's device.
  KvPool make_kv_pool(const KvPoolConfig& pool) const;

  // Runs one step over `pool` (whose pages the block tables index; on the model's device) and
  // returns the logits of the rows asked for. One step at a time: a Model keeps its activations
  // between calls (one engine thread steps it; on the CPU its layers use OpenMP inside, on CUDA
  // the step is enqueued on the model's stream and waited for when the logits are copied back).
  // Throws Error naming the request and the problem for an empty request, a
  // block table too short, a page id outside the pool, a position outside the RoPE table, a
  // token id outside the vocabulary, Step::sampling not one entry per logits row or with a
  // parameter out of range; nothing is written to the pool then. A row sampled by the model whose
  // logits are all -inf or NaN is an Error after the step (the KV is written).
  Logits forward(const Step& step, KvPool& pool);

  // Overlap scheduling (cuda; can_launch()): launch() validates and enqueues a step every logits
  // row of which is sampled on the device (Step::sampling with `sample` on each row) and returns
  // without waiting for it; collect() waits for the oldest launched step and writes its tokens
  // (as Logits::sampled; `tokens` has one entry per logits row of that step). At most two launched steps are not collected; forward() needs none. A
  // launched step's token id -(r + 1) is a pending token: the one row r of the previously
  // launched step draws, read where it lands on the device (so the host needs nothing of that
  // step to launch this one). The steps run in launch order. Errors as forward's; a row whose
  // logits are all -inf or NaN is an Error of collect().
  bool can_launch() const;
  void launch(const Step& step, KvPool& pool);
  void collect(std::span<ops::SampledToken> tokens);

  // The device's clock around the last forward or collected launch (cuda; nullopt on the CPU or
  // before the first step), from CUDA events on the model's stream: `span` runs from the call
  // (the host validates and plans, then enqueues; for a launch, from when the device reaches the
  // call's event, which with overlap is the end of the step before) to the end of its last device
  // command (the logits or tokens copy); `gap` from the end of the previous step's last command to
  // this call's event: time in which the device had nothing of this model to run (the engine's
  // host work between steps; about 0 when the step was launched before the previous one ended).
  // Idle time inside a span (host planning, MoE routing's round trip) is not separated out.
  struct DeviceTiming {
    double span_seconds = 0;
    double gap_seconds = -1;  // < 0: no previous forward
    bool graph = false;       // the step replayed a CUDA graph (ModelOptions::cuda_graph_max_batch)
  };
  std::optional<DeviceTiming> last_device_timing() const;

  // Where a step's device time goes (cuda; a diagnostic, off by default). With set_timeline(true)
  // each step stamps the device's clock after every stretch of its work: the embedding, each
  // layer's linear layers, head transform, attention, MLP, then the final norm, lm_head and
  // sampling (a probe kernel of one thread between the stretches, CUDA graphs captured again with
  // the probes in them). last_timeline() waits for the device and returns the last step's
  // stretches in order, each with the time from the end of the one before it to its own end; their
  // sum is the step's device time from its first kernel to its last. A probe adds about a
  // microsecond to the step (compare with the timeline off). On the CPU: nothing (empty).
  struct TimelineSpan {
    std::string label;
    double seconds = 0;
  };
  void set_timeline(bool on);
  std::vector<TimelineSpan> last_timeline() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedattn::model
