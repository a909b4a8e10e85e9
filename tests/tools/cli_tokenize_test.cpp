// `pagedattn tokenize` on a small hand-made tokenizer directory (written by the test): ids and
// decoded text per input line in --json, the special-token flags, and a clear error for a
// directory without tokenizer.json. Expected ids are worked out by hand (merge "a b" only).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_util.h"

namespace pagedattn::testing {
namespace {

class CliTokenize : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (IsSkipped()) return;
    directory_ = std::filesystem::temp_directory_path() /
                 ("pagedattn_cli_tokenize_" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
    std::ofstream(directory_ / "tokenizer.json") << R"({
      "added_tokens": [{"id": 4, "content": "<s>", "special": true, "normalized": false,
                        "lstrip": false, "rstrip": false, "single_word": false}],
      "normalizer": null, "pre_tokenizer": null, "decoder": null,
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3}, "merges": ["a b"]}})";
    std::ofstream(directory_ / "input.jsonl") << "\"abc\"\n\"cab\"\n";
  }
  void TearDown() override {
    if (!directory_.empty()) std::filesystem::remove_all(directory_);
  }
  std::filesystem::path directory_;
};

TEST_F(CliTokenize, JsonLinesWithAndWithoutSpecialTokens) {
  const std::string base = "tokenize --tokenizer " + directory_.string() + " --input " +
                           (directory_ / "input.jsonl").string() + " --json";
  CliRun run = run_cli(base);
  ASSERT_EQ(run.status, 0) << run.output;
  // No decoder: decode joins the tokens with spaces.
  EXPECT_EQ(run.output, "{\"ids\":[3,2],\"text\":\"ab c\"}\n{\"ids\":[2,3],\"text\":\"c ab\"}\n");
  run = run_cli(base + " --add-special-tokens");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.output,
            "{\"ids\":[4,3,2],\"text\":\"<s> ab c\"}\n{\"ids\":[4,2,3],\"text\":\"<s> c ab\"}\n");
  run = run_cli(base + " --add-special-tokens --skip-special-tokens");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.output,
            "{\"ids\":[4,3,2],\"text\":\"ab c\"}\n{\"ids\":[4,2,3],\"text\":\"c ab\"}\n");
}

TEST_F(CliTokenize, TableAndErrors) {
  CliRun run = run_cli("tokenize --tokenizer " + directory_.string() + " aab");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("2 ids: [0, 3]"), std::string::npos) << run.output;
  run = run_cli("tokenize --tokenizer /nonexistent/dir x");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("/nonexistent/dir/tokenizer.json: no tokenizer.json"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace pagedattn::testing
