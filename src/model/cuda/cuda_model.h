// The model runtime on a CUDA device (what Model runs when its device is cuda:N; model.h says
// what it computes). Host API with no CUDA types, so that model.cpp stays plain C++; compiled only
// in CUDA builds (src/model/cuda/ is left out of CPU builds).
//
//   weights   uploaded once per tensor into device memory (weights.h), in the compute dtype;
//   a step    the shared host planner (forward_step.h) validates it and builds the metadata, which
//             is copied to fixed device buffers before Backend::plan; token ids, positions and
//             slots likewise; then embedding, the decoder layers (layers.cpp: cuBLAS GEMMs, small
//             kernels, the CUDA attention backends) and the final norm + lm_head on the rows
//             asked for, all enqueued on the model's stream; the logits come back as f32, or for
//             the rows Step::sampling marks, only the token sampling.cu drew and its logprob.
//   memory    activations in device buffers sized at construction for max_step_tokens tokens;
//             nothing is allocated per step except when a step needs more attention pages or a
//             larger batch than any before (the metadata buffers grow).
//
//   graphs    a decode step of a model without MoE layers (ModelOptions::cuda_graph_max_batch)
//             is padded to the next graph size (1, 2, 4, 8, 16, 32, 48, ...; padding rows store
//             nothing and attend to nothing) and, from that size's second step on, replays one
//             CUDA graph from embedding to the sampling kernel: the host only copies the step's
//             ids, positions, slots, metadata and sampling specs into the fixed buffers and plans
//             the attention (a device kernel) before the launch. MoE layers route on the host
//             (the router logits come back once per MoE layer: a synchronisation), so those models
//             run eagerly until routing and a grouped expert GEMM run on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "pagedattn/backend.h"
#include "pagedattn/model.h"

namespace pagedattn::model::cuda {

// Whether `device` (cuda:N) can run a model here; if not, why.
Support device_usable(Device device);

// `bytes` of zeroed device memory on `device` (cudaFree'd with the last reference). Throws Error
// naming `what` and the sizes when the allocation fails.
std::shared_ptr<void> allocate_device_memory(int64_t bytes, Device device, std::string_view what);

class CudaModel {
 public:
  // Uploads the weights and sizes the activation buffers. Throws Error naming the tensor or the
  // option for anything it cannot run (and on an allocation failure, with the sizes).
  CudaModel(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& options,
            Device device);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  Logits forward(const Step& step, KvPool& pool);
  // Model::launch / collect (model.h).
  void launch(const Step& step, KvPool& pool);
  void collect(std::span<ops::SampledToken> tokens);
  int64_t device_bytes() const;
  int64_t max_step_tokens() const;
  DType compute_dtype() const;
  int64_t free_device_bytes() const;  // cudaMemGetInfo on the model's device
  // Model::last_device_timing (model.h): events around the last forward.
  std::optional<Model::DeviceTiming> last_timing() const;
  // Model::set_timeline / last_timeline (model.h).
  void set_timeline(bool on);
  std::vector<Model::TimelineSpan> last_timeline() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  // forward (launch false) or launch: everything up to the results' copy back.
  Logits run(const Step& step, KvPool& pool, bool launch);
};

}  // namespace pagedattn::model::cuda
