// How a command of the `pagedattn` command line registers itself. Each command lives in its own
// source file (tools/<area>/cmd_<name>.cpp) and ends with one line,
//
//   PAGEDATTN_CLI_COMMAND("generate", add_generate_command);
//
// where add_generate_command(CLI::App& parent) adds the subcommand (options and callback) to
// `parent`. A path of several words names a subcommand of a subcommand: "bench model" is added to
// the `bench` command. No central list: the registration runs at static initialization, and
// main.cpp adds every registered command, parents before children, in alphabetical order within
// a parent. Every .cpp under tools/ is compiled into the binary (tools/CMakeLists.txt), so a new
// file needs no edit elsewhere. (The registrations live in the executable's own objects; they
// would be dropped if these sources were ever put in a static library.)
#pragma once

#include <CLI/CLI.hpp>

namespace pagedattn::tools {

using AddCommand = void (*)(CLI::App& parent);

// Records a command; returns true (so that it can initialize a static). Never throws (it runs
// before main): add_registered_commands reports a path registered twice.
bool register_command(const char* path, AddCommand add);

// Adds every registered command to `app`: paths of one word to `app` itself, "a b" to the
// subcommand `a` (which must be registered too). Throws Error naming a missing parent or a path
// registered twice.
void add_registered_commands(CLI::App& app);

}  // namespace pagedattn::tools

#define PAGEDATTN_CLI_CONCAT_INNER(a, b) a##b
#define PAGEDATTN_CLI_CONCAT(a, b) PAGEDATTN_CLI_CONCAT_INNER(a, b)
// Registers `function` as the command `path` (see above). One per command, at namespace scope.
#define PAGEDATTN_CLI_COMMAND(path, function)                                                 \
  [[maybe_unused]] static const bool PAGEDATTN_CLI_CONCAT(pagedattn_cli_command_, __LINE__) = \
      ::pagedattn::tools::register_command(path, function)
