// CudaModel (cuda_model.h): construction (weights uploaded per tensor, activation buffers sized
// for max_step_tokens, the stream and cuBLAS handle), the step (host planning, copies of the
// step's arrays, the layer loop of layers.cpp, the final norm and lm_head in chunks of rows, the
// logits back), and the planner's device hooks (metadata copies, workspace streams).
#include "model/cuda/cuda_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "core/check.h"
#include "cuda/cuda_backend.h"
#include "model/cuda/kernels.h"
#include "model/cuda/moe.h"
#include "model/cuda/sampling.h"
#include "model/cuda/state.h"
#include "model/layers.h"

namespace pagedattn::model::cuda {

using State = CudaModel::State;

Support device_usable(Device device) {
  if (Support available = ::pagedattn::cuda::device_available(); !available) return available;
  int count = 0;
  PA_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device.type != DeviceType::kCUDA || device.index < 0 || device.index >= count) {
    return Support::no(
        fmt::format("{} is not one of the {} CUDA devices here", device.str(), count));
  }
  return Support::yes();
}

namespace {

std::string memory_report() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return "device memory unknown";
  }
  return fmt::format("{:.1f} of {:.1f} GiB free", static_cast<double>(free) / (1 << 30),
                     static_cast<double>(total) / (1 << 30));
}

DType choose_compute_dtype(const ModelOptions& options, DType checkpoint) {
  if (options.compute_dtype) {
    const DType dtype = *options.compute_dtype;
    PA_CHECK(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32,
             "model: compute_dtype {} (expected bf16, f16 or f32)", dtype_name(dtype));
    return dtype;
  }
  return checkpoint;  // f32 checkpoints stay f32 unless asked (see ModelOptions::compute_dtype)
}

}  // namespace

int64_t device_moe_max_tokens() {
  static const int64_t limit = [] {
    // ARCHITECTURE.md, "Switches": read once per process.
    const char* value = std::getenv("PAGEDATTN_MOE_DEVICE_MAX_TOKENS");
    if (value == nullptr || *value == '\0') return std::numeric_limits<int64_t>::max();
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(value, &end, 10);
    PA_CHECK(*end == '\0' && errno == 0 && parsed >= 0,
             "PAGEDATTN_MOE_DEVICE_MAX_TOKENS={} (expected a token count >= 0)", value);
    return static_cast<int64_t>(parsed);
  }();
  return limit;
}

std::shared_ptr<void> allocate_device_memory(int64_t bytes, Device device, std::string_view what) {
  PA_CHECK(bytes >= 0, "{}: {} bytes", what, bytes);
  PA_CUDA_CHECK(cudaSetDevice(device.index));
  void* data = nullptr;
  const cudaError_t status = cudaMalloc(&data, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  if (status != cudaSuccess) {
    cudaGetLastError();
    PA_FAIL("{}: cudaMalloc of {:.1f} MiB on {} failed: {} ({})", what,
            static_cast<double>(bytes) / (1 << 20), device.str(), cudaGetErrorString(status),
            memory_report());
  }
  std::shared_ptr<void> owner(data, [](void* p) { cudaFree(p); });
  PA_CUDA_CHECK(cudaMemset(data, 0, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  // The memset runs on the legacy stream, which the model's non-blocking stream does not wait for.
  PA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return owner;
}

// ---- State ----

State::~State() {
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (Graph& graph : graphs) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
  }
  for (cudaEvent_t event : {call_event, done_event, previous_done_event}) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  for (Launch& launch : launches) {
    for (cudaEvent_t event : {launch.call, launch.done}) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (launch.tokens != nullptr) cudaFreeHost(launch.tokens);
  }
  blas.reset();  // the handle is bound to the stream: destroyed first
  if (stream != nullptr) cudaStreamDestroy(stream);
}

DeviceBuffer State::allocate(int64_t bytes) {
  try {
    DeviceBuffer buffer(static_cast<size_t>(bytes));
    buffer_bytes += bytes;
    return buffer;
  } catch (const Error& error) {
    PA_FAIL("model: activation buffers for max_step_tokens {} ({:.1f} MiB more; {}): {}",
            max_tokens, static_cast<double>(bytes) / (1 << 20), memory_report(), error.what());
  }
}

void State::ensure_attention_buffers(DType attention_dtype) {
  if (attention_buffers && attention == attention_dtype) return;
  attention = attention_dtype;
  const int64_t t = max_tokens, a = dtype_size(attention_dtype), c = compute_size();
  const int64_t heads = config.num_attention_heads;
  const bool to_compute = attention_dtype != compute;
  if (config.is_mla()) {
    const MlaConfig& m = *config.mla;
    q_latent = allocate(t * heads * m.kv_lora_rank * a);
    // The q absorb GEMM writes A directly where cuBLAS can (A = C, or f32); else f32, converted.
    q_latent_f32 = attention_dtype == compute || attention_dtype == DType::kF32
                       ? DeviceBuffer()
                       : allocate(t * heads * m.kv_lora_rank * 4);
    q_pe = allocate(t * heads * m.qk_rope_head_dim * a);
    o_latent = allocate(t * heads * m.kv_lora_rank * a);
    o_latent_c = to_compute ? allocate(t * heads * m.kv_lora_rank * c) : DeviceBuffer();
  } else {
    const int64_t width = heads * config.head_dim;
    q = allocate(t * width * a);
    attn = allocate(t * width * a);
    attn_c = to_compute ? allocate(t * width * c) : DeviceBuffer();
  }
  attention_buffers = true;
}

StepMetadata State::upload(const StepMetadata& host) {
  const int64_t batch = host.batch_size;
  PA_CHECK(batch <= max_tokens, "step: {} requests, more than max_step_tokens {}", batch,
           max_tokens);
  const int64_t pages = host.kv_indices.shape[0];
  if (static_cast<int64_t>(kv_indices.bytes()) < pages * 4) {
    // Grows between steps only (every step ends with the stream synchronised).
    kv_indices = allocate(std::max<int64_t>(pages, 1024) * 2 * 4);
    ++buffers_generation;  // the captured graphs read the old buffer
  }
  copy_to_device(*this, qo_indptr.data(), host.qo_indptr.data_as<const int32_t>(), batch + 1);
  copy_to_device(*this, kv_indptr.data(), host.kv_indptr.data_as<const int32_t>(), batch + 1);
  copy_to_device(*this, kv_last_page_len.data(), host.kv_last_page_len.data_as<const int32_t>(),
                 batch);
  copy_to_device(*this, kv_indices.data(), host.kv_indices.data_as<const int32_t>(), pages);
  StepMetadata meta = host;
  const auto view = [&](const DeviceBuffer& buffer, int64_t n) {
    return TensorView::contiguous(buffer.data(), DType::kI32, {n}, device);
  };
  meta.qo_indptr = view(qo_indptr, batch + 1);
  meta.kv_indptr = view(kv_indptr, batch + 1);
  meta.kv_last_page_len = view(kv_last_page_len, batch);
  // The whole buffer, not this step's pages: a captured graph keeps the view's extent as the
  // kernels' bound on kv_indices (cuda/common/guard.h) and replays it over later steps with more
  // pages; the buffer is fixed until it grows, and growing recaptures the graphs.
  meta.kv_indices = view(kv_indices, static_cast<int64_t>(kv_indices.bytes() / 4));
  return meta;
}

void State::adopt(Workspace& workspace) {
  // The CUDA backend plans on its workspace's stream and checks that run_* use the same one.
  if (auto* cuda_workspace = dynamic_cast<::pagedattn::cuda::CudaWorkspace*>(&workspace)) {
    cuda_workspace->stream = stream;
  }
  // A new workspace zeroes its counters with cudaMemset on the legacy stream, which the model's
  // non-blocking stream does not wait for.
  PA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

// ---- construction ----

CudaModel::CudaModel(const ModelConfig& config, const ModelWeights& weights,
                     const ModelOptions& options, Device device)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  s.device = device;
  PA_CUDA_CHECK(cudaSetDevice(device.index));
  PA_CHECK(static_cast<int64_t>(weights.layers.size()) == config.num_hidden_layers,
           "model: {} layers of weights for num_hidden_layers {}", weights.layers.size(),
           config.num_hidden_layers);
  s.compute = choose_compute_dtype(options, weights.dtype);
  s.max_tokens = options.max_step_tokens > 0 ? options.max_step_tokens : kDefaultMaxStepTokens;
  s.eps = static_cast<float>(config.rms_norm_eps);
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  s.blas = std::make_unique<Blas>(s.stream);
  for (cudaEvent_t* event : {&s.call_event, &s.done_event, &s.previous_done_event}) {
    PA_CUDA_CHECK(cudaEventCreate(event));
  }
  for (State::Launch& launch : s.launches) {
    PA_CUDA_CHECK(cudaEventCreate(&launch.call));
    PA_CUDA_CHECK(cudaEventCreate(&launch.done));
    PA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&launch.tokens),
                                static_cast<size_t>(s.max_tokens) * sizeof(ops::SampledToken),
                                cudaHostAllocDefault));
  }

  // ---- weights ----
  WeightUploader up(s.compute);
  const int64_t hidden = config.hidden_size, heads = config.num_attention_heads;
  s.embed = up.matrix("model.embed_tokens.weight", weights.embed_tokens, s.compute);
  PA_CHECK(s.embed.rows == config.vocab_size && s.embed.cols == hidden,
           "model.embed_tokens.weight: [{}, {}] (expected [{}, {}])", s.embed.rows, s.embed.cols,
           config.vocab_size, hidden);
  if (weights.lm_head.data == weights.embed_tokens.data) {
    s.lm_head = &s.embed;
  } else {
    s.lm_head_own = up.matrix("lm_head.weight", weights.lm_head, s.compute);
    s.lm_head = &s.lm_head_own;
  }
  s.final_norm = up.vector("model.norm.weight", weights.final_norm, hidden);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const DecoderLayerWeights& w = weights.layers[static_cast<size_t>(i)];
    const std::string prefix = fmt::format("model.layers.{}", i);
    DecoderLayer layer;
    layer.input_norm = up.vector(prefix + ".input_layernorm.weight", w.input_layernorm, hidden);
    layer.post_norm =
        up.vector(prefix + ".post_attention_layernorm.weight", w.post_attention_layernorm, hidden);
    const std::string attn = prefix + ".self_attn";
    if (config.is_mla()) {
      const MlaConfig& m = *config.mla;
      MlaLayer& mla = layer.mla;
      if (m.has_q_lora()) {
        mla.q_a = up.linear(attn + ".q_a_proj", {&w.mla.q_a_proj});
        mla.q_a_norm =
            up.vector(attn + ".q_a_layernorm.weight", w.mla.q_a_layernorm, m.q_lora_rank);
        mla.q_b = up.linear(attn + ".q_b_proj", {&w.mla.q_b_proj});
      } else {
        mla.q_b = up.linear(attn + ".q_proj", {&w.mla.q_proj});
      }
      mla.kv_a = up.linear(attn + ".kv_a_proj_with_mqa", {&w.mla.kv_a_proj_with_mqa});
      mla.kv_a_norm =
          up.vector(attn + ".kv_a_layernorm.weight", w.mla.kv_a_layernorm, m.kv_lora_rank);
      const TensorView& kv_b = w.mla.kv_b_proj.weight;
      PA_CHECK(kv_b.ndim == 2 && kv_b.shape[0] == heads * (m.qk_nope_head_dim + m.v_head_dim) &&
                   kv_b.shape[1] == m.kv_lora_rank,
               "{}.kv_b_proj: shape {} (expected [{}, {}])", attn, kv_b.shape_str(),
               heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      PA_CHECK(!w.mla.kv_b_proj.bias.defined(), "{}.kv_b_proj: a bias is not supported", attn);
      mla.kv_b = up.matrix(attn + ".kv_b_proj.weight", kv_b, s.compute);
      mla.o = up.linear(attn + ".o_proj", {&w.mla.o_proj});
      PA_CHECK(mla.q_b.out() == heads * m.qk_head_dim() &&
                   mla.kv_a.out() == m.kv_lora_rank + m.qk_rope_head_dim &&
                   mla.o.in() == heads * m.v_head_dim && mla.o.out() == hidden,
               "{}: q [{}], kv_a [{}], o [{} -> {}] (expected {}, {}, {} -> {})", attn,
               mla.q_b.out(), mla.kv_a.out(), mla.o.in(), mla.o.out(), heads * m.qk_head_dim(),
               m.kv_lora_rank + m.qk_rope_head_dim, heads * m.v_head_dim, hidden);
    } else {
      GqaLayer& gqa = layer.gqa;
      gqa.qkv = up.linear(attn + ".qkv_proj",
                          {&w.attention.q_proj, &w.attention.k_proj, &w.attention.v_proj});
      gqa.o = up.linear(attn + ".o_proj", {&w.attention.o_proj});
      const int64_t width = (heads + 2 * config.num_key_value_heads) * config.head_dim;
      PA_CHECK(gqa.qkv.out() == width && gqa.o.in() == heads * config.head_dim,
               "{}: q/k/v give {} features, o_proj takes {} (expected {} and {})", attn,
               gqa.qkv.out(), gqa.o.in(), width, heads * config.head_dim);
      if (w.attention.q_norm.defined()) {
        gqa.q_norm = up.vector(attn + ".q_norm.weight", w.attention.q_norm, config.head_dim);
        gqa.k_norm = up.vector(attn + ".k_norm.weight", w.attention.k_norm, config.head_dim);
      }
    }
    const std::string mlp = prefix + ".mlp";
    if (config.is_moe_layer(i)) {
      const MoeConfig& moe_config = *config.moe;
      auto moe = std::make_unique<MoeLayer>();
      moe->router = up.matrix(mlp + ".gate.weight", w.moe.router, DType::kF32);
      moe->correction_bias = w.moe.e_score_correction_bias;
      moe->routing = moe_router_config(moe_config);
      PA_CHECK(static_cast<int64_t>(w.moe.experts.size()) == moe_config.n_routed_experts &&
                   moe->router.rows == moe_config.n_routed_experts,
               "{}: {} experts and a router of {} (expected n_routed_experts {})", mlp,
               w.moe.experts.size(), moe->router.rows, moe_config.n_routed_experts);
      for (size_t e = 0; e < w.moe.experts.size(); ++e) {
        const MlpWeights& ew = w.moe.experts[e];
        const std::string name = fmt::format("{}.experts.{}", mlp, e);
        MlpLayer expert;
        expert.gate_up = up.linear(name + ".gate_up_proj", {&ew.gate_proj, &ew.up_proj});
        expert.down = up.linear(name + ".down_proj", {&ew.down_proj});
        moe->experts.push_back(std::move(expert));
      }
      // The device path: 16-bit GEMM inputs, no expert biases, rows of 16-byte multiples.
      const int64_t expert_width = moe->experts.front().down.in();
      moe->device_routing =
          s.compute != DType::kF32 && moe_config.n_routed_experts <= kMoeMaxExperts &&
          moe_config.n_group <= kMoeMaxGroups && hidden % 8 == 0 && expert_width % 8 == 0;
      for (const MlpLayer& expert : moe->experts) {
        moe->device_routing = moe->device_routing && expert.gate_up.bias.data() == nullptr &&
                              expert.down.bias.data() == nullptr &&
                              expert.down.in() == expert_width;
      }
      if (moe->device_routing) {
        moe->pairs_interleaved = expert_width % kMoePairBlock == 0;
        std::vector<const void*> gate_up, down;
        for (size_t e = 0; e < moe->experts.size(); ++e) {
          MlpLayer& expert = moe->experts[e];
          if (moe->pairs_interleaved) {
            up.interleave_pairs(fmt::format("{}.experts.{}.gate_up_proj", mlp, e),
                                expert.gate_up.weight, kMoePairBlock);
          }
          gate_up.push_back(expert.gate_up.weight.data());
          down.push_back(expert.down.weight.data());
        }
        const auto pointers = [&](const std::vector<const void*>& values) {
          DeviceBuffer buffer(values.size() * sizeof(void*));
          PA_CUDA_CHECK(cudaMemcpy(buffer.data(), values.data(), values.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice));
          return buffer;
        };
        moe->gate_up_weights = pointers(gate_up);
        moe->down_weights = pointers(down);
        if (moe->correction_bias.defined()) {
          moe->bias_f32 = up.vector(mlp + ".gate.e_score_correction_bias", moe->correction_bias,
                                    moe_config.n_routed_experts);
        }
      }
      if (w.moe.shared_experts.defined()) {
        const MlpWeights& sw = w.moe.shared_experts;
        moe->shared.gate_up =
            up.linear(mlp + ".shared_experts.gate_up_proj", {&sw.gate_proj, &sw.up_proj});
        moe->shared.down = up.linear(mlp + ".shared_experts.down_proj", {&sw.down_proj});
      }
      layer.moe = std::move(moe);
    } else {
      layer.mlp.gate_up = up.linear(mlp + ".gate_up_proj", {&w.mlp.gate_proj, &w.mlp.up_proj});
      layer.mlp.down = up.linear(mlp + ".down_proj", {&w.mlp.down_proj});
    }
    s.layers.push_back(std::move(layer));
  }
  s.rope = make_rope_table(config, options);
  const int64_t max_positions = s.rope.max_positions();
  s.rope_half = s.rope.rotary_dim() / 2;
  s.rope_interleaved = config.rope.layout == RopeLayout::kInterleaved;
  s.rope_cos = up.floats(s.rope.cos_row(0), max_positions * s.rope_half);
  s.rope_sin = up.floats(s.rope.sin_row(0), max_positions * s.rope_half);
  s.weight_bytes = up.bytes();

  // ---- activation buffers (state.h) ----
  const int64_t t = s.max_tokens, f = 4, c = s.compute_size();
  s.residual = s.allocate(t * hidden * f);
  s.branch = s.allocate(t * hidden * f);
  s.x = s.allocate(t * hidden * c);
  int64_t widest_mlp = 0;
  const MoeLayer* any_moe = nullptr;
  bool all_fused = true;  // every MoE layer's device path writes act from its GEMM's epilogue
  for (const DecoderLayer& layer : s.layers) {
    if (layer.moe) {
      any_moe = layer.moe.get();
      all_fused = all_fused && layer.moe->pairs_interleaved;
      if (layer.moe->shared.defined())
        widest_mlp = std::max(widest_mlp, layer.moe->shared.down.in());
    } else {
      widest_mlp = std::max(widest_mlp, layer.mlp.down.in());
    }
  }
  if (config.is_mla()) {
    const MlaConfig& m = *config.mla;
    s.mla_q = s.allocate(t * heads * m.qk_head_dim() * f);
    if (m.has_q_lora()) {
      s.qa = s.allocate(t * m.q_lora_rank * f);
      s.qa_c = s.allocate(t * m.q_lora_rank * c);
    }
    s.kv_a = s.allocate(t * (m.kv_lora_rank + m.qk_rope_head_dim) * f);
    s.q_nope_c = s.allocate(t * heads * m.qk_nope_head_dim * c);
    s.o = s.allocate(t * heads * m.v_head_dim * c);
  } else {
    s.qkv = s.allocate(t * (heads + 2 * config.num_key_value_heads) * config.head_dim * f);
  }
  if (widest_mlp > 0) {
    s.gate_up = s.allocate(t * 2 * widest_mlp * f);
    s.act = s.allocate(t * widest_mlp * c);
  }
  if (any_moe != nullptr) {
    const int64_t experts = config.moe->n_routed_experts, k = config.moe->num_experts_per_tok;
    const int64_t width = any_moe->experts.front().down.in();
    s.x_f32 = s.allocate(t * hidden * f);
    s.router_logits = s.allocate(t * experts * f);
    s.expert_x = s.allocate(t * k * hidden * c);
    // gate_up in f32 for the host path (steps past device_moe_max_tokens(), f32 weights) and the
    // unfused device path only: 553 MB at DeepSeek-V2-Lite's 8192 tokens.
    if (!all_fused || device_moe_max_tokens() < t) {
      s.expert_gate_up = s.allocate(t * k * 2 * width * f);
    }
    s.expert_act = s.allocate(t * k * width * c);
    s.expert_out = s.allocate(t * k * hidden * f);
    s.shared_out = s.allocate(t * hidden * f);
    s.source_row = s.allocate(t * k * 4);
    s.position = s.allocate(t * k * 4);
    s.route_weight = s.allocate(t * k * f);
    const int64_t routed = std::min(t, device_moe_max_tokens()) * k;
    s.expert_ids = s.allocate(routed * 4);
    // Sized for 32-row tiles: the longest table either tile height needs.
    s.moe_tiles =
        s.allocate(moe_max_tiles(routed, static_cast<int32_t>(experts), kMoeTileRows) * 3 * 4);
  }
  const int64_t chunk = std::min(t, kLogitChunk);
  s.head_x = s.allocate(chunk * hidden * c);
  s.logits = s.allocate(chunk * config.vocab_size * f);
  s.sample_spec = s.allocate(t * static_cast<int64_t>(sizeof(DeviceRowSampling)));
  s.sampled = s.allocate(t * static_cast<int64_t>(sizeof(ops::SampledToken)));
  s.token_ids = s.allocate(t * 4);
  s.positions = s.allocate(t * 4);
  s.logit_rows = s.allocate(t * 4);
  s.slots = s.allocate(t * 8);
  s.qo_indptr = s.allocate((t + 1) * 4);
  s.kv_indptr = s.allocate((t + 1) * 4);
  s.kv_last_page_len = s.allocate(t * 4);

  s.planner = StepPlanner(config, Selection::parse(options.backend), device, &s);
  s.planner.set_validate_metadata(options.validate_metadata);
  s.planner.set_fp8_query_dtype(s.compute == DType::kF16 ? DType::kF16 : DType::kBF16);
  PA_CHECK(options.cuda_graph_max_batch >= 0, "model: cuda_graph_max_batch {} (expected >= 0)",
           options.cuda_graph_max_batch);
  // Padded sizes 1, 2, 4, 8, 16, 32, 48, ...: at most 15 padding rows past 16 requests.
  const int64_t graph_max = std::min(options.cuda_graph_max_batch, s.max_tokens);
  for (int64_t size = 1; size <= graph_max; size = size < 16 ? size * 2 : size + 16) {
    s.graph_sizes.push_back(static_cast<int32_t>(size));
  }
  if (graph_max > 0 && s.graph_sizes.back() < graph_max) {
    s.graph_sizes.push_back(static_cast<int32_t>(graph_max));
  }
  s.graphs.resize(s.graph_sizes.size());
  // The uploads ran on the legacy stream; the steps run on the non-blocking one.
  PA_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaModel::~CudaModel() = default;

int64_t CudaModel::device_bytes() const {
  return state_->weight_bytes + state_->buffer_bytes + state_->blas->workspace_bytes();
}
int64_t CudaModel::max_step_tokens() const { return state_->max_tokens; }
DType CudaModel::compute_dtype() const { return state_->compute; }

std::optional<Model::DeviceTiming> CudaModel::last_timing() const { return state_->timing; }

void timeline_mark(State& s, const char* label) {
  if (!s.timeline) return;
  const auto index = static_cast<int64_t>(s.timeline_labels.size());
  if (index >= State::kTimelineCapacity) return;
  s.timeline_labels.push_back(label);
  timeline_stamp(ptr<uint64_t>(s.timeline_stamps), index, s.stream);
}

void CudaModel::set_timeline(bool on) {
  State& s = *state_;
  if (on == s.timeline) return;
  PA_CUDA_CHECK(cudaSetDevice(s.device.index));
  if (on && s.timeline_stamps.data() == nullptr) {
    s.timeline_stamps = s.allocate(State::kTimelineCapacity * int64_t{sizeof(uint64_t)});
  }
  s.timeline = on;
  s.timeline_labels.clear();
  ++s.buffers_generation;  // the graphs are captured again, with or without the probes
}

std::vector<Model::TimelineSpan> CudaModel::last_timeline() const {
  const State& s = *state_;
  const size_t n = s.timeline_labels.size();
  if (!s.timeline || n < 2) return {};
  PA_CUDA_CHECK(cudaSetDevice(s.device.index));
  PA_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::vector<uint64_t> stamps(n);
  PA_CUDA_CHECK(cudaMemcpy(stamps.data(), s.timeline_stamps.data(), n * sizeof(uint64_t),
                           cudaMemcpyDeviceToHost));
  std::vector<Model::TimelineSpan> spans;
  spans.reserve(n - 1);
  for (size_t i = 1; i < n; ++i) {
    // The clock never runs back; a difference below 0 would be a probe that did not run.
    const double ns = stamps[i] >= stamps[i - 1] ? static_cast<double>(stamps[i] - stamps[i - 1])
                                                 : 0.0;
    spans.push_back({s.timeline_labels[i], ns * 1e-9});
  }
  return spans;
}

int64_t CudaModel::free_device_bytes() const {
  PA_CUDA_CHECK(cudaSetDevice(state_->device.index));
  size_t free = 0, total = 0;
  PA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

// ---- a step ----

namespace {

// The padded batch size of `step`'s CUDA graph, or 0 when the step runs eagerly: a decode step
// (one new token and its logits row per request) whose MoE layers, if any, route on the device
// (moe.h: bf16 / f16 weights, within device_moe_max_tokens()), on the tuned "cuda" attention
// kernels (they read every size from the device), of at most the largest graph size. With more rows
// than one lm_head chunk, every row must be sampled on the device (the eager loop copies each
// chunk's logits out before the next chunk overwrites them).
int32_t graph_batch(State& s, const Step& step, const KvPool& pool) {
  if (s.graph_sizes.empty()) return 0;
  const int64_t num_reqs = static_cast<int64_t>(step.requests.size());
  if (num_reqs == 0 || num_reqs > s.graph_sizes.back()) return 0;
  for (const RequestStep& request : step.requests) {
    if (request.tokens.size() != 1 || !request.wants_logits || request.num_logit_rows != 1) {
      return 0;
    }
  }
  // (A pool of the wrong kind is left to prepare(), which names the problem.)
  if (pool.is_mla() != s.config.is_mla()) return 0;
  if (s.planner.backend_for(/*decode=*/true, pool).name() != "cuda") return 0;
  const int32_t size =
      *std::lower_bound(s.graph_sizes.begin(), s.graph_sizes.end(), static_cast<int32_t>(num_reqs));
  // MoE layers: only where they route on the device for a step of this size.
  for (const DecoderLayer& layer : s.layers) {
    if (layer.moe && !moe_on_device(*layer.moe, size)) return 0;
  }
  if (size > std::min(s.max_tokens, kLogitChunk)) {
    if (step.sampling.size() != static_cast<size_t>(num_reqs)) return 0;
    for (const ops::RowSampling& row : step.sampling) {
      if (!row.sample) return 0;
    }
  }
  return size;
}

// Rows [start, start + count) of s.logit_rows: the final norm, lm_head into s.logits, and with
// `sample` the sampling kernel over them (rows whose spec has sample unset are skipped).
void enqueue_head_chunk(State& s, int64_t start, int64_t count, bool sample) {
  const int64_t hidden = s.config.hidden_size, vocab = s.config.vocab_size;
  AddNormArgs norm;
  norm.residual = ptr<float>(s.residual);
  norm.add = s.branch_pending ? ptr<float>(s.branch) : nullptr;  // else in the residual already
  norm.weight = ptr<float>(s.final_norm);
  norm.out = s.head_x.data();
  norm.out_dtype = s.compute;
  norm.row_index = ptr<int32_t>(s.logit_rows) + start;
  norm.rows = count;
  norm.dim = hidden;
  norm.eps = s.eps;
  add_rms_norm(norm, s.stream);
  timeline_mark(s, "final norm");
  s.blas->linear(count, vocab, hidden, s.head_x.data(), hidden, s.lm_head->data(), hidden,
                 s.compute, s.logits.data(), vocab, DType::kF32);
  timeline_mark(s, "lm_head");
  if (sample) {
    sample_rows(ptr<float>(s.logits), count, vocab, ptr<DeviceRowSampling>(s.sample_spec) + start,
                ptr<ops::SampledToken>(s.sampled) + start, s.stream,
                sample_cluster_size(count, vocab, s.blas->sm_count()));
    timeline_mark(s, "sampling");
  }
}

// Embedding and every decoder layer over the step's s.tokens rows: s.residual + s.branch hold the
// last layer's output (fused: s.residual alone).
void enqueue_layers(State& s) {
  const int64_t t = s.tokens, hidden = s.config.hidden_size;
  prepare_fused_step(s);
  s.branch_pending = false;
  timeline_mark(s, "(start)");
  embedding(s.embed.data(), s.compute, hidden, ptr<int32_t>(s.token_ids), t,
            ptr<ops::SampledToken>(s.sampled), ptr<float>(s.residual), s.stream);
  timeline_mark(s, "embedding");
  for (size_t i = 0; i < s.layers.size(); ++i) {
    DecoderLayer& layer = s.layers[i];
    if (s.fused) {
      gqa_attention(s, layer, static_cast<int64_t>(i));
      fused_mlp(s, static_cast<int64_t>(i));
      continue;
    }
    AddNormArgs norm;
    norm.residual = ptr<float>(s.residual);
    norm.add = take_branch(s);  // the previous layer's MLP output, if not added in its GEMM
    norm.weight = ptr<float>(layer.input_norm);
    norm.out = s.x.data();
    norm.out_dtype = s.compute;
    norm.rows = t;
    norm.dim = hidden;
    norm.eps = s.eps;
    add_rms_norm(norm, s.stream);
    timeline_mark(s, "add + input norm");
    if (s.config.is_mla()) {
      mla_attention(s, layer, static_cast<int64_t>(i));
    } else {
      gqa_attention(s, layer, static_cast<int64_t>(i));
    }
    norm.add = take_branch(s);
    norm.weight = ptr<float>(layer.post_norm);
    norm.out_f32 = layer.moe ? ptr<float>(s.x_f32) : nullptr;  // the router's f32 input
    add_rms_norm(norm, s.stream);
    timeline_mark(s, "add + post norm");
    if (layer.moe) {
      moe_mlp(s, *layer.moe);
    } else {
      dense_mlp(s, layer.mlp, s.x.data(), t, nullptr);  // into the residual stream
    }
  }
}

// A graph step's device work: the layers, then the head over all `rows` (padding included) in
// chunks, sampling always launched (specs without `sample` are skipped), no copy to the host.
void enqueue_graph_body(State& s, int64_t rows) {
  enqueue_layers(s);
  const int64_t chunk = std::min(s.max_tokens, kLogitChunk);
  for (int64_t start = 0; start < rows; start += chunk) {
    enqueue_head_chunk(s, start, std::min(chunk, rows - start), /*sample=*/true);
  }
}


// Model::last_device_timing of a step whose events have completed: its span (call -> done) and
// the device's idle gap since the last step waited for (s.last_done; 0 when the call's event
// was reached before that step ended, as with overlap scheduling).
void record_timing(State& s, cudaEvent_t call, cudaEvent_t done, bool graph) {
  Model::DeviceTiming timing;
  float ms = 0;
  PA_CUDA_CHECK(cudaEventElapsedTime(&ms, call, done));
  timing.span_seconds = ms * 1e-3;
  if (s.last_done != nullptr) {
    PA_CUDA_CHECK(cudaEventElapsedTime(&ms, s.last_done, call));
    timing.gap_seconds = std::max(0.0f, ms) * 1e-3;
  }
  timing.graph = graph;
  s.timing = timing;
}

// Captures graph `index` (the step now in s: its padded size, metadata and pool) on the idle
// stream. A capture the driver refuses turns graphs off for this model, with one line on stderr:
// the step it follows has already run eagerly, and the next steps run eagerly too.
void capture_graph(State& s, size_t index, int64_t rows) {
  State::Graph& graph = s.graphs[index];
  if (graph.exec != nullptr) {
    PA_CUDA_CHECK(cudaGraphExecDestroy(graph.exec));
    graph.exec = nullptr;
  }
  cudaGraph_t captured = nullptr;
  std::string failure;
  // The labels of the step that just ran stay the model's (last_timeline); the graph's own are
  // the capture's (the same sequence).
  std::vector<const char*> ran = std::move(s.timeline_labels);
  s.timeline_labels.clear();
  PA_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_graph_body(s, rows);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  graph.timeline_labels = std::exchange(s.timeline_labels, std::move(ran));
  cudaError_t status = cudaStreamEndCapture(s.stream, &captured);
  if (failure.empty() && status != cudaSuccess) failure = cudaGetErrorString(status);
  if (failure.empty()) {
    status = cudaGraphInstantiate(&graph.exec, captured, 0);
    if (status != cudaSuccess) failure = cudaGetErrorString(status);
  }
  if (captured != nullptr) cudaGraphDestroy(captured);
  if (!failure.empty()) {
    cudaGetLastError();
    graph.exec = nullptr;
    fmt::print(stderr,
               "pagedattn: CUDA graph capture of a {}-request decode step failed ({}); "
               "decode steps run eagerly from now on\n",
               s.graph_sizes[index], failure);
    for (State::Graph& other : s.graphs) {
      if (other.exec != nullptr) cudaGraphExecDestroy(other.exec);
      other = State::Graph{};
    }
    s.graph_sizes.clear();
    s.graphs.clear();
    return;
  }
  graph.workspace_generation = s.planner.workspace_generation();
  graph.buffers_generation = s.buffers_generation;
  graph.pool = s.pool->id();
  ++s.graph_captures;
}

}  // namespace

Logits CudaModel::forward(const Step& step, KvPool& pool) { return run(step, pool, false); }

void CudaModel::launch(const Step& step, KvPool& pool) { run(step, pool, true); }

void CudaModel::collect(std::span<ops::SampledToken> tokens) {
  State& s = *state_;
  PA_CHECK(s.num_collected < s.num_launched, "collect: no step launched");
  PA_CUDA_CHECK(cudaSetDevice(s.device.index));
  State::Launch& launch = s.launches[s.num_collected % 3];
  PA_CHECK(static_cast<int64_t>(tokens.size()) == launch.rows,
           "collect: {} outputs for a step of {} logits rows", tokens.size(), launch.rows);
  PA_CUDA_CHECK(cudaEventSynchronize(launch.done));
  ++s.num_collected;
  // What the attention kernels recorded of the metadata they took on trust (backend.h); the
  // planner's metadata is checked on the host, so this never fires unless something is broken.
  s.planner.check_device_errors();
  record_timing(s, launch.call, launch.done, launch.graph);
  s.last_done = launch.done;
  std::copy(launch.tokens, launch.tokens + launch.rows, tokens.begin());
  for (size_t r = 0; r < tokens.size(); ++r) {
    PA_CHECK(tokens[r].token >= 0,
             "sampling: logits row {}: every logit is -inf or NaN (nothing to sample)", r);
  }
}

Logits CudaModel::run(const Step& step, KvPool& pool, bool launch) {
  State& s = *state_;
  PA_CUDA_CHECK(cudaSetDevice(s.device.index));
  const int64_t uncollected = s.num_launched - s.num_collected;
  PA_CHECK(launch || uncollected == 0,
           "forward: {} launched steps are not collected (Model::collect)", uncollected);
  PA_CHECK(uncollected < 2, "launch: two launched steps are not collected (Model::collect)");
  State::Launch& slot = s.launches[s.num_launched % 3];
  // A forward finds the stream idle (every forward ends synchronised): the event takes the time
  // of the call. A launch may find the previous step still running: its event marks when the
  // device could start this one.
  PA_CUDA_CHECK(cudaEventRecord(launch ? slot.call : s.call_event, s.stream));
  int64_t total = 0;
  for (const RequestStep& request : step.requests)
    total += static_cast<int64_t>(request.tokens.size());
  PA_CHECK(total <= s.max_tokens,
           "step: {} new tokens, more than this model's max_step_tokens {} "
           "(ModelOptions::max_step_tokens)",
           total, s.max_tokens);
  PA_CHECK(pool.device() == s.device, "step: the KV pool is on {}, the model on {}",
           pool.device().str(), s.device.str());
  // q, the attention output and MLA's latent q / o in the pool's dtype (over an fp8 pool: the
  // compute dtype, bf16 for an f32 model).
  s.ensure_attention_buffers(s.planner.query_dtype(pool));
  // A decode step within the graph sizes is padded to its graph's size (graph_batch).
  const int32_t padded = graph_batch(s, step, pool);
  // Validates the step (nothing is enqueued before), copies the metadata, plans the attention.
  const StepContext& ctx = s.planner.prepare(step, pool, s.rope, padded);
  const std::span<const int32_t> ids = s.planner.token_ids();
  for (size_t i = 0; i < ids.size(); ++i) {
    // A launched step's pending token -(r + 1): row r of the step launched before it.
    if (launch && ids[i] < 0) {
      PA_CHECK(-static_cast<int64_t>(ids[i]) - 1 < s.previous_launch_rows,
               "token id {} at index {}: row {} of the previous launch, which had {} rows", ids[i],
               i, -static_cast<int64_t>(ids[i]) - 1, s.previous_launch_rows);
      continue;
    }
    PA_CHECK(ids[i] >= 0 && ids[i] < s.config.vocab_size,
             "token id {} at index {} is outside the vocabulary [0, {})", ids[i], i,
             s.config.vocab_size);
  }
  // Step::sampling (one valid entry per logits row: checked by prepare()) as the kernel reads it.
  const bool sampling = !step.sampling.empty();
  auto sampled_on_device = [&](int64_t r) {
    return sampling && r < static_cast<int64_t>(step.sampling.size()) &&
           step.sampling[static_cast<size_t>(r)].sample;
  };
  // The logits rows: the step's (logit_rows), or in a padded step every row, padding included
  // (the graph computes them all; only the first `num_rows` are the step's).
  const std::vector<int64_t>& rows = s.planner.logit_rows(step);
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  const int64_t head_rows = padded > 0 ? padded : num_rows;
  const int64_t n = static_cast<int64_t>(step.sampling.size());
  PA_CHECK(!launch || (n == num_rows && std::all_of(step.sampling.begin(), step.sampling.end(),
                                                    [](const auto& row) { return row.sample; })),
           "launch: every logits row must be sampled on the device ({} rows, {} sampling entries)",
           num_rows, n);
  int64_t sampled_rows = 0;
  if (sampling) {
    PA_CHECK(s.config.vocab_size <= kMaxSampledVocab,
             "step: sampling on the device holds vocabularies up to {}, the model's is {}",
             kMaxSampledVocab, s.config.vocab_size);
  }
  if (sampling || padded > 0) {
    s.host_sampling.assign(static_cast<size_t>(head_rows), DeviceRowSampling{});
    for (int64_t r = 0; r < n; ++r) {
      if (!sampled_on_device(r)) continue;
      DeviceRowSampling& spec = s.host_sampling[static_cast<size_t>(r)];
      spec.filter = ops::row_filter(step.sampling[static_cast<size_t>(r)]);
      spec.sample = 1;
      ++sampled_rows;
    }
  }
  const int64_t t = ctx.tokens;
  copy_to_device(s, s.sample_spec.data(), s.host_sampling.data(),
                 sampling || padded > 0 ? head_rows : 0);
  copy_to_device(s, s.token_ids.data(), ids.data(), t);
  copy_to_device(s, s.positions.data(), ctx.positions.data(), t);
  copy_to_device(s, s.slots.data(), ctx.slots.data(), t);
  s.host_logit_rows.assign(rows.begin(), rows.end());
  for (int64_t r = num_rows; r < head_rows; ++r)
    s.host_logit_rows.push_back(static_cast<int32_t>(r));
  copy_to_device(s, s.logit_rows.data(), s.host_logit_rows.data(), head_rows);
  s.tokens = t;
  s.step = &ctx;
  s.pool = &pool;

  // The graph of this size, if it was captured with this step's workspace, buffers and pool.
  size_t graph_index = 0;
  bool replay = false;
  if (padded > 0 && !s.graph_sizes.empty()) {
    graph_index =
        static_cast<size_t>(std::lower_bound(s.graph_sizes.begin(), s.graph_sizes.end(), padded) -
                            s.graph_sizes.begin());
    const State::Graph& graph = s.graphs[graph_index];
    replay = graph.exec != nullptr &&
             graph.workspace_generation == s.planner.workspace_generation() &&
             graph.buffers_generation == s.buffers_generation && graph.pool == pool.id();
  }

  const int64_t vocab = s.config.vocab_size;
  Logits logits;
  logits.rows = num_rows;
  logits.vocab = vocab;
  logits.values.resize(static_cast<size_t>((num_rows - sampled_rows) * vocab));
  const int64_t chunk = std::min(s.max_tokens, kLogitChunk);
  int64_t value_row = 0;
  // The rows of chunk [start, start + count) left to the host, a run of consecutive ones per copy.
  // Into pageable memory: returns when the copy is done (a later GEMM overwrites the buffer).
  const auto copy_rows_out = [&](int64_t start, int64_t count) {
    for (int64_t r = 0; r < count;) {
      if (sampled_on_device(start + r)) {
        ++r;
        continue;
      }
      int64_t end = r + 1;
      while (end < count && !sampled_on_device(start + end)) ++end;
      PA_CUDA_CHECK(cudaMemcpyAsync(logits.values.data() + value_row * vocab,
                                    ptr<float>(s.logits) + r * vocab,
                                    static_cast<size_t>((end - r) * vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, s.stream));
      value_row += end - r;
      r = end;
    }
  };
  s.timeline_labels.clear();
  if (padded > 0) {
    // One head pass over the padded rows (graph_batch: one chunk, or every row sampled), then the
    // step's rows out.
    if (replay) {
      PA_CUDA_CHECK(cudaGraphLaunch(s.graphs[graph_index].exec, s.stream));
      s.timeline_labels = s.graphs[graph_index].timeline_labels;
    } else {
      enqueue_graph_body(s, head_rows);
    }
    if (num_rows - sampled_rows > 0) copy_rows_out(0, num_rows);
  } else {
    enqueue_layers(s);
    // The rows asked for, in chunks: with Step::sampling, the sampled rows of each chunk are drawn
    // on the device (sampling.cu) and only the other rows' logits are copied back.
    for (int64_t start = 0; start < num_rows; start += chunk) {
      const int64_t count = std::min(chunk, num_rows - start);
      enqueue_head_chunk(s, start, count, sampling);
      copy_rows_out(start, count);
    }
  }
  if (launch) {
    // The tokens into this launch's pinned slot; collect() waits for them.
    if (n > 0) {
      PA_CUDA_CHECK(cudaMemcpyAsync(slot.tokens, s.sampled.data(),
                                    static_cast<size_t>(n) * sizeof(ops::SampledToken),
                                    cudaMemcpyDeviceToHost, s.stream));
    }
    PA_CUDA_CHECK(cudaEventRecord(slot.done, s.stream));
    slot.rows = n;
    slot.graph = replay;
    ++s.num_launched;
    s.previous_launch_rows = n;
    if (replay) ++s.graph_replays;
    // A size's first step was enqueued eagerly (above): its graph is captured now for the next
    // one (capture enqueues nothing, so the running step is not disturbed).
    if (padded > 0 && !replay && !s.graph_sizes.empty()) capture_graph(s, graph_index, head_rows);
    s.step = nullptr;
    s.pool = nullptr;
    return logits;
  }
  s.previous_launch_rows = 0;
  if (sampling && n > 0) {
    logits.sampled.resize(static_cast<size_t>(n));
    PA_CUDA_CHECK(cudaMemcpyAsync(logits.sampled.data(), s.sampled.data(),
                                  static_cast<size_t>(n) * sizeof(ops::SampledToken),
                                  cudaMemcpyDeviceToHost, s.stream));
  }
  PA_CUDA_CHECK(cudaEventRecord(s.done_event, s.stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  s.planner.check_device_errors();  // as in collect()
  record_timing(s, s.call_event, s.done_event, replay);
  std::swap(s.done_event, s.previous_done_event);
  s.last_done = s.previous_done_event;
  if (replay) ++s.graph_replays;
  // A size's first step ran eagerly (above): capture its graph for the next one, on the idle
  // stream (capture enqueues nothing).
  if (padded > 0 && !replay && !s.graph_sizes.empty()) capture_graph(s, graph_index, head_rows);
  s.step = nullptr;
  s.pool = nullptr;
  for (int64_t r = 0; sampling && r < n; ++r) {
    if (!sampled_on_device(r)) {
      logits.sampled[static_cast<size_t>(r)] = ops::SampledToken{};  // the kernel skipped it
      continue;
    }
    PA_CHECK(logits.sampled[static_cast<size_t>(r)].token >= 0,
             "sampling: logits row {}: every logit is -inf or NaN (nothing to sample)", r);
  }
  return logits;
}

}  // namespace pagedattn::model::cuda
