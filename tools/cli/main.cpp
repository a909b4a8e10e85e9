// pagedattn: the command line. See `pagedattn --help`. The commands register themselves
// (tools/cli/command.h: one PAGEDATTN_CLI_COMMAND line in each command's file); this file only
// builds the application from them and turns errors into exit codes (1: the command failed,
// 2: the command line could not be built).
#include <cstdio>

#include "pagedattn/error.h"
#include "tools/cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"pagedattn: paged-KV-cache attention backend"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pagedattn 0.1.0");
  try {
    pagedattn::tools::add_registered_commands(app);
  } catch (const pagedattn::Error& error) {
    std::fprintf(stderr, "pagedattn: %s\n", error.what());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const pagedattn::Error& error) {
    std::fprintf(stderr, "pagedattn: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
