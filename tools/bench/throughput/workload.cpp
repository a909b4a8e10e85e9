// The throughput benchmark's workload file and requests (see workload.h).
#include "tools/bench/throughput/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "pagedattn/error.h"

#ifndef PAGEDATTN_DEFAULT_WORKLOAD
#define PAGEDATTN_DEFAULT_WORKLOAD "bench/workloads/nano-vllm-offline.json"
#endif

namespace pagedattn::tools {

std::filesystem::path resolve_workload(const std::string& given) {
  if (!given.empty()) return given;
  for (const std::filesystem::path& candidate :
       {std::filesystem::path(PAGEDATTN_DEFAULT_WORKLOAD),
        std::filesystem::path("bench/workloads/nano-vllm-offline.json")}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  throw Error(
      fmt::format("the workload is not at {} nor at ./bench/workloads/nano-vllm-offline.json: pass "
                  "--workload FILE",
                  PAGEDATTN_DEFAULT_WORKLOAD));
}
namespace {

std::vector<int32_t> lengths(const nlohmann::json& document, const char* key,
                             const std::string& source) {
  if (!document.contains(key) || !document[key].is_array()) {
    throw Error(fmt::format("{}: \"{}\" is missing or not an array of lengths", source, key));
  }
  std::vector<int32_t> out;
  const nlohmann::json& values = document[key];
  for (size_t i = 0; i < values.size(); ++i) {
    const nlohmann::json& v = values[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw Error(fmt::format("{}: {}[{}] is {} (expected an integer length >= 1)", source, key, i,
                              v.dump()));
    }
    out.push_back(v.get<int32_t>());
  }
  return out;
}

}  // namespace

Workload parse_workload(const std::string& text, const std::string& source) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  if (!document.is_object()) {
    throw Error(fmt::format("{}: expected a JSON object with input_lens and output_lens", source));
  }
  Workload workload;
  workload.source = source;
  if (document.contains("description") && document["description"].is_string()) {
    workload.description = document["description"].get<std::string>();
  }
  workload.input_lens = lengths(document, "input_lens", source);
  workload.output_lens = lengths(document, "output_lens", source);
  if (workload.input_lens.size() != workload.output_lens.size()) {
    throw Error(fmt::format("{}: {} input_lens but {} output_lens (one of each per request)",
                            source, workload.input_lens.size(), workload.output_lens.size()));
  }
  if (workload.input_lens.empty()) throw Error(fmt::format("{}: no requests", source));
  return workload;
}

Workload load_workload(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("workload {}: cannot open the file", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return parse_workload(text.str(), path.string());
}

WorkloadRequests select_requests(const Workload& workload, const WorkloadSelection& selection) {
  const int64_t available = static_cast<int64_t>(workload.input_lens.size());
  if (selection.requests < 0 || selection.requests > available) {
    throw Error(fmt::format("--requests {}: the workload {} has {} requests (0: all of them)",
                            selection.requests, workload.source, available));
  }
  if (selection.max_input_len < 0) {
    throw Error(
        fmt::format("--max-input-len {} (expected >= 1, or 0: no cap)", selection.max_input_len));
  }
  if (selection.max_output_len < 0) {
    throw Error(
        fmt::format("--max-output-len {} (expected >= 1, or 0: no cap)", selection.max_output_len));
  }
  if (selection.max_token_id < 0) {
    throw Error(fmt::format("--max-token-id {} (expected >= 0)", selection.max_token_id));
  }
  const int64_t n = selection.requests == 0 ? available : selection.requests;
  WorkloadRequests out;
  std::mt19937_64 rng(selection.seed);
  const uint64_t ids = static_cast<uint64_t>(selection.max_token_id) + 1;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t full_input = workload.input_lens[static_cast<size_t>(r)];
    std::vector<int32_t> prompt(static_cast<size_t>(full_input));
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % ids);  // drawn before any cut
    if (selection.max_input_len > 0 && full_input > selection.max_input_len) {
      prompt.resize(static_cast<size_t>(selection.max_input_len));
    }
    int32_t output = workload.output_lens[static_cast<size_t>(r)];
    if (selection.max_output_len > 0) output = std::min(output, selection.max_output_len);
    out.prompt_tokens += static_cast<int64_t>(prompt.size());
    out.output_tokens += output;
    out.prompts.push_back(std::move(prompt));
    out.output_lens.push_back(output);
  }
  return out;
}

}  // namespace pagedattn::tools
