// `pagedattn generate`: one prompt (or one chat) through the engine, the text streamed to the
// terminal as it is produced, then a line of figures (prompt and output tokens, time to first
// token, decode tokens/s). Without --model it runs the embedded default model that ships with
// the repository (models/austen-3m: a 2.9M-parameter Llama trained on Jane Austen's novels), on
// the GPU when one is usable (--device) and else on the CPU, so that it works on a fresh machine.
//
// The command only parses flags; the work is the library's: ModelRuntime (checkpoint, model, KV
// pool), Tokenizer + chat template, Engine (scheduler, sampler, stop conditions).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagedattn/chat_template.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_detokenizer.h"
#include "pagedattn/engine_generate.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"
#include "tools/cli/command.h"
#include "tools/cli/default_model.h"
#include "tools/cli/gpu_step_options.h"
#include "tools/cli/kv_dtype.h"

namespace pagedattn::tools {
namespace {

namespace fs = std::filesystem;

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string chat_file;
  std::string backend = "auto";
  std::string device = "auto";
  GpuStepOptions gpu;
  std::string kv_dtype = "bf16";
  int32_t page_size = 16;
  int32_t max_tokens = 200;
  int threads = 0;
  bool greedy = false;
  bool ignore_eos = false;
  bool show_prompt = true;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
};

constexpr const char* kDefaultPrompt = "It is a truth universally acknowledged, that";

// The prompt's token ids: the chat rendered with the model's template, or the plain text.
std::vector<int32_t> prompt_ids(const GenerateOptions& options, const fs::path& model_dir,
                                const tokenizer::Tokenizer& tok, std::string& shown) {
  if (options.chat_file.empty()) {
    shown = options.prompt.empty() ? kDefaultPrompt : options.prompt;
    return tok.encode(shown, /*add_special_tokens=*/true);
  }
  std::ifstream in(options.chat_file);
  if (!in) throw Error(fmt::format("--chat {}: cannot open the file", options.chat_file));
  nlohmann::ordered_json chat;
  try {
    chat = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--chat {}: not valid JSON ({})", options.chat_file, e.what()));
  }
  if (!chat.is_object() || !chat.contains("messages") || !chat["messages"].is_array()) {
    throw Error(fmt::format("--chat {}: expected {{\"messages\": [...]}}", options.chat_file));
  }
  const std::optional<std::string_view> source = tok.chat_template();
  if (!source) throw Error(fmt::format("{}: the model ships no chat template", model_dir.string()));
  nlohmann::json config = nlohmann::json::object();
  if (std::ifstream config_in(model_dir / "tokenizer_config.json"); config_in) {
    config = nlohmann::json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  }
  ChatOptions chat_options =
      chat_options_from_config(config.is_discarded() ? nlohmann::json::object() : config);
  chat_options.add_generation_prompt = true;
  if (chat.contains("tools")) chat_options.tools = chat["tools"];
  const ChatTemplate compiled = ChatTemplate::compile(std::string(*source));
  shown = render_chat(compiled, chat["messages"], chat_options);
  // The template writes the special tokens itself (as transformers' apply_chat_template).
  return tok.encode(shown, /*add_special_tokens=*/false);
}

void run_generate(const GenerateOptions& options) {
  using Clock = std::chrono::steady_clock;
  const fs::path model_dir =
      options.model.empty() ? default_model_directory() : fs::path(options.model);
  const auto load_start = Clock::now();

  engine::RuntimeOptions runtime_options;
  runtime_options.model.backend = options.backend;
  runtime_options.model.device = options.device;
  options.gpu.apply(runtime_options);
  runtime_options.model.threads = options.threads;
  runtime_options.page_size = options.page_size;
  runtime_options.kv_dtype = parse_kv_dtype(options.kv_dtype);
  runtime_options.max_sequences = 1;  // one request: a pool for one full-length sequence
  auto runtime = engine::ModelRuntime::open(model_dir, runtime_options);
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_directory(model_dir);

  engine::SamplingParams params;
  engine::apply_generation_config(model_dir, params);
  if (options.temperature) params.temperature = *options.temperature;
  if (options.top_p) params.top_p = *options.top_p;
  if (options.top_k) params.top_k = *options.top_k;
  if (options.min_p) params.min_p = *options.min_p;
  if (options.repetition_penalty) params.repetition_penalty = *options.repetition_penalty;
  if (options.greedy) params.temperature = 0.0;
  params.seed = options.seed;
  params.max_tokens = options.max_tokens;
  params.ignore_eos = options.ignore_eos;
  params.stop = options.stop;

  std::string shown;
  std::vector<int32_t> prompt = prompt_ids(options, model_dir, tok, shown);
  engine::EngineConfig engine_config = runtime->engine_config();
  options.gpu.apply(engine_config);
  engine::Engine engine(engine_config, *runtime, engine::make_detokenizer_factory(tok));
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  fmt::print(stderr,
             "model {} ({} layers, {:.1f} MB of weights, {} KV pages of {} tokens in {}) on {}, "
             "loaded in {:.2f} s\n",
             model_dir.string(), runtime->config().num_hidden_layers, runtime->weight_bytes() / 1e6,
             runtime->pool().num_pages(), runtime->pool().alloc_page_size(),
             dtype_name(runtime->pool().config().dtype), runtime->device().str(), load_s);

  if (options.show_prompt) {
    std::fputs(shown.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto start = Clock::now();
  std::optional<Clock::time_point> first_token;
  const auto completions = engine::generate(engine, {std::move(prompt)}, params,
                                            [&](size_t, const engine::RequestEvent& event) {
                                              if (!event.token_ids.empty() && !first_token)
                                                first_token = Clock::now();
                                              std::fputs(event.text.c_str(), stdout);
                                              std::fflush(stdout);
                                            });
  const engine::Completion& last = completions.at(0).at(0);
  const int64_t generated = static_cast<int64_t>(last.tokens.size());
  const int64_t prompt_tokens = last.num_prompt_tokens;
  const auto end = Clock::now();
  std::fputs("\n", stdout);
  if (last.finish_reason == engine::FinishReason::kError) {
    throw Error(fmt::format("generation failed: {}", last.error));
  }
  const double total_s = std::chrono::duration<double>(end - start).count();
  const double ttft_s =
      first_token ? std::chrono::duration<double>(*first_token - start).count() : total_s;
  const double decode_s = total_s - ttft_s;
  fmt::print(stderr,
             "\n{} prompt tokens, {} generated ({}); time to first token {:.1f} ms; "
             "{:.1f} tokens/s ({:.2f} s in all)\n",
             prompt_tokens, generated, engine::to_string(last.finish_reason), ttft_s * 1e3,
             generated > 1 && decode_s > 0 ? (generated - 1) / decode_s : 0.0, total_s);
}

void add_generate_command(CLI::App& parent) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = parent.add_subcommand(
      "generate",
      "Generate text from a prompt or a chat, streamed as it is produced (default: the embedded "
      "Austen model on the CPU)");
  command->add_option("--model", options->model,
                      "Hugging Face model directory (config.json, *.safetensors, tokenizer.json); "
                      "default: the embedded models/austen-3m");
  command->add_option("--prompt", options->prompt, "the text to continue")
      ->default_str(kDefaultPrompt);
  command
      ->add_option("--chat", options->chat_file,
                   "a JSON file {\"messages\": [...]} rendered with the model's chat template")
      ->excludes("--prompt");
  command->add_option("--max-tokens", options->max_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--temperature", options->temperature,
                      "0 is greedy (default: generation_config.json, else 1)");
  command->add_option("--top-p", options->top_p, "nucleus sampling, (0, 1]");
  command->add_option("--top-k", options->top_k, "keep the k most likely tokens (-1: off)");
  command->add_option("--min-p", options->min_p, "drop tokens below min_p x the top probability");
  command->add_option("--repetition-penalty", options->repetition_penalty, "> 0; 1 is off");
  command->add_option("--seed", options->seed, "same seed, same output");
  command->add_option("--stop", options->stop, "stop strings (not printed)");
  command->add_flag("--greedy", options->greedy, "greedy decoding (temperature 0)");
  command->add_flag("--ignore-eos", options->ignore_eos, "keep going past the end-of-text token");
  command->add_flag("!--no-prompt", options->show_prompt, "print only the generated text");
  command
      ->add_option("--backend", options->backend,
                   "attention backend: auto, cpu, cuda, cuda_generic, or prefill=X,decode=Y")
      ->capture_default_str();
  command
      ->add_option("--device", options->device,
                   "where the model runs: auto (a usable CUDA device unless --backend names a "
                   "CPU backend, else the CPU), cpu, cuda, cuda:N")
      ->capture_default_str();
  add_gpu_step_options(*command, options->gpu);
  command->add_option("--page-size", options->page_size, "KV page size in tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--kv-dtype", options->kv_dtype, kKvDtypeHelp)
      ->capture_default_str();
  command->add_option("--threads", options->threads, "CPU threads (0: all cores)");
  command->callback([options] { run_generate(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("generate", add_generate_command);

}  // namespace pagedattn::tools
