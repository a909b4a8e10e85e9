// The pagedattn command line: each subcommand lives in its own cmd_*.cpp and is added here.
#pragma once

#include <CLI/CLI.hpp>

namespace pagedattn::tools {

// Each adds one subcommand (with its options and callback) to `app`.
void add_info_command(CLI::App& app);   // cmd_info.cpp
void add_plan_command(CLI::App& app);   // cmd_plan.cpp
void add_bench_command(CLI::App& app);  // cmd_bench.cpp: `bench` with `bench plan`
void add_demo_command(CLI::App& app);   // cmd_demo.cpp

// Added to the `bench` subcommand: `bench decode|prefill|mla` (bench_attention.cpp).
void add_bench_attention_commands(CLI::App& bench);

}  // namespace pagedattn::tools
