// Running the `pagedattn` binary from the tools tests: it is found beside the test's build
// directory (<build>/pagedattn); the fixture skips when it was not built.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace pagedattn::testing {

inline std::filesystem::path cli_path() {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return self.parent_path().parent_path() / "pagedattn";
}

struct CliRun {
  int status = -1;
  std::string output;  // stdout and stderr together
};

inline CliRun run_cli(const std::string& arguments) {
  CliRun run;
  const std::string command = cli_path().string() + " " + arguments + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer{};
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    run.output.append(buffer.data(), got);
  }
  const int raw = ::pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(cli_path())) {
      GTEST_SKIP() << "pagedattn binary not built at " << cli_path();
    }
  }
};

}  // namespace pagedattn::testing
