// The pagedattn command line: each subcommand lives in its own cmd_*.cpp and is added here.
#pragma once

#include <CLI/CLI.hpp>

namespace pagedattn::tools {

// Each adds one subcommand (with its options and callback) to `app`.
void add_info_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_bench_command(CLI::App& app);  // bench plan | decode | prefill | mla
void add_demo_command(CLI::App& app);

}  // namespace pagedattn::tools
