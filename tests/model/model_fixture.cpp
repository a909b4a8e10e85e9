#include "model/model_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/test_util.h"

namespace pagedattn::model::testing {

namespace fs = std::filesystem;

namespace {

// tests/data: PAGEDATTN_TEST_DATA when set (binaries built elsewhere: scripts/gpu-check
// --prebuilt), else found from this file's path.
fs::path test_data_dir() {
  if (const char* dir = std::getenv("PAGEDATTN_TEST_DATA"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return fs::path(__FILE__).parent_path().parent_path() / "data";
}

}  // namespace

std::vector<std::string> fixture_names() {
  return {
      "llama3_bf16",      "llama_linear_f16_sharded", "qwen2_f32", "qwen3_bf16", "deepseek_v2_f16",
      "deepseek_v3_bf16", "deepseek_v3_mla512_bf16"};
}

Fixture Fixture::load(const std::string& name) {
  Fixture f;
  f.name = name;
  f.directory = test_data_dir() / "model" / name;
  std::ifstream json_file(f.directory / "expected.json");
  if (!json_file)
    throw std::runtime_error("missing fixture " + (f.directory / "expected.json").string());
  const nlohmann::json expected = nlohmann::json::parse(json_file);
  f.vocab = expected.at("vocab_size").get<int64_t>();
  f.softmax_scale = expected.at("softmax_scale").get<double>();
  int64_t row = 0;
  for (size_t p = 0; p < expected.at("prompts").size(); ++p) {
    FixturePrompt prompt;
    const auto& tokens = expected.at("tokens")[p];
    prompt.prompt = tokens.at("prompt").get<std::vector<int32_t>>();
    prompt.generated = tokens.at("generated").get<std::vector<int32_t>>();
    prompt.next_token = tokens.at("next_token").get<int32_t>();
    prompt.first_row = row;
    row += expected.at("prompts")[p].at("prefill_rows").get<int64_t>() +
           expected.at("prompts")[p].at("decode_rows").get<int64_t>();
    f.prompts.push_back(std::move(prompt));
  }
  f.logits.resize(static_cast<size_t>(row * f.vocab));
  std::ifstream logits_file(f.directory / "expected_logits.f32", std::ios::binary);
  logits_file.read(reinterpret_cast<char*>(f.logits.data()),
                   static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  if (!logits_file) throw std::runtime_error("short fixture logits in " + f.directory.string());
  return f;
}

PageSource::PageSource(int64_t num_pages, uint64_t seed) {
  for (int64_t p = 0; p < num_pages; ++p) free_.push_back(static_cast<int32_t>(p));
  std::shuffle(free_.begin(), free_.end(), std::mt19937_64(seed));
}

int32_t PageSource::take() {
  if (free_.empty()) throw std::runtime_error("test page source: out of pages");
  const int32_t page = free_.back();
  free_.pop_back();
  return page;
}

void Sequence::reserve(int64_t total, int32_t alloc_page_size, PageSource& pages) {
  while (static_cast<int64_t>(block_table.size()) * alloc_page_size < total) {
    block_table.push_back(pages.take());
  }
}

std::vector<std::vector<float>> run_sequence(Model& model, KvPool& pool, PageSource& pages,
                                             std::span<const int32_t> prompt,
                                             std::span<const int32_t> decode_tokens,
                                             int64_t chunk) {
  std::vector<std::vector<float>> rows;
  Sequence seq;
  const auto feed = [&](std::span<const int32_t> tokens, bool all_rows) {
    seq.reserve(static_cast<int64_t>(seq.tokens.size() + tokens.size()), pool.alloc_page_size(),
                pages);
    Step step;
    step.rows = all_rows ? LogitsRows::kAll : LogitsRows::kLastOfEachRequest;
    step.requests.push_back({tokens, static_cast<int32_t>(seq.tokens.size()), {}, seq.block_table});
    const Logits logits = model.forward(step, pool);
    for (int64_t r = 0; r < logits.rows; ++r) {
      rows.emplace_back(logits.row(r).begin(), logits.row(r).end());
    }
    seq.tokens.insert(seq.tokens.end(), tokens.begin(), tokens.end());
  };
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t step_size = chunk > 0 ? chunk : n;
  for (int64_t start = 0; start < n; start += step_size) {
    feed(prompt.subspan(static_cast<size_t>(start),
                        static_cast<size_t>(std::min(step_size, n - start))),
         true);
  }
  for (size_t i = 0; i < decode_tokens.size(); ++i) feed(decode_tokens.subspan(i, 1), false);
  return rows;
}

RandomWeights::RandomWeights(const ModelConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  NamedTensorSource source;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    HostTensor tensor(DType::kBF16, {});
    const std::vector<int64_t>& shape = t.shape;
    if (shape.size() == 1) tensor = HostTensor(DType::kBF16, {shape[0]});
    if (shape.size() == 2) tensor = HostTensor(DType::kBF16, {shape[0], shape[1]});
    if (shape.size() == 3) tensor = HostTensor(DType::kBF16, {shape[0], shape[1], shape[2]});
    const bool norm = t.name.find("norm") != std::string::npos;
    const float scale = norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(shape.back()));
    pagedattn::testing::fill_uniform(tensor.view(), rng, (norm ? 1.0f : 0.0f) - scale,
                                     (norm ? 1.0f : 0.0f) + scale);
    index[t.name] = storage.size();
    source.names.push_back(t.name);
    storage.push_back(std::move(tensor));
  }
  source.find = [this](std::string_view name) {
    const auto it = index.find(std::string(name));
    return it == index.end() ? TensorView{} : storage[it->second].view();
  };
  source.where = [](std::string_view) { return std::string("random"); };
  source.label = "random weights";
  weights = bind_model_weights(config, source);
}

void RandomWeights::scale(const std::string& name, float factor) {
  const HostTensor& tensor = storage.at(index.at(name));
  auto* values = tensor.data<uint16_t>();  // bf16
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    values[i] = float_to_bf16(bf16_to_float(values[i]) * factor);
  }
}

ModelConfig load_hub_config(const std::string& file) {
  const fs::path path = test_data_dir() / "model" / "configs" / file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing config " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), file);
}

std::vector<double> log_softmax(std::span<const float> logits) {
  double max = -INFINITY, sum = 0;
  for (float v : logits) max = std::max(max, double{v});
  for (float v : logits) sum += std::exp(v - max);
  std::vector<double> out;
  for (float v : logits) out.push_back(v - max - std::log(sum));
  return out;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

bool in_top_k(std::span<const float> logits, int32_t token, int k) {
  int larger = 0;
  for (float v : logits) larger += v > logits[static_cast<size_t>(token)];
  return larger < k;
}

}  // namespace pagedattn::model::testing
