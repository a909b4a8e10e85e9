// Loading the real tokenizers and their fixtures for the tests (see real_tokenizers.h).
#include "real_tokenizers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace pagedattn::tokenizer::testing {
namespace {

std::string tokenizers_directory() {
  if (const char* directory = std::getenv("PAGEDATTN_TOKENIZERS")) return directory;
  return PAGEDATTN_TOKENIZERS_DIR;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(file, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<TokenId> ids_of(const nlohmann::json& value) {
  return value.get<std::vector<TokenId>>();
}

}  // namespace

std::string real_tokenizer_directory(const std::string& name) {
  return tokenizers_directory() + "/" + name;
}

const Tokenizer& real_tokenizer(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, Tokenizer> loaded;
  std::lock_guard lock(mutex);
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    it = loaded.emplace(name, Tokenizer::from_directory(tokenizers_directory() + "/" + name)).first;
  }
  return it->second;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> result;
    for (const auto& line : read_jsonl(std::string(PAGEDATTN_TOKENIZER_DATA) + "/corpus.jsonl")) {
      result.push_back(line.get<std::string>());
    }
    return result;
  }();
  return lines;
}

const Fixtures& fixtures(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, Fixtures> loaded;
  std::lock_guard lock(mutex);
  auto it = loaded.find(name);
  if (it != loaded.end()) return it->second;
  Fixtures result;
  auto lines = read_jsonl(std::string(PAGEDATTN_TOKENIZER_DATA) + "/" + name + ".jsonl");
  const auto& texts = corpus();
  if (lines.empty() || lines[0].value("corpus_lines", -1) != static_cast<int>(texts.size())) {
    throw std::runtime_error(name + ".jsonl was not written from this corpus.jsonl");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const nlohmann::json& record = lines[i];
    if (record.contains("random")) {
      result.random.push_back({ids_of(record["random"]), record["d"].get<std::string>(),
                               record["ds"].get<std::string>()});
      continue;
    }
    CorpusCase line;
    line.text = texts.at(result.corpus.size());
    line.ids = ids_of(record["ids"]);
    if (record.contains("ids_special")) {
      line.ids_special = ids_of(record["ids_special"]);
    } else {
      line.ids_special = ids_of(record["special"][0]);
      line.ids_special.insert(line.ids_special.end(), line.ids.begin(), line.ids.end());
      auto suffix = ids_of(record["special"][1]);
      line.ids_special.insert(line.ids_special.end(), suffix.begin(), suffix.end());
    }
    line.decoded = record.value("d", line.text);
    line.decoded_skip = record.value("ds", line.decoded);
    line.decoded_special = record.value("D", line.decoded);
    line.decoded_special_skip = record.value("DS", line.decoded_skip);
    result.corpus.push_back(std::move(line));
  }
  if (result.corpus.size() != texts.size()) {
    throw std::runtime_error(name + ".jsonl: fewer records than corpus lines");
  }
  return loaded.emplace(name, std::move(result)).first->second;
}

std::string format_ids(const std::vector<TokenId>& ids) {
  return fmt::format("[{}]", fmt::join(ids, ", "));
}

}  // namespace pagedattn::tokenizer::testing
