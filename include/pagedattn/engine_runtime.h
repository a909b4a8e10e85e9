// The engine over a real model: a Hugging Face model directory (its checkpoint) becomes a
// ModelRunner for the Engine, with the directory's generation_config.json as default sampling
// parameters. The tokenizer's incremental decoder as the engine's detokenizer:
// engine_detokenizer.h.
//
// ModelRuntime owns the memory-mapped checkpoint (or random weights in host memory: random()), the
// Model built over it and the KV pool whose pages the engine's block tables index (one pool for
// all layers; allocation page size = the engine's page size). forward() turns the engine's
// StepPlan into the model's Step: the sequence's cached length is StepPlan's first_position, and
// only the sequences that want logits (RequestStep::wants_logits) get their last rows
// (RequestStep::num_logit_rows: one, or every row of a prompt-scoring chunk) through the final
// norm and lm_head; with forward_sampled, the rows the engine marks are sampled by the model
// (Step::sampling) and only their tokens come back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/engine_model_runner.h"
#include "pagedattn/engine_stop.h"
#include "pagedattn/model.h"

namespace pagedattn::engine {

struct RuntimeOptions {
  model::ModelOptions model;          // model.device: where the model and its KV pool live
  int32_t page_size = 16;             // allocation page size (the engine's and the prefix cache's)
  int32_t attention_page_size = 0;    // the kernels' page size P (divides page_size); 0: = page_size
  DType kv_dtype = DType::kBF16;
  int64_t num_pages = 0;              // > 0: exactly this many pages
  // else, on a CUDA device with kv_memory_fraction in (0, 1): as many pages as fit in that
  // fraction of the device memory free once the model is loaded,
  double kv_memory_fraction = 0;
  int64_t kv_bytes = 256ll << 20;     // else as many pages as fit in this many bytes,
  int32_t max_sequences = 0;          // > 0: but no more than this many full-length sequences need
  int64_t max_pages = 0;              // > 0: and no more than this many pages
  // Whether the engine should hand the rows the model can sample to it (prefers_model_sampling):
  // unset: when the model is on a GPU (only tokens come back instead of every logits row).
  std::optional<bool> model_sampling;
};

class ModelRuntime final : public ModelRunner {
 public:
  // Opens DIR (config.json + safetensors). Throws Error naming the file and the problem.
  static std::unique_ptr<ModelRuntime> open(const std::filesystem::path& directory,
                                            const RuntimeOptions& options = {});
  // A model of `config` with random bf16 weights made in host memory (model::random_weights; no
  // checkpoint, no tokenizer: token ids in, token ids out), e.g. a named shape of
  // model::model_shape() for the throughput benchmark. Throws Error as open() does.
  static std::unique_ptr<ModelRuntime> random(const model::ModelConfig& config, uint64_t seed,
                                              const RuntimeOptions& options = {});
  ~ModelRuntime() override;

  int32_t vocab_size() const override;
  void forward(const StepPlan& plan, std::span<float> logits) override;
  // Step::sampling: the rows drawn where the model runs (the CUDA kernel, or ops::RowSampler).
  bool prefers_model_sampling() const override;
  void forward_sampled(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                       std::span<float> logits, std::span<ops::SampledToken> sampled) override;
  // Overlap scheduling: on CUDA, Model::launch / collect (the device resolves pending tokens and
  // the host never waits for a step before launching the next); on the CPU the default (the step
  // runs at launch, so there is nothing to overlap: supports_overlap is false there).
  bool supports_overlap() const override;
  void launch(const StepPlan& plan, std::span<const ops::RowSampling> sampling) override;
  void collect(std::span<ops::SampledToken> sampled) override;

  const model::ModelConfig& config() const;
  const model::Model& model() const;
  model::Model& model();  // its diagnostics (Model::set_timeline)
  const model::KvPool& pool() const;
  Device device() const;            // the model's (and the pool's)
  int64_t max_step_tokens() const;  // Model::max_step_tokens (0: no bound)
  int64_t weight_bytes() const;
  // An EngineConfig for this model: the pool's pages and page size, the model length, the EOS
  // ids of config.json (and generation_config.json when present), and a token budget per step
  // within what the model's buffers hold (Model::max_step_tokens on CUDA).
  EngineConfig engine_config() const;

 private:
  struct State;
  explicit ModelRuntime(std::unique_ptr<State> state);
  // The plan as the model's Step (views of the plan's vectors).
  model::Step model_step(const StepPlan& plan, std::span<const ops::RowSampling> sampling) const;
  void run(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
           std::span<float> logits, std::span<ops::SampledToken> sampled);
  std::unique_ptr<State> state_;
};

// Default sampling parameters from DIR/generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty, do_sample false -> greedy); `params` unchanged where the file says nothing
// or is absent. Throws Error for a malformed file.
void apply_generation_config(const std::filesystem::path& directory, SamplingParams& params);

}  // namespace pagedattn::engine
