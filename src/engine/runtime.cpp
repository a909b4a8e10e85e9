// ModelRuntime: the engine's ModelRunner over a checkpoint directory (see
// include/pagedattn/engine_runtime.h) and generation_config.json's defaults.
#include "pagedattn/engine_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "pagedattn/checkpoint.h"
#include "pagedattn/model_random.h"

namespace pagedattn::engine {

struct ModelRuntime::State {
  State(std::optional<model::Checkpoint> checkpoint_, std::optional<model::RandomWeights> random_,
        int64_t weight_bytes_, model::Model model_, model::KvPool pool_,
        std::vector<int32_t> extra_eos_)
      : checkpoint(std::move(checkpoint_)),
        random(std::move(random_)),
        weight_bytes(weight_bytes_),
        model(std::move(model_)),
        pool(std::move(pool_)),
        extra_eos(std::move(extra_eos_)) {}
  // What the model's weight views point into (declared before the model: destroyed after it).
  std::optional<model::Checkpoint> checkpoint;  // open(): the memory-mapped files
  std::optional<model::RandomWeights> random;   // random(): host buffers
  int64_t weight_bytes = 0;
  model::Model model;
  model::KvPool pool;
  std::vector<int32_t> extra_eos;  // generation_config.json's eos_token_id
  std::vector<model::RequestStep> requests;
  std::optional<bool> model_sampling;  // RuntimeOptions::model_sampling
};

namespace {

std::optional<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

// An int or a list of ints (config.json's and generation_config.json's eos_token_id).
std::vector<int32_t> token_ids(const nlohmann::json& value, const std::string& where) {
  std::vector<int32_t> ids;
  auto add = [&](const nlohmann::json& v) {
    PA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                 v.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
             "{}: token id {} (expected a non-negative integer)", where, v.dump());
    ids.push_back(v.get<int32_t>());
  };
  if (value.is_array()) {
    for (const auto& v : value) add(v);
  } else if (!value.is_null()) {
    add(value);
  }
  return ids;
}

int64_t pool_pages(const model::ModelConfig& config, const model::Model& model,
                   const RuntimeOptions& options) {
  if (options.num_pages > 0) return options.num_pages;
  const int64_t page_bytes =
      model::KvPool::bytes_per_page(config, options.page_size, options.kv_dtype);
  int64_t budget = options.kv_bytes;
  if (options.kv_memory_fraction != 0 && model.device().type == DeviceType::kCUDA) {
    PA_CHECK(options.kv_memory_fraction > 0 && options.kv_memory_fraction < 1,
             "kv_memory_fraction {} (expected in (0, 1))", options.kv_memory_fraction);
    budget = static_cast<int64_t>(options.kv_memory_fraction *
                                  static_cast<double>(model.free_device_bytes()));
  }
  int64_t pages = budget / page_bytes;
  PA_CHECK(pages >= 1, "KV budget of {} bytes holds no page of {} bytes (page size {})", budget,
           page_bytes, options.page_size);
  if (options.max_sequences > 0) {
    const int64_t per_sequence =
        (config.max_position_embeddings + options.page_size - 1) / options.page_size;
    pages = std::min(pages, options.max_sequences * per_sequence);
  }
  if (options.max_pages > 0) pages = std::min(pages, options.max_pages);
  return std::min<int64_t>(pages, std::numeric_limits<int32_t>::max());
}

}  // namespace

ModelRuntime::ModelRuntime(std::unique_ptr<State> state) : state_(std::move(state)) {}
ModelRuntime::~ModelRuntime() = default;

namespace {

model::KvPool make_pool(const model::Model& model, const RuntimeOptions& options) {
  model::KvPoolConfig pool;
  pool.alloc_page_size = options.page_size;
  pool.page_size = options.attention_page_size;
  pool.dtype = options.kv_dtype;
  pool.num_pages = pool_pages(model.config(), model, options);
  return model.make_kv_pool(pool);
}

}  // namespace

std::unique_ptr<ModelRuntime> ModelRuntime::open(const std::filesystem::path& directory,
                                                 const RuntimeOptions& options) {
  PA_CHECK(options.page_size >= 1, "page_size {} (expected >= 1)", options.page_size);
  model::Checkpoint checkpoint = model::Checkpoint::open(directory);
  model::Model model(checkpoint.config(), checkpoint.weights(), options.model);
  model::KvPool kv_pool = make_pool(model, options);
  std::vector<int32_t> extra_eos;
  if (auto generation = read_json_file(directory / "generation_config.json");
      generation && generation->contains("eos_token_id")) {
    extra_eos = token_ids((*generation)["eos_token_id"],
                          (directory / "generation_config.json").string() + ": eos_token_id");
  }
  const int64_t weight_bytes = checkpoint.weight_bytes();
  auto state = std::make_unique<State>(std::move(checkpoint), std::nullopt, weight_bytes,
                                       std::move(model), std::move(kv_pool), std::move(extra_eos));
  state->model_sampling = options.model_sampling;
  return std::unique_ptr<ModelRuntime>(new ModelRuntime(std::move(state)));
}

std::unique_ptr<ModelRuntime> ModelRuntime::random(const model::ModelConfig& config, uint64_t seed,
                                                   const RuntimeOptions& options) {
  PA_CHECK(options.page_size >= 1, "page_size {} (expected >= 1)", options.page_size);
  model::RandomWeights weights = model::random_weights(config, seed);
  model::Model model(config, weights.weights(), options.model);
  model::KvPool kv_pool = make_pool(model, options);
  const int64_t weight_bytes = weights.bytes();
  auto state =
      std::make_unique<State>(std::nullopt, std::move(weights), weight_bytes, std::move(model),
                              std::move(kv_pool), std::vector<int32_t>{});
  state->model_sampling = options.model_sampling;
  return std::unique_ptr<ModelRuntime>(new ModelRuntime(std::move(state)));
}

int32_t ModelRuntime::vocab_size() const { return static_cast<int32_t>(config().vocab_size); }
const model::ModelConfig& ModelRuntime::config() const { return state_->model.config(); }
const model::Model& ModelRuntime::model() const { return state_->model; }
model::Model& ModelRuntime::model() { return state_->model; }
const model::KvPool& ModelRuntime::pool() const { return state_->pool; }
int64_t ModelRuntime::weight_bytes() const { return state_->weight_bytes; }
Device ModelRuntime::device() const { return state_->model.device(); }
int64_t ModelRuntime::max_step_tokens() const { return state_->model.max_step_tokens(); }

EngineConfig ModelRuntime::engine_config() const {
  const model::ModelConfig& config = this->config();
  EngineConfig engine;
  engine.num_pages = static_cast<int32_t>(state_->pool.num_pages());
  engine.page_size = state_->pool.alloc_page_size();
  engine.max_model_length = config.max_position_embeddings;
  if (const int64_t cap = state_->model.max_step_tokens(); cap > 0) {
    engine.max_tokens_per_step =
        engine.max_tokens_per_step > 0 ? std::min(engine.max_tokens_per_step, cap) : cap;
    engine.max_running = static_cast<int32_t>(std::min<int64_t>(engine.max_running, cap));
  }
  for (int64_t id : config.eos_token_ids) engine.eos_token_ids.push_back(static_cast<int32_t>(id));
  for (int32_t id : state_->extra_eos) {
    if (std::find(engine.eos_token_ids.begin(), engine.eos_token_ids.end(), id) ==
        engine.eos_token_ids.end()) {
      engine.eos_token_ids.push_back(id);
    }
  }
  return engine;
}

void ModelRuntime::forward(const StepPlan& plan, std::span<float> logits) {
  run(plan, {}, logits, {});
}

bool ModelRuntime::prefers_model_sampling() const {
  return state_->model_sampling.value_or(device().type == DeviceType::kCUDA);
}

void ModelRuntime::forward_sampled(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                                   std::span<float> logits, std::span<ops::SampledToken> sampled) {
  PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows &&
               sampled.size() == sampling.size(),
           "forward: {} sampling entries and {} outputs for {} logit rows", sampling.size(),
           sampled.size(), plan.num_logit_rows);
  run(plan, sampling, logits, sampled);
}

void ModelRuntime::run(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                       std::span<float> logits, std::span<ops::SampledToken> sampled) {
  const int64_t vocab = vocab_size();
  PA_CHECK(static_cast<int64_t>(logits.size()) == plan.num_logit_rows * vocab,
           "forward: logits of {} floats for {} rows of vocabulary {}", logits.size(),
           plan.num_logit_rows, vocab);
  PA_CHECK(plan.page_size == state_->pool.alloc_page_size(),
           "forward: the step's page size {} is not the KV pool's {}", plan.page_size,
           state_->pool.alloc_page_size());
  if (plan.sequences.empty()) return;
  const model::Step step = model_step(plan, sampling);
  const model::Logits out = state_->model.forward(step, state_->pool);
  // Only the sequences that want logits had their last rows through the final norm and lm_head:
  // out holds exactly the plan's logit rows, in plan order (values: those not sampled).
  PA_CHECK(out.rows == plan.num_logit_rows && out.vocab == vocab,
           "forward: {} logit rows of {} came back, the plan wants {} of {}", out.rows, out.vocab,
           plan.num_logit_rows, vocab);
  if (sampling.empty()) {
    std::copy(out.values.begin(), out.values.end(), logits.begin());
    return;
  }
  int64_t value_row = 0;
  for (size_t r = 0; r < sampling.size(); ++r) {
    sampled[r] = out.sampled[r];
    if (sampling[r].sample) {
      PA_CHECK(out.sampled[r].token >= 0 && out.sampled[r].token < vocab,
               "forward: row {} sampled token {} (vocabulary {})", r, out.sampled[r].token, vocab);
      continue;
    }
    const std::span<const float> row = out.row(value_row++);
    std::copy(row.begin(), row.end(), logits.begin() + static_cast<ptrdiff_t>(r) * vocab);
  }
  PA_CHECK(value_row == out.value_rows(), "forward: {} logits rows came back for {} unsampled",
           out.value_rows(), value_row);
}

bool ModelRuntime::supports_overlap() const { return state_->model.can_launch(); }

void ModelRuntime::launch(const StepPlan& plan, std::span<const ops::RowSampling> sampling) {
  if (!state_->model.can_launch()) return ModelRunner::launch(plan, sampling);
  PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows,
           "launch: {} sampling entries for {} logit rows", sampling.size(), plan.num_logit_rows);
  PA_CHECK(plan.page_size == state_->pool.alloc_page_size(),
           "launch: the step's page size {} is not the KV pool's {}", plan.page_size,
           state_->pool.alloc_page_size());
  PA_CHECK(!plan.sequences.empty(), "launch: an empty step");
  state_->model.launch(model_step(plan, sampling), state_->pool);
}

void ModelRuntime::collect(std::span<ops::SampledToken> sampled) {
  if (!state_->model.can_launch()) return ModelRunner::collect(sampled);
  state_->model.collect(sampled);
  for (size_t r = 0; r < sampled.size(); ++r) {
    PA_CHECK(sampled[r].token >= 0 && sampled[r].token < vocab_size(),
             "collect: row {} sampled token {} (vocabulary {})", r, sampled[r].token, vocab_size());
  }
}

model::Step ModelRuntime::model_step(const StepPlan& plan,
                                     std::span<const ops::RowSampling> sampling) const {
  model::Step step;
  step.rows = model::LogitsRows::kLastOfEachRequest;
  step.requests.reserve(plan.sequences.size());
  step.sampling.assign(sampling.begin(), sampling.end());
  for (const ScheduledSequence& sequence : plan.sequences) {
    PA_CHECK(sequence.first_position <= std::numeric_limits<int32_t>::max(),
             "forward: sequence {} at position {} (beyond int32)", sequence.sequence,
             sequence.first_position);
    model::RequestStep request;
    request.tokens = sequence.token_ids;
    request.cached_len = static_cast<int32_t>(sequence.first_position);
    request.block_table = sequence.block_table;
    PA_CHECK(sequence.num_logit_rows >= 0 && sequence.num_logit_rows <= sequence.num_new_tokens(),
             "forward: sequence {} wants {} logit rows of {} new tokens", sequence.sequence,
             sequence.num_logit_rows, sequence.num_new_tokens());
    request.wants_logits = sequence.num_logit_rows > 0;
    request.num_logit_rows = std::max(sequence.num_logit_rows, 1);
    step.requests.push_back(request);
  }
  return step;
}

void apply_generation_config(const std::filesystem::path& directory, SamplingParams& params) {
  const std::filesystem::path path = directory / "generation_config.json";
  const std::optional<nlohmann::json> config = read_json_file(path);
  if (!config) return;
  PA_CHECK(config->is_object(), "{}: expected a JSON object", path.string());
  auto number = [&](const char* key, auto& field) {
    if (!config->contains(key) || (*config)[key].is_null()) return;
    PA_CHECK((*config)[key].is_number(), "{}: {} is {} (expected a number)", path.string(), key,
             (*config)[key].dump());
    field = (*config)[key].get<std::decay_t<decltype(field)>>();
  };
  number("temperature", params.temperature);
  number("top_p", params.top_p);
  number("top_k", params.top_k);
  number("min_p", params.min_p);
  number("repetition_penalty", params.repetition_penalty);
  if (config->contains("do_sample") && (*config)["do_sample"].is_boolean() &&
      !(*config)["do_sample"].get<bool>()) {
    params.temperature = 0.0;
  }
}

}  // namespace pagedattn::engine
