// The offline throughput benchmark's workload: a JSON file of per-request prompt and output
// lengths (bench/workloads/nano-vllm-offline.json: nano-vllm's bench.py, 256 requests whose
// lengths Python's random.seed(0) draws), turned into the requests the engine runs: prompts of
// random token ids in [0, max_token_id] from a fixed seed (nano-vllm draws them with
// randint(0, 10000)), max_tokens = the output length, every output to its full length
// (ignore_eos). Plain C++ over nlohmann/json: also compiled into test_tools.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pagedattn::tools {

struct Workload {
  std::string source;       // the file, for messages
  std::string description;  // its "description" (may be empty)
  std::vector<int32_t> input_lens;
  std::vector<int32_t> output_lens;
};

// Reads {"input_lens": [...], "output_lens": [...], "description": "..."}. Throws Error naming the
// file and the problem: unreadable, not JSON, a missing or non-array field, arrays of different
// lengths, an empty workload, a length that is not an integer in [1, 2^31).
Workload load_workload(const std::filesystem::path& path);
// Parses the same from text (`source` names it in errors).
Workload parse_workload(const std::string& text, const std::string& source);

// `given` when set, else nano-vllm's workload: the source tree's copy (PAGEDATTN_DEFAULT_WORKLOAD,
// set for the CLI) or ./bench/workloads/nano-vllm-offline.json. Throws Error when neither exists.
std::filesystem::path resolve_workload(const std::string& given);

struct WorkloadSelection {
  int32_t requests = 0;        // the first N requests; 0: all
  int32_t max_input_len = 0;   // > 0: prompts cut to this many tokens
  int32_t max_output_len = 0;  // > 0: outputs cut to this many tokens
  uint64_t seed = 0;           // the prompts' token ids
  int32_t max_token_id = 10000;
};

struct WorkloadRequests {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> output_lens;  // each request's max_tokens (and exact output length)
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};

// The selected requests. Throws Error naming the option for requests beyond the workload or a
// negative value. Prompt ids: mt19937_64(seed), id = draw % (max_token_id + 1), request by
// request, the same for any cap (a cut prompt is the first tokens of the uncut one).
WorkloadRequests select_requests(const Workload& workload, const WorkloadSelection& selection);

}  // namespace pagedattn::tools
