// Test support for the model runtime: the transformers fixtures under tests/data/model/ (see its
// README.md: tiny random checkpoints and transformers 5.17's float32 logits), a page allocator
// that hands out shuffled page ids, and a runner that feeds a prompt (in chunks) and then the
// fixture's greedy tokens as decode steps, collecting the logits of every row.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/checkpoint.h"
#include "pagedattn/model.h"

namespace pagedattn::model::testing {

struct FixturePrompt {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;  // 32 greedy tokens
  int32_t next_token = 0;          // argmax of the last decode row
  int64_t first_row = 0;           // its first row in the logits file
};

struct Fixture {
  std::string name;
  std::filesystem::path directory;
  int64_t vocab = 0;
  double softmax_scale = 0;
  std::vector<FixturePrompt> prompts;
  std::vector<float> logits;  // [rows, vocab]

  static Fixture load(const std::string& name);
  std::span<const float> row(int64_t r) const {
    return {logits.data() + r * vocab, static_cast<size_t>(vocab)};
  }
};

std::vector<std::string> fixture_names();

// ModelOptions that keep the model on the CPU (the CPU tests' model, whatever the machine has).
inline ModelOptions cpu_options() {
  ModelOptions options;
  options.device = "cpu";
  return options;
}

// Hands out page ids in a shuffled order, so that block tables are never contiguous runs.
class PageSource {
 public:
  PageSource(int64_t num_pages, uint64_t seed);
  int32_t take();

 private:
  std::vector<int32_t> free_;
};

// One request as an engine tracks it: its tokens so far and its block table.
struct Sequence {
  std::vector<int32_t> tokens;  // every token fed so far (cached)
  std::vector<int32_t> block_table;
  // Grows the block table to hold `total` tokens.
  void reserve(int64_t total, int32_t alloc_page_size, PageSource& pages);
};

// Feeds `prompt` in chunks of `chunk` tokens (0: one prefill), then each of `decode_tokens` as a
// decode step; returns the logits of every prompt row and every decode row, [rows][vocab].
std::vector<std::vector<float>> run_sequence(Model& model, KvPool& pool, PageSource& pages,
                                             std::span<const int32_t> prompt,
                                             std::span<const int32_t> decode_tokens,
                                             int64_t chunk = 0);

// Random bf16 weights for every tensor `config` expects (norm weights uniform in 1 +- 0.1, the
// rest uniform in +-1/sqrt(fan_in)), bound as a checkpoint's would be. Not movable: the bound
// views point into `storage`.
struct RandomWeights {
  explicit RandomWeights(const ModelConfig& config, uint64_t seed = 1);
  RandomWeights(const RandomWeights&) = delete;
  RandomWeights& operator=(const RandomWeights&) = delete;
  // Multiplies every element of tensor `name` by `factor` (e.g. sharper logits from lm_head).
  void scale(const std::string& name, float factor);
  std::vector<HostTensor> storage;
  std::map<std::string, size_t> index;
  ModelWeights weights;
};

// A real hub config of tests/data/model/configs/ (e.g. "qwen3_0_6b.json"), parsed.
ModelConfig load_hub_config(const std::string& file);

// log_softmax of a row, in float64.
std::vector<double> log_softmax(std::span<const float> logits);
int32_t argmax(std::span<const float> logits);
// Whether `token` is among the k largest of `logits`.
bool in_top_k(std::span<const float> logits, int32_t token, int k);

}  // namespace pagedattn::model::testing
