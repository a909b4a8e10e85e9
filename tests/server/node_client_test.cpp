// The official OpenAI Node client against the server: tests/server/node/openai_client.cjs run
// with node against a live server, given the greedy reference texts (computed here with no
// engine) to compare what the client parsed with. Runs under CTest as server_openai_node_client
// after the fixture server_node_setup installed the npm package into the build tree; elsewhere
// (the environment variables absent) it is skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

TEST(OpenAiNodeClient, ParsesWhatTheServerSends) {
  const char* module = std::getenv("PAGEDATTN_OPENAI_NODE");
  const char* node = std::getenv("PAGEDATTN_NODE");
  const char* script = std::getenv("PAGEDATTN_NODE_SCRIPT");
  if (module == nullptr || node == nullptr || script == nullptr) {
    GTEST_SKIP() << "run through CTest (server_openai_node_client), which installs the client";
  }
  ASSERT_TRUE(std::filesystem::exists(module)) << module;
  TestServer server;
  const int max_tokens = 24;
  const std::string chat_prompt = "Tell me about Emma.";
  const std::string completion_prompt = "It is a truth universally acknowledged";
  const Json expected = {
      {"model", "test-model"},
      {"max_tokens", max_tokens},
      {"chat_prompt", chat_prompt},
      {"chat_text", naive_decode(greedy_tokens(bytes_of("user: " + chat_prompt + "\nassistant: "),
                                               max_tokens, true))},
      {"completion_prompt", completion_prompt},
      {"completion_text",
       naive_decode(greedy_tokens(bytes_of(completion_prompt), max_tokens, true))}};
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("pagedattn_node_expected_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << expected.dump();
  const std::string command = std::string("OPENAI_MODULE_DIR='") + module + "' '" + node + "' '" +
                              script + "' http://127.0.0.1:" + std::to_string(server.port()) +
                              "/v1 '" + path.string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  std::filesystem::remove(path);
  std::printf("%s", output.c_str());
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find(" passed, 0 failed"), std::string::npos) << output;
  EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
}

}  // namespace
}  // namespace pagedattn::server::testing
