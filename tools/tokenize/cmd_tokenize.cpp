// `pagedattn tokenize`: a tokenizer directory's encode and decode from the command line, and
// `pagedattn bench tokenize`: single-threaded encode throughput and streamed-decode cost.
//
//   pagedattn tokenize --tokenizer DIR "text" ...      ids, then each id with its token and text
//   pagedattn tokenize --tokenizer DIR --input FILE --json
//       FILE: one JSON string per line; prints {"ids": [...], "text": decode(ids)} per line
//   pagedattn tokenize --tokenizer DIR --chat FILE.json [--json]
//       FILE: {"messages": [...], "tools": [...]?, "add_generation_prompt": true?, other template
//       variables such as "enable_thinking"}; prints the chat template rendered as transformers'
//       apply_chat_template does ({"prompt": "..."} with --json)
//   pagedattn bench tokenize --tokenizer DIR[,DIR...] [--corpus FILE] [--hf FILE]
//
// The benchmark text is the tokenizer corpus (tests/data/tokenizer/corpus.jsonl): its lines
// joined by "\n" and encoded whole, repeatedly (4 MB), and each line encoded by its own call
// (2 MB) — the two figures scripts/fixtures/tokenizer_fixtures.py measures for HF tokenizers
// (its bench.json, given with --hf, adds the ratio).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/tokenizer.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

using tokenizer::TokenId;
using tokenizer::Tokenizer;

std::string json_string(std::string_view text) {
  return nlohmann::json(std::string(text))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One JSON string per line (blank lines skipped).
std::vector<std::string> read_json_lines(const std::string& path) {
  std::ifstream file(path);
  PA_CHECK(file.good(), "--input {}: cannot open the file", path);
  std::vector<std::string> lines;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      PA_FAIL("{}:{}: expected a JSON string per line ({})", path, number, error.what());
    }
    PA_CHECK(value.is_string(), "{}:{}: expected a JSON string, got {}", path, number,
             value.dump());
    lines.push_back(value.get<std::string>());
  }
  return lines;
}

struct TokenizeOptions {
  std::string directory, input, chat;
  std::vector<std::string> texts;
  bool json = false, add_special_tokens = false, skip_special_tokens = false;
};

// --chat FILE: the conversation rendered with the tokenizer's chat template.
void run_chat(const Tokenizer& tokenizer, const TokenizeOptions& options) {
  std::ifstream file(options.chat);
  PA_CHECK(file.good(), "--chat {}: cannot open the file", options.chat);
  nlohmann::ordered_json chat;
  try {
    chat = nlohmann::ordered_json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    PA_FAIL("--chat {}: not valid JSON ({})", options.chat, error.what());
  }
  PA_CHECK(chat.is_object() && chat.contains("messages") && chat["messages"].is_array(),
           "--chat {}: expected {{\"messages\": [...]}}", options.chat);
  const std::optional<std::string_view> source = tokenizer.chat_template();
  PA_CHECK(source.has_value(), "--chat: {} ships no chat template", options.directory);
  nlohmann::json config = nlohmann::json::object();
  if (std::ifstream in(std::filesystem::path(options.directory) / "tokenizer_config.json"); in) {
    config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) config = nlohmann::json::object();
  }
  ChatOptions chat_options = chat_options_from_config(config);
  chat_options.add_generation_prompt = true;
  for (const auto& [key, value] : chat.items()) {
    if (key == "messages") continue;
    if (key == "tools") {
      chat_options.tools = value;
    } else if (key == "documents") {
      chat_options.documents = value;
    } else if (key == "add_generation_prompt") {
      PA_CHECK(value.is_boolean(), "--chat {}: add_generation_prompt is {} (expected a boolean)",
               options.chat, value.dump());
      chat_options.add_generation_prompt = value.get<bool>();
    } else {
      chat_options.variables[key] = value;  // enable_thinking and other template variables
    }
  }
  const std::string prompt =
      render_chat(ChatTemplate::compile(std::string(*source)), chat["messages"], chat_options);
  if (options.json) {
    fmt::print("{}\n", nlohmann::json({{"prompt", prompt}})
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}\n", prompt);
  }
}

void run_tokenize(const TokenizeOptions& options) {
  Tokenizer tokenizer = Tokenizer::from_directory(options.directory);
  if (!options.chat.empty()) {
    PA_CHECK(options.texts.empty() && options.input.empty(),
             "tokenize: --chat renders one conversation; give no TEXT or --input with it");
    run_chat(tokenizer, options);
    return;
  }
  std::vector<std::string> texts = options.texts;
  if (!options.input.empty()) {
    auto lines = read_json_lines(options.input);
    texts.insert(texts.end(), lines.begin(), lines.end());
  }
  PA_CHECK(!texts.empty(), "tokenize: no text (give TEXT arguments or --input FILE)");
  for (const std::string& text : texts) {
    std::vector<TokenId> ids = tokenizer.encode(text, options.add_special_tokens);
    std::string decoded = tokenizer.decode(ids, options.skip_special_tokens);
    if (options.json) {
      fmt::print("{}\n", nlohmann::json({{"ids", ids}, {"text", decoded}})
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      continue;
    }
    fmt::print("{} ids: [{}]\n", ids.size(), fmt::join(ids, ", "));
    Table table({"id", "token", "text"});
    for (TokenId id : ids) {
      std::vector<TokenId> one{id};
      table.add_row({std::to_string(id), json_string(tokenizer.id_to_token(id).value_or("")),
                     json_string(tokenizer.decode(one, false))});
    }
    fmt::print("{}decode: {}\n\n", table.str(), json_string(decoded));
  }
}

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode text with a tokenizer directory (tokenizer.json): ids, tokens, decode");
  cmd->add_option("--tokenizer", options->directory,
                  "Directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  cmd->add_option("text", options->texts, "Texts to encode");
  cmd->add_option("--input", options->input, "File of texts: one JSON string per line");
  cmd->add_option("--chat", options->chat,
                  "A JSON file {\"messages\": [...]} rendered with the chat template");
  cmd->add_flag("--json", options->json,
                "One JSON object per text: {\"ids\": [...], \"text\": decode(ids)}");
  cmd->add_flag("--add-special-tokens", options->add_special_tokens,
                "Run the post processor (BOS / EOS), as tokenizers' add_special_tokens");
  cmd->add_flag("--skip-special-tokens", options->skip_special_tokens,
                "Leave special tokens out of the decoded text");
  cmd->callback([options] { run_tokenize(*options); });
}

struct BenchOptions {
  std::vector<std::string> directories;
  std::string corpus = "tests/data/tokenizer/corpus.jsonl", hf, json_path;
  double megabytes = 4;
};

void run_bench_tokenize(const BenchOptions& options) {
  std::vector<std::string> lines = read_json_lines(options.corpus);
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) text += (i ? "\n" : "") + lines[i];
  nlohmann::json hf;
  if (!options.hf.empty()) {
    std::ifstream file(options.hf);
    PA_CHECK(file.good(), "--hf {}: cannot open the file", options.hf);
    hf = nlohmann::json::parse(file);
  }
  fmt::print(
      "encode, single thread: the corpus ({} lines, {} bytes) joined and encoded whole, "
      "and line by line\n{}\n",
      lines.size(), text.size(), machine_description());
  Table table({"tokenizer", "document MB/s", "HF", "x HF", "lines MB/s", "HF", "x HF",
               "tokens/s (M)", "stream decode ns/token"});
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& directory : options.directories) {
    std::string name = std::filesystem::path(directory).filename().string();
    if (name.empty()) name = std::filesystem::path(directory).parent_path().filename().string();
    Tokenizer tokenizer = Tokenizer::from_directory(directory);
    auto min_bytes = static_cast<int64_t>(options.megabytes * 1e6);
    auto document = tokenizer::bench_encode(tokenizer, text, min_bytes);
    auto per_line = tokenizer::bench_encode_lines(tokenizer, lines, min_bytes / 2);
    auto ids = tokenizer.encode(text, false);
    double decode_ns = tokenizer::bench_incremental_decode_ns(tokenizer, ids, 3);
    auto hf_figure = [&](const char* key) -> double {
      return hf.contains(name) ? hf[name].value(key, 0.0) : 0.0;
    };
    double hf_document = hf_figure("document_mb_per_s"), hf_lines = hf_figure("lines_mb_per_s");
    auto ratio = [](double ours, double theirs) {
      return theirs > 0 ? fmt::format("{:.2f}", ours / theirs) : std::string("-");
    };
    auto figure = [](double value) {
      return value > 0 ? fmt::format("{:.2f}", value) : std::string("-");
    };
    table.add_row({name, figure(document.megabytes_per_second), figure(hf_document),
                   ratio(document.megabytes_per_second, hf_document),
                   figure(per_line.megabytes_per_second), figure(hf_lines),
                   ratio(per_line.megabytes_per_second, hf_lines),
                   fmt::format("{:.2f}", document.tokens / document.seconds / 1e6),
                   fmt::format("{:.0f}", decode_ns)});
    results.push_back({{"tokenizer", name},
                       {"document_mb_per_s", document.megabytes_per_second},
                       {"lines_mb_per_s", per_line.megabytes_per_second},
                       {"tokens_per_s", document.tokens / document.seconds},
                       {"stream_decode_ns_per_token", decode_ns},
                       {"hf_document_mb_per_s", hf_document},
                       {"hf_lines_mb_per_s", hf_lines}});
  }
  fmt::print("{}", table.str());
  if (!hf.is_null()) {
    fmt::print("HF: tokenizers {} (Python binding, RAYON_NUM_THREADS=1) on {}\n",
               hf.value("tokenizers", "?"), hf.value("cpu", "the machine that wrote --hf"));
  }
  if (!options.json_path.empty()) {
    std::ofstream out(options.json_path);
    PA_CHECK(out.good(), "bench tokenize: --json {}: cannot open for writing", options.json_path);
    out << nlohmann::json(
               {{"machine", machine_description()}, {"time", utc_timestamp()}, {"rows", results}})
               .dump(2)
        << '\n';
  }
}

void add_bench_tokenize_command(CLI::App& bench) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "tokenize", "Tokenizer encode MB/s (single thread) and streamed decode ns per token");
  cmd->add_option("--tokenizer", options->directories, "Tokenizer directories")
      ->delimiter(',')
      ->required();
  cmd->add_option("--corpus", options->corpus, "Texts: one JSON string per line")
      ->capture_default_str();
  cmd->add_option("--hf", options->hf,
                  "HF tokenizers' figures (bench.json of scripts/fixtures/tokenizer_fixtures.py)");
  cmd->add_option("--megabytes", options->megabytes, "MB encoded per figure (lines: half)")
      ->capture_default_str();
  cmd->add_option("--json", options->json_path, "Also write the results as JSON to FILE");
  cmd->callback([options] { run_bench_tokenize(*options); });
}

}  // namespace

PAGEDATTN_CLI_COMMAND("tokenize", add_tokenize_command);
PAGEDATTN_CLI_COMMAND("bench tokenize", add_bench_tokenize_command);

}  // namespace pagedattn::tools
