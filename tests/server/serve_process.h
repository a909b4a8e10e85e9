// `pagedattn serve` as a child process for the server tests (cli_serve_test.cpp,
// node_client_test.cpp): the built binary (tests/tools/cli_util.h's cli_path()) started with
// the given arguments, its stdout and stderr collected by a reader thread, its port read from
// the server's start line, stopped by a signal. Killed if the test ends first.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tools/cli_util.h"

namespace pagedattn::server::testing {

// The binary run as a child process, its stdout and stderr collected by a reader thread.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& arguments) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    const std::string binary = pagedattn::testing::cli_path().string();
    std::vector<std::string> all = {binary};
    all.insert(all.end(), arguments.begin(), arguments.end());
    std::vector<char*> argv;
    for (std::string& item : all) argv.push_back(item.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buffer[4096];
      for (ssize_t got; (got = ::read(fd, buffer, sizeof(buffer))) > 0;) {
        std::lock_guard lock(mutex_);
        output_.append(buffer, static_cast<size_t>(got));
      }
      ::close(fd);
    });
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  std::string output() {
    std::lock_guard lock(mutex_);
    return output_;
  }
  // The port from the server's start line; -1 if it did not come within `limit`.
  int wait_for_port(std::chrono::seconds limit) {
    const std::regex started("pagedattn server: model \\S+ on http://127\\.0\\.0\\.1:(\\d+)");
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch match;
      const std::string text = output();
      if (std::regex_search(text, match, started)) return std::stoi(match[1]);
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        exited_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  // Sends `signal_number` and waits (bounded) for the exit; the exit code, or -1.
  int stop(int signal_number, std::chrono::seconds limit) {
    ::kill(pid_, signal_number);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        if (reader_.joinable()) reader_.join();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::thread reader_;
  std::mutex mutex_;
  std::string output_;
};

}  // namespace pagedattn::server::testing
