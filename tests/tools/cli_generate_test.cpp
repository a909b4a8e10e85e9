// `pagedattn generate` and `pagedattn tokenize --chat` over the embedded model (models/austen-3m),
// end to end through the binary: the engine, the model runtime and the tokenizer together. The
// model's numerics are checked against transformers elsewhere (tests/model, tests/engine); here:
// the command runs without --model, honours --max-tokens, is reproducible under a seed, reports
// its figures, names a bad argument, and the chat template renders what it says (expected string
// worked out by hand from the template in models/austen-3m/tokenizer_config.json).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/cli_util.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using Cli = testing::CliTest;

const fs::path kModel = fs::path(__FILE__).parent_path().parent_path().parent_path() / "models" /
                        "austen-3m";

TEST_F(Cli, GenerateRunsTheEmbeddedModel) {
  const std::string args = "generate --max-tokens 12 --seed 7 --ignore-eos --no-prompt --threads 1";
  const CliRun first = run_cli(args);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("austen-3m"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("12 generated (length)"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("tokens/s"), std::string::npos) << first.output;
  // The same seed: the same text (the model line's load time and the figures differ).
  const CliRun second = run_cli(args);
  ASSERT_EQ(second.status, 0) << second.output;
  auto text_of = [](const std::string& output) {
    const size_t start = output.find('\n') + 1;  // after the model line
    return output.substr(start, output.find(" prompt tokens,") - start);
  };
  EXPECT_EQ(text_of(first.output), text_of(second.output));
}

// An fp8 KV pool (--kv-dtype fp8, vLLM's name; fp8_e4m3 too): the run completes and says so. Its
// logits are checked in tests/model/forward_fp8_kv_test.cpp.
TEST_F(Cli, GenerateOverAnFp8Cache) {
  for (const char* dtype : {"fp8", "fp8_e4m3"}) {
    const CliRun run = run_cli(std::string("generate --max-tokens 8 --seed 3 --ignore-eos "
                                           "--no-prompt --threads 1 --kv-dtype ") +
                               dtype);
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("8 generated (length)"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("tokens in fp8_e4m3)"), std::string::npos) << run.output;
  }
}

TEST_F(Cli, GenerateNamesABadArgument) {
  CliRun run = run_cli("generate --max-tokens 4 --kv-dtype int3");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--kv-dtype int3"), std::string::npos) << run.output;
  run = run_cli("generate --model /nonexistent/model --max-tokens 4");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("/nonexistent/model"), std::string::npos) << run.output;
  run = run_cli("generate --max-tokens 4 --top-p 0");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("top_p"), std::string::npos) << run.output;
}

TEST_F(Cli, TokenizeRendersTheChatTemplate) {
  const fs::path chat = fs::temp_directory_path() / "pagedattn_cli_chat.json";
  std::ofstream(chat) << R"({"messages": [{"role": "system", "content": "Be brief."},)"
                      << R"( {"role": "user", "content": "Hello"}]})";
  const CliRun run = run_cli("tokenize --tokenizer " + kModel.string() + " --chat " +
                             chat.string() + " --json");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(nlohmann::json::parse(run.output)["prompt"],
            "Be brief.\n\n<|user|>\nHello\n<|assistant|>\n");
}

}  // namespace
}  // namespace pagedattn
