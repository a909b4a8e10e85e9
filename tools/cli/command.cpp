// The command registry of the `pagedattn` command line (see command.h). The list is a
// function-local static, so registrations from any translation unit's static initializers find it
// constructed whatever the initialization order; it is sorted when the commands are added, so the
// help lists them in the same order on every build.
#include "tools/cli/command.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"

namespace pagedattn::tools {
namespace {

struct Registration {
  std::vector<std::string> words;  // "bench decode" -> {"bench", "decode"}
  AddCommand add = nullptr;
};

std::vector<Registration>& registrations() {
  static std::vector<Registration> list;
  return list;
}

std::vector<std::string> split_words(const std::string& path) {
  std::vector<std::string> words;
  size_t begin = 0;
  while (begin < path.size()) {
    const size_t end = std::min(path.find(' ', begin), path.size());
    if (end > begin) words.push_back(path.substr(begin, end - begin));
    begin = end + 1;
  }
  return words;
}

}  // namespace

bool register_command(const char* path, AddCommand add) {
  // No checks here: this runs before main, where an exception would terminate the program;
  // add_registered_commands reports what is wrong.
  registrations().push_back({split_words(path == nullptr ? "" : path), add});
  return true;
}

void add_registered_commands(CLI::App& app) {
  std::vector<Registration> sorted = registrations();
  // Parents (fewer words) first, then alphabetical.
  std::sort(sorted.begin(), sorted.end(), [](const Registration& a, const Registration& b) {
    if (a.words.size() != b.words.size()) return a.words.size() < b.words.size();
    return a.words < b.words;
  });
  for (size_t i = 0; i < sorted.size(); ++i) {
    PA_CHECK(!sorted[i].words.empty() && sorted[i].add != nullptr,
             "a command is registered with an empty path or no function");
    PA_CHECK(i == 0 || sorted[i].words != sorted[i - 1].words,
             "the command '{}' is registered twice", fmt::join(sorted[i].words, " "));
  }
  for (const Registration& registration : sorted) {
    CLI::App* parent = &app;
    std::string parent_path;
    for (size_t i = 0; i + 1 < registration.words.size(); ++i) {
      parent_path += (i == 0 ? "" : " ") + registration.words[i];
      CLI::App* child = nullptr;
      try {
        child = parent->get_subcommand(registration.words[i]);
      } catch (const CLI::OptionNotFound&) {
        child = nullptr;
      }
      PA_CHECK(child != nullptr, "the command '{}' needs the command '{}', which is not registered",
               fmt::join(registration.words, " "), parent_path);
      parent = child;
    }
    registration.add(*parent);
  }
}

}  // namespace pagedattn::tools
