// `pagedattn serve`: the OpenAI-compatible server (include/pagedattn/server.h) over the engine,
// with the engine and HTTP flags on the command line. SIGINT / SIGTERM start a graceful
// shutdown (--grace seconds for running requests, then abort), after which the command exits 0
// and reports whether every KV page came back.
//
// The model side comes from load_served_model(): a model directory (default: the embedded
// models/austen-3m) as a ModelRuntime (checkpoint + KV pool), its tokenizer's TextFront and
// detokenizer, EOS ids and model length from its config, and the tool-call format
// (--tool-call-parser, vLLM's flag: auto picks it from the chat template or the model family).
// For benchmarks, --shape NAME serves a random-weight model of a named shape (bench throughput's)
// with the tokenizer of --tokenizer DIR.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "pagedattn/engine.h"
#include "pagedattn/engine_detokenizer.h"
#include "pagedattn/engine_runtime.h"
#include "pagedattn/model_random.h"
#include "pagedattn/server.h"
#include "pagedattn/server_text_front.h"
#include "pagedattn/server_tool_calls.h"
#include "pagedattn/tokenizer.h"
#include "tools/cli/command.h"
#include "tools/cli/default_model.h"
#include "tools/cli/gpu_step_options.h"
#include "tools/cli/kv_dtype.h"

namespace pagedattn::tools {
namespace {

struct ServeOptions {
  std::string model_dir;      // empty: the embedded default model
  std::string shape;          // or a random-weight model of a named shape (model_random.h)
  std::string tokenizer_dir;  // empty: the model directory's
  std::string served_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  int32_t num_pages = 0;  // 0: the runner's choice
  int32_t page_size = 16;
  std::string device = "auto";
  GpuStepOptions gpu;
  double kv_memory_fraction = 0.8;  // of the device memory free after loading (CUDA)
  std::string kv_dtype = "bf16";
  int64_t max_tokens_per_step = 2048;
  int32_t max_running = 256;
  int64_t max_model_length = 0;  // 0: the model's
  bool no_prefix_cache = false;
  uint64_t seed = 0;
  int32_t max_connections = 1024;
  int64_t max_pending_requests = 4096;
  size_t max_body_bytes = size_t{4} << 20;
  double grace_seconds = 30.0;
  bool quiet = false;
  std::string chat_template;              // a file replacing the tokenizer's template
  std::string tool_call_parser = "auto";  // a ToolCallFormat name or auto
  bool enable_auto_tool_choice = false;   // require a parser at start-up
};

// What serving a model needs besides the engine's own settings.
struct ServedModel {
  std::string name;
  std::shared_ptr<tokenizer::Tokenizer> tokenizer;  // the front and detokenizer refer to it
  std::unique_ptr<engine::ModelRunner> runner;
  std::unique_ptr<server::TextFront> front;
  engine::DetokenizerFactory detokenizer;
  std::vector<int32_t> eos_token_ids;
  int64_t max_model_length = 0;
  int32_t default_num_pages = 0;
  int64_t max_tokens_per_step = 0;  // the runner's bound (a GPU model's buffers), 0: none
  server::ToolCallFormat tool_call_format = server::ToolCallFormat::kNone;
};

std::string read_chat_template(const std::string& path) {
  std::ifstream in(path);
  PA_CHECK(static_cast<bool>(in), "serve: --chat-template {}: cannot read the file", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// --tool-call-parser: a format by name, or auto (the template's own markers, else the family).
server::ToolCallFormat choose_tool_call_format(const ServeOptions& options,
                                               std::string_view chat_template,
                                               std::string_view model_type) {
  server::ToolCallFormat format = server::ToolCallFormat::kNone;
  if (options.tool_call_parser == "auto") {
    format = server::detect_tool_call_format(chat_template, model_type);
  } else {
    const auto named = server::tool_call_format_from_name(options.tool_call_parser);
    PA_CHECK(named.has_value(),
             "serve: --tool-call-parser {}: expected auto, none, hermes, llama3_json or "
             "deepseek_v3",
             options.tool_call_parser);
    format = *named;
  }
  PA_CHECK(!options.enable_auto_tool_choice || format != server::ToolCallFormat::kNone,
           "serve: --enable-auto-tool-choice: no tool-call parser for this model (model_type "
           "'{}', a chat template with no known call format); name one with --tool-call-parser "
           "hermes|llama3_json|deepseek_v3",
           model_type);
  return format;
}

ServedModel load_served_model(const ServeOptions& options) {
  PA_CHECK(options.shape.empty() || !options.tokenizer_dir.empty(),
           "serve: --shape {} needs --tokenizer DIR (a random-weight model has no tokenizer of its "
           "own; any tokenizer whose ids fit in the shape's vocabulary)",
           options.shape);
  const std::filesystem::path directory = options.model_dir.empty()
                                              ? default_model_directory()
                                              : std::filesystem::path(options.model_dir);
  const std::filesystem::path tokenizer_directory =
      options.tokenizer_dir.empty() ? directory : std::filesystem::path(options.tokenizer_dir);
  engine::RuntimeOptions runtime_options;
  runtime_options.page_size = options.page_size;
  runtime_options.model.device = options.device;
  options.gpu.apply(runtime_options);
  runtime_options.kv_memory_fraction = options.kv_memory_fraction;
  runtime_options.kv_dtype = parse_kv_dtype(options.kv_dtype);
  runtime_options.num_pages = options.num_pages;
  runtime_options.max_sequences = options.max_running;  // no more pages than that can use
  // The same random weights for a shape on every start (seed 0), as bench throughput has them.
  std::unique_ptr<engine::ModelRuntime> runtime =
      options.shape.empty() ? engine::ModelRuntime::open(directory, runtime_options)
                            : engine::ModelRuntime::random(model::model_shape(options.shape),
                                                           /*seed=*/0, runtime_options);
  auto tokenizer = std::make_shared<tokenizer::Tokenizer>(
      tokenizer::Tokenizer::from_directory(tokenizer_directory));
  PA_CHECK(tokenizer->vocab_size() <= runtime->vocab_size(),
           "serve: the tokenizer in {} has {} token ids, more than the model's vocabulary of {}",
           tokenizer_directory.string(), tokenizer->vocab_size(), runtime->vocab_size());
  const engine::EngineConfig engine_config = runtime->engine_config();
  const std::string source = options.shape.empty()
                                 ? directory.string()
                                 : fmt::format("{} (random bf16 weights)", options.shape);
  fmt::print(stderr,
             "serve: model {} ({} layers, {:.1f} MB of weights) on {}, {} KV pages of {} tokens in "
             "{}\n",
             source, runtime->config().num_hidden_layers, runtime->weight_bytes() / 1e6,
             runtime->device().str(), engine_config.num_pages, engine_config.page_size,
             dtype_name(runtime->pool().config().dtype));
  ServedModel model;
  model.name = options.shape.empty() ? std::filesystem::absolute(directory).filename().string()
                                     : options.shape;
  std::optional<std::string> chat_template;
  if (!options.chat_template.empty()) chat_template = read_chat_template(options.chat_template);
  const std::string template_source =
      chat_template ? *chat_template : std::string(tokenizer->chat_template().value_or(""));
  model.tool_call_format =
      choose_tool_call_format(options, template_source, runtime->config().model_type);
  fmt::print(
      stderr, "serve: tool calls {}{}\n",
      model.tool_call_format == server::ToolCallFormat::kNone
          ? "not parsed (requests with tools need tool_choice \"none\")"
          : fmt::format("parsed as {}", server::tool_call_format_name(model.tool_call_format)),
      options.tool_call_parser == "auto" ? " (--tool-call-parser auto)" : "");
  model.front = server::make_text_front(*tokenizer, tokenizer_directory, std::move(chat_template));
  model.detokenizer = engine::make_detokenizer_factory(*tokenizer);
  model.eos_token_ids = engine_config.eos_token_ids;
  model.max_model_length = engine_config.max_model_length;
  model.default_num_pages = engine_config.num_pages;
  model.max_tokens_per_step = runtime->max_step_tokens();
  model.runner = std::move(runtime);
  model.tokenizer = std::move(tokenizer);
  return model;
}

void run_serve(const ServeOptions& options) {
  ServedModel model = load_served_model(options);
  engine::EngineConfig config;
  config.num_pages = options.num_pages > 0 ? options.num_pages : model.default_num_pages;
  config.page_size = options.page_size;
  config.max_tokens_per_step = options.max_tokens_per_step;
  if (model.max_tokens_per_step > 0 &&
      (config.max_tokens_per_step <= 0 || config.max_tokens_per_step > model.max_tokens_per_step)) {
    config.max_tokens_per_step = model.max_tokens_per_step;  // what the GPU model's buffers hold
  }
  config.max_running = options.max_running;
  config.max_model_length =
      options.max_model_length > 0 ? options.max_model_length : model.max_model_length;
  config.prefix_cache = !options.no_prefix_cache;
  config.eos_token_ids = model.eos_token_ids;
  config.seed = options.seed;
  options.gpu.apply(config);  // --disable-overlap-schedule (it was applied to a copy and lost)
  engine::Engine engine(config, *model.runner, model.detokenizer);

  server::ServerConfig server_config;
  server_config.host = options.host;
  server_config.port = options.port;
  server_config.model_name = options.served_name.empty() ? model.name : options.served_name;
  server_config.max_connections = options.max_connections;
  server_config.max_pending_requests = options.max_pending_requests;
  server_config.max_body_bytes = options.max_body_bytes;
  server_config.log_requests = !options.quiet;
  server_config.tool_call_format = model.tool_call_format;
  const std::function<int()> wait_for_signal = server::install_shutdown_signals();
  server::Server server(server_config, engine, *model.front);
  server.start();
  const int signal_number = wait_for_signal();
  fmt::print(stderr, "serve: signal {} received; finishing running requests (grace {} s)\n",
             signal_number, options.grace_seconds);
  const server::ShutdownReport report = server.shutdown(
      std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000.0)));
  PA_CHECK(report.num_free_pages == report.num_pages,
           "serve: {} of {} KV pages still held after shutdown (a leak)",
           report.num_pages - report.num_free_pages, report.num_pages);
}

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server over the engine");
  cmd->add_option("--model", options->model_dir,
                  "Model directory (default: the embedded model models/austen-3m)");
  cmd->add_option("--shape", options->shape,
                  "Serve a random-weight model of a named shape instead (" +
                      fmt::format("{}", fmt::join(model::model_shape_names(), ", ")) +
                      "; needs --tokenizer): for benchmarks")
      ->excludes("--model");
  cmd->add_option("--tokenizer", options->tokenizer_dir,
                  "Tokenizer directory (tokenizer.json, tokenizer_config.json; default: the "
                  "model's)");
  cmd->add_option("--served-model-name", options->served_name,
                  "The model name clients send (default: the model's)");
  cmd->add_option("--host", options->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", options->port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--num-pages", options->num_pages, "KV pages (default: the runner's pool)");
  cmd->add_option("--page-size", options->page_size, "Tokens per KV page")->capture_default_str();
  cmd->add_option("--device", options->device,
                  "Where the model runs: auto (a usable CUDA device, else the CPU), cpu, cuda, "
                  "cuda:N")
      ->capture_default_str();
  add_gpu_step_options(*cmd, options->gpu);
  cmd->add_option("--kv-memory-fraction", options->kv_memory_fraction,
                  "On a GPU without --num-pages: the KV pool's share of the device memory left "
                  "free by the model, (0, 1)")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", options->kv_dtype, kKvDtypeHelp)->capture_default_str();
  cmd->add_option("--max-tokens-per-step", options->max_tokens_per_step,
                  "Token budget of one engine step (<= 0: unbounded)")
      ->capture_default_str();
  cmd->add_option("--max-running", options->max_running, "Sequences in the batch at most")
      ->capture_default_str();
  cmd->add_option("--max-model-len", options->max_model_length,
                  "Context length (default: the model's)");
  cmd->add_flag("--no-prefix-cache", options->no_prefix_cache, "Disable the radix prefix cache");
  cmd->add_option("--seed", options->seed, "Seed of requests that give none")
      ->capture_default_str();
  cmd->add_option("--max-connections", options->max_connections,
                  "HTTP threads = open streams served at once")
      ->capture_default_str();
  cmd->add_option("--max-pending", options->max_pending_requests,
                  "Requests in the engine at once; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", options->max_body_bytes, "Larger bodies get 413")
      ->capture_default_str();
  cmd->add_option("--grace", options->grace_seconds,
                  "Seconds running requests get to finish on SIGINT / SIGTERM")
      ->capture_default_str();
  cmd->add_flag("--quiet", options->quiet, "No per-request log lines");
  cmd->add_option("--chat-template", options->chat_template,
                  "A Jinja chat template file used instead of the tokenizer's (e.g. one that "
                  "renders tools)");
  cmd->add_option("--tool-call-parser", options->tool_call_parser,
                  "How the model writes tool calls, parsed into the chat response's tool_calls "
                  "when a request has tools (tool_choice \"auto\"): hermes (Qwen2.5 / Qwen3: "
                  "<tool_call> blocks), llama3_json (Llama 3.1+ JSON), deepseek_v3, none, or "
                  "auto: from the chat template's markers, else the model family")
      ->check(CLI::IsMember({"auto", "none", "hermes", "llama3_json", "deepseek_v3"}))
      ->capture_default_str();
  cmd->add_flag("--enable-auto-tool-choice", options->enable_auto_tool_choice,
                "vLLM's switch for tool_choice \"auto\"; here it is on whenever a parser is "
                "known, and the flag makes a missing parser an error at start-up");
  cmd->callback([options] { run_serve(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("serve", add_serve_command);

}  // namespace pagedattn::tools
