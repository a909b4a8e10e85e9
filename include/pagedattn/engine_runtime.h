// The engine over a real model: a Hugging Face model directory (checkpoint + tokenizer) becomes a
// ModelRunner for the Engine, with the tokenizer's incremental decoder as the engine's
// detokenizer and the directory's generation_config.json as default sampling parameters.
//
// ModelRuntime owns the memory-mapped checkpoint (or random weights in host memory: random()), the
// Model built over it and the KV pool whose pages the engine's block tables index (one pool for
// all layers; allocation page size = the engine's page size). forward() turns the engine's
// StepPlan into the model's Step: the sequence's cached length is StepPlan's first_position, and
// only the sequences that want logits (RequestStep::wants_logits) get their last row through the
// final norm and lm_head.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/engine_model_runner.h"
#include "pagedattn/engine_stop.h"
#include "pagedattn/model.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::engine {

struct RuntimeOptions {
  model::ModelOptions model;
  int32_t page_size = 16;             // allocation page size (the engine's and the prefix cache's)
  int32_t attention_page_size = 0;    // the kernels' page size P (divides page_size); 0: = page_size
  DType kv_dtype = DType::kBF16;
  int64_t num_pages = 0;              // > 0: exactly this many pages
  int64_t kv_bytes = 256ll << 20;     // else as many pages as fit in this many bytes,
  int32_t max_sequences = 0;          // > 0: but no more than this many full-length sequences need
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

  const model::ModelConfig& config() const;
  const model::Model& model() const;
  const model::KvPool& pool() const;
  int64_t weight_bytes() const;
  // An EngineConfig for this model: the pool's pages and page size, the model length, the EOS
  // ids of config.json (and generation_config.json when present).
  EngineConfig engine_config() const;

 private:
  struct State;
  explicit ModelRuntime(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The engine's detokenizer over the tokenizer's incremental decoder. The last few prompt tokens
// are fed first (their text dropped), so that a decoder that treats the start of a sequence
// specially (SentencePiece's leading space) sees the generated tokens as a continuation.
DetokenizerFactory make_detokenizer_factory(const tokenizer::Tokenizer& tokenizer,
                                            bool skip_special_tokens = true);

// Default sampling parameters from DIR/generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty, do_sample false -> greedy); `params` unchanged where the file says nothing
// or is absent. Throws Error for a malformed file.
void apply_generation_config(const std::filesystem::path& directory, SamplingParams& params);

}  // namespace pagedattn::engine
