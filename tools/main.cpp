// pagedattn: the command line (info, plan, bench, demo). See `pagedattn --help`.
#include <cstdio>

#include "pagedattn/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"pagedattn: paged-KV-cache attention backend"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pagedattn 0.1.0");
  try {
    // Subcommands are added as they land (see tools/commands.h).
    pagedattn::tools::add_demo_command(app);
    pagedattn::tools::add_info_command(app);
    pagedattn::tools::add_plan_command(app);
    pagedattn::tools::add_bench_command(app);
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
