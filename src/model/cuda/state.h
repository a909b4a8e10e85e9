// The CUDA model's state, shared by cuda_model.cpp (construction, the step) and layers.cpp (one
// decoder layer's attention and MLP): the device weights of every layer, the fixed activation
// buffers, the metadata buffers, the stream and the cuBLAS handle. Internal to src/model/cuda.
//
// Buffers (T = max_step_tokens; C = compute dtype; A = the KV pool's dtype, q and attention out):
//   residual, branch   f32 [T, hidden]     the residual stream and each sublayer's output
//   x                  C   [T, hidden]     the normed input of a sublayer (x_f32: f32 copy, MoE)
//   GQA   qkv f32 [T, (Hq + 2 Hkv) D]; q A, attn A [T, Hq, D]; attn_c C (A != C)
//   MLA   q f32 [T, H (nope + rope)]; qa f32 / qa_c C [T, q_lora]; kv_a f32 [T, rank + rope];
//         q_nope_c C [T, H, nope]; q_latent A [T, H, rank] (q_latent_f32 f32 staging where A is
//         neither C nor f32: cuBLAS writes f32 or its input's dtype);
//         q_pe A [T, H, rope]; o_latent A [T, H, rank]; o_latent_c C; o C [T, H v]
//   MLP   gate_up f32 [T, 2 I]; act C [T, I] (I the widest dense / shared MLP)
//   MoE   router_logits f32 [T, E]; expert_x C [T k, hidden]; expert_gate_up f32 [T k, 2 I_e]
//         (the host and unfused paths only); expert_act C [T k, I_e]; expert_out f32 [T k,
//         hidden]; shared_out f32 [T, hidden];
//         source_row, position i32 [T k]; route_weight f32 [T k]; expert_ids i32 [T' k] and
//         moe_tiles i32 [moe_max_tiles(T' k, E, 32), 3] (device routing, T' = min(T,
//         device_moe_max_tokens()))
//   head  head_x C [R, hidden]; logits f32 [R, vocab] (R = kLogitChunk rows per lm_head call);
//         sample_spec DeviceRowSampling [T], sampled (token, logprob) [T]: Step::sampling
//   step  token_ids, positions, logit_rows i32 [T]; slots i64 [T]; qo_indptr, kv_indptr i32
//         [T + 1]; kv_last_page_len i32 [T]; kv_indices i32 (grows with the step's pages)
// The A-dtype buffers are allocated at the first step (the pool's dtype is known then).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "model/cuda/blas.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/gemv.h"
#include "model/cuda/sampling.h"
#include "model/cuda/weights.h"
#include "model/forward_step.h"
#include "pagedattn/moe.h"
#include "pagedattn/ops.h"

namespace pagedattn::model::cuda {

inline constexpr int64_t kDefaultMaxStepTokens = 4096;
inline constexpr int64_t kLogitChunk = 128;
// MoE layers route on the device at every step (moe.h: no round trip, so a decode step can be one
// graph); PAGEDATTN_MOE_DEVICE_MAX_TOKENS=N routes steps of more than N tokens on the host (a
// cuBLAS GEMM per expert) instead, to measure the two paths side by side. The limit, or INT64_MAX.
int64_t device_moe_max_tokens();

struct GqaLayer {
  DeviceLinear qkv, o;
  DeviceBuffer q_norm, k_norm;  // Qwen3: [head_dim] f32
};

struct MlaLayer {
  DeviceLinear q_a, q_b;  // q_lora: q_a_proj, q_b_proj; else q_b is q_proj and q_a is empty
  DeviceBuffer q_a_norm, kv_a_norm;
  DeviceLinear kv_a, o;
  DeviceMatrix kv_b;  // [H (nope + v), rank] in the compute dtype: W_UK / W_UV per head
};

struct MlpLayer {
  DeviceLinear gate_up, down;
  bool defined() const { return down.defined(); }
};

struct MoeLayer {
  DeviceMatrix router;         // [E, hidden] f32
  TensorView correction_bias;  // host view (the mapped checkpoint), routing on the host
  ops::MoeRouterConfig routing;
  std::vector<MlpLayer> experts;
  MlpLayer shared;  // or undefined
  // The device path (moe.h; compute dtype bf16 / f16, experts without biases): the router's
  // correction bias in f32, and each expert's gate_up / down weight pointers.
  bool device_routing = false;
  // The experts' gate_up rows interleaved in blocks of kMoePairBlock (moe.h): the grouped GEMM
  // writes act through its SiLU epilogue, and the host path's silu_mul reads that layout.
  bool pairs_interleaved = false;
  DeviceBuffer bias_f32, gate_up_weights, down_weights;
  // Host scratch of the routing, reused across steps.
  std::vector<float> logits;
  ops::MoeAssignment assignment;
  std::vector<int32_t> source_row, position;
  std::vector<int64_t> start;
};

struct DecoderLayer {
  DeviceBuffer input_norm, post_norm;  // [hidden] f32
  GqaLayer gqa;
  MlaLayer mla;
  MlpLayer mlp;
  std::unique_ptr<MoeLayer> moe;
};

// A dense layer's linear layers in the GEMV's fused forms (gemv.h), for a fused step: qkv with
// the input norm in its prologue (its bias stays with the head transform), o_proj and down added
// into the residual stream, gate_up with the post-attention norm and SiLU * up.
struct FusedLinears {
  GemvArgs qkv, o, gate_up, down;
};

struct CudaModel::State final : DeviceStep {
  ModelConfig config;
  Device device;
  DType compute = DType::kBF16;
  DType attention = DType::kBF16;  // the KV pool's dtype of the current buffers
  int64_t max_tokens = 0;
  float eps = 1e-6f;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Blas> blas;
  int64_t weight_bytes = 0, buffer_bytes = 0;

  DeviceMatrix embed, lm_head_own;
  const DeviceMatrix* lm_head = nullptr;  // lm_head_own, or embed when tied
  DeviceBuffer final_norm;
  ops::RopeTable rope;  // host copy: the planner's position checks
  DeviceBuffer rope_cos, rope_sin;
  int32_t rope_half = 0;
  bool rope_interleaved = false;
  std::vector<DecoderLayer> layers;
  StepPlanner planner;

  // Activations (see the file comment).
  DeviceBuffer residual, branch, x, x_f32;
  DeviceBuffer qkv, q, attn, attn_c;
  DeviceBuffer mla_q, qa, qa_c, kv_a, q_nope_c, q_latent, q_latent_f32, q_pe, o_latent, o_latent_c,
      o;
  DeviceBuffer gate_up, act;
  DeviceBuffer router_logits, expert_x, expert_gate_up, expert_act, expert_out, shared_out,
      source_row, position, route_weight, expert_ids, moe_tiles;
  DeviceBuffer head_x, logits, sample_spec, sampled;
  std::vector<DeviceRowSampling> host_sampling;  // the step's specs, uploaded from here
  std::vector<int32_t> host_logit_rows;          // the step's logit rows, uploaded from here
  DeviceBuffer token_ids, positions, logit_rows, slots, qo_indptr, kv_indptr, kv_last_page_len,
      kv_indices;
  bool attention_buffers = false;

  // Model::last_device_timing: events at the forward's call and after its last command; the
  // previous forward's end event, to time the gap between them.
  cudaEvent_t call_event = nullptr, done_event = nullptr, previous_done_event = nullptr;
  std::optional<Model::DeviceTiming> timing;

  // Steps launched and not collected (Model::launch, overlap scheduling; at most two), in slots
  // used in turn (launch k: slot k % 3): each its own events and pinned buffer, into which the
  // step's sampled tokens are copied at its end. previous_launch_rows: the rows of the last launch, which its
  // successor's pending tokens may name (0 after a forward).
  struct Launch {
    cudaEvent_t call = nullptr, done = nullptr;
    ops::SampledToken* tokens = nullptr;  // pinned host memory, [max_tokens]
    int64_t rows = 0;
    bool graph = false;
  };
  // Three slots: two launched, and the last collected one, whose end event times the gap.
  Launch launches[3];
  int64_t num_launched = 0, num_collected = 0;
  int64_t previous_launch_rows = 0;
  cudaEvent_t last_done = nullptr;  // the end of the last step waited for (forward or collect)

  // CUDA graphs of decode steps (cuda_model.cpp): graph_sizes are the padded batch sizes (empty:
  // off); graphs[i] the step of graph_sizes[i] requests, from embedding to the sampling kernel,
  // captured after that size's first (eager) step. A graph holds the device pointers it was
  // captured with: it is stale once the planner's workspaces, the metadata buffers
  // (buffers_generation) or the pool change, and is captured again.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int64_t workspace_generation = -1, buffers_generation = -1;
    uint64_t pool = 0;                        // KvPool::id
    std::vector<const char*> timeline_labels;  // of its probes (the timeline on at capture)
  };
  std::vector<int32_t> graph_sizes;
  std::vector<Graph> graphs;
  int64_t buffers_generation = 0;
  int64_t graph_replays = 0, graph_captures = 0;

  // The timeline (Model::set_timeline): while on, timeline_mark() enqueues a probe
  // (kernels.h: timeline_stamp) that writes timeline_stamps[i] once the work before it is done,
  // labelled timeline_labels[i] (string literals: what ran since the probe before). The labels
  // are those of the step last enqueued or replayed (a graph keeps its capture's).
  static constexpr int64_t kTimelineCapacity = 4096;  // probes per step; later marks are dropped
  bool timeline = false;
  DeviceBuffer timeline_stamps;  // [kTimelineCapacity] uint64
  std::vector<const char*> timeline_labels;

  // The step being run. fused: its dense layers run through the GEMV's fused forms (gemv.h), so
  // no norm, add or silu_mul kernel, and the residual stream (s.residual) already holds each
  // layer's branch; fused_layers holds their operands, one per layer (see prepare_fused_step()).
  int64_t tokens = 0;
  bool fused = false;
  bool branch_pending = false;  // s.branch holds a sublayer's output not yet in s.residual
  std::vector<FusedLinears> fused_layers;
  const StepContext* step = nullptr;
  KvPool* pool = nullptr;

  ~State() override;
  StepMetadata upload(const StepMetadata& host) override;
  void adopt(Workspace& workspace) override;

  DeviceBuffer allocate(int64_t bytes);  // counted in buffer_bytes
  void ensure_attention_buffers(DType attention_dtype);
  int64_t compute_size() const { return dtype_size(compute); }
};

// One decoder layer's sublayers (layers.cpp): read s.x (and s.x_f32); add their output into
// s.residual [T, hidden] in the last GEMM's epilogue, or (a bias on that layer, MoE's combine)
// write it to s.branch and set s.branch_pending for the next add_rms_norm. dense_mlp writes `out`
// when given (MoE's shared experts), else adds into the residual stream likewise.
void gqa_attention(CudaModel::State& s, const DecoderLayer& layer, int64_t index);
void mla_attention(CudaModel::State& s, const DecoderLayer& layer, int64_t index);
void dense_mlp(CudaModel::State& s, const MlpLayer& mlp, const void* x, int64_t rows, float* out);
// Sets s.fused for the step of s.tokens rows, and s.fused_layers where it is: a dense GQA model
// (no MLA, no MoE layer), at most kGemvMaxRows rows, and every layer's linear layers take the
// GEMV's fused forms (shapes, alignment, x staged within kGemvNormMaxBytes).
void prepare_fused_step(CudaModel::State& s);
// A fused step's MLP: gate_up with the post-attention norm in its prologue and SiLU * up in its
// epilogue, then down_proj added into the residual stream.
void fused_mlp(CudaModel::State& s, int64_t index);
void moe_mlp(CudaModel::State& s, MoeLayer& moe);
// The timeline's probe after the work enqueued since the last one (no-op while it is off).
void timeline_mark(CudaModel::State& s, const char* label);
// Whether moe_mlp routes a step of `tokens` tokens on the device (no host synchronisation).
inline bool moe_on_device(const MoeLayer& moe, int64_t tokens) {
  return moe.device_routing && tokens <= device_moe_max_tokens();
}

// A buffer's device pointer as T* (null for an empty buffer).
template <class T>
T* ptr(const DeviceBuffer& buffer) {
  return buffer.as<T>();
}

// Host -> device copy of `count` elements of T, ordered on the model's stream. From pageable
// memory the call returns once the source has been staged, so the host may reuse it at once.
template <class T>
void copy_to_device(const CudaModel::State& s, void* destination, const T* source, int64_t count) {
  if (count == 0) return;
  PA_CUDA_CHECK(cudaMemcpyAsync(destination, source, static_cast<size_t>(count) * sizeof(T),
                                cudaMemcpyHostToDevice, s.stream));
}

// The next add_rms_norm's `add`: s.branch while it holds a sublayer's output not yet in the
// residual stream (s.branch_pending, cleared: that norm adds it), else null.
inline const float* take_branch(CudaModel::State& s) {
  const bool pending = std::exchange(s.branch_pending, false);
  return pending ? ptr<float>(s.branch) : nullptr;
}

}  // namespace pagedattn::model::cuda
