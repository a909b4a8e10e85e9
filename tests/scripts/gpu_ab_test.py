#!/usr/bin/env python3
"""Tests of scripts/gpu-ab's bench and test verbs (the GPU machine's side) on stand-in builds.

Each stand-in `pagedattn` is a small script that writes the --json document a benchmark would,
with times set per build and round, and appends its arguments to a log; each stand-in
`test_cuda` exits with a status set per build. Checked: the builds alternate round by round with
the arguments after -- passed through (options included) and --json added; every row's cell holds
each round's time; the ratio is the first build's median over the rounds divided by the build's;
CUDA (median_us, "rows"; graph_step_wall_us, "graphs") and CPU (run_us_median, "results")
documents; a build's variant with environment variables (NAME+VAR=VALUE), and bad spellings of
one; DIR/lib on LD_LIBRARY_PATH; a failing build fails `bench` and `test`. Python 3 standard
library only.
"""

import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "scripts", "gpu-ab")

# A stand-in `pagedattn`: `times` is {round: [median_us of row 0, row 1]}, the round being the
# number of lines already in the shared log (each run appends one).
BENCH = """#!{python}
import json, os, sys
log = {log!r}
with open(log, "a") as handle:
    library_path = os.environ.get("LD_LIBRARY_PATH", "")
    switch = os.environ.get("GPU_AB_TEST_SWITCH", "-")
    handle.write({name!r} + " " + " ".join(sys.argv[1:]) + " LD=" + library_path +
                 " SWITCH=" + switch + "\\n")
with open(log) as handle:
    runs = len([line for line in handle if line.startswith({name!r} + " ")])
times = {times!r}[runs]
if {fail!r}:
    sys.exit(3)
path = sys.argv[sys.argv.index("--json") + 1]
key = {key!r}
rows = [{{"batch": 1, "kv_len": 1024, "page_size": 16, key: times[0]}},
        {{"batch": 64, "kv_len": 1024, "page_size": 16, key: times[1]}}]
document = {{{section!r}: rows}}
graph_times = {graph_times!r}
if graph_times is not None:
    document["graphs"] = [{{"batch": 1, "kv_len": 1024, "layers": 32,
                           "graph_step_wall_us": graph_times[runs]}}]
json.dump(document, open(path, "w"))
"""


def write_script(path, text):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class GpuAb(unittest.TestCase):
    def make_builds(self, directory, log, builds, key="median_us", section="rows",
                    graph_times=None):
        os.makedirs(os.path.join(directory, "lib"))
        for name, (times, fail, test_status) in builds.items():
            os.makedirs(os.path.join(directory, name))
            write_script(os.path.join(directory, name, "pagedattn"),
                         BENCH.format(python=sys.executable, log=log, name=name, times=times,
                                      fail=fail, key=key, section=section,
                                      graph_times=graph_times))
            write_script(os.path.join(directory, name, "test_cuda"),
                         f"#!/bin/sh\necho {name} \"$@\" SWITCH=${{GPU_AB_TEST_SWITCH:--}} >> "
                         f"{log}\nexit {test_status}\n")

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)

    def table(self, stdout):
        lines = [line for line in stdout.splitlines() if line.startswith("| ")]
        return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]

    def test_bench_alternates_and_compares_medians(self):
        with tempfile.TemporaryDirectory() as directory:
            log = os.path.join(directory, "runs.log")
            # base: row 0 at 100 / 110 us, row 1 at 200 / 200; new: 80 / 90, 250 / 150.
            self.make_builds(directory, log, {
                "base": ({1: [100.0, 200.0], 2: [110.0, 200.0]}, False, 0),
                "new": ({1: [80.0, 250.0], 2: [90.0, 150.0]}, False, 0)})
            result = self.run_tool("bench", directory, "--names", "base,new", "--rounds", "2",
                                   "--", "bench", "decode", "--device", "cuda", "--rows", "1x1024")
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(log, encoding="utf-8") as handle:
                runs = handle.read().splitlines()
            self.assertEqual([line.split()[0] for line in runs], ["base", "new", "base", "new"])
            for line in runs:
                self.assertIn(" bench decode --device cuda --rows 1x1024 --json ", line)
                self.assertIn("LD=" + os.path.join(directory, "lib"), line)
            table = self.table(result.stdout)
            self.assertEqual(table[0], ["row", "base us", "new us", "new / base"])
            # Row 0: medians 105 and 85 -> 1.235; row 1: 200 and 200 -> 1.000.
            self.assertEqual(table[1], ["batch=1 kv_len=1024 page_size=16", "100.0, 110.0",
                                        "80.0, 90.0", "1.235"])
            self.assertEqual(table[2], ["batch=64 kv_len=1024 page_size=16", "200.0, 200.0",
                                        "250.0, 150.0", "1.000"])

    def test_bench_reads_cpu_documents(self):
        with tempfile.TemporaryDirectory() as directory:
            log = os.path.join(directory, "runs.log")
            self.make_builds(directory, log, {
                "a": ({1: [10.0, 20.0]}, False, 0), "b": ({1: [20.0, 10.0]}, False, 0)},
                key="run_us_median", section="results")
            result = self.run_tool("bench", directory, "--rounds", "1", "--", "bench", "decode")
            self.assertEqual(result.returncode, 0, result.stderr)
            table = self.table(result.stdout)
            self.assertEqual(table[1][1:], ["10.0", "20.0", "0.500"])
            self.assertEqual(table[2][1:], ["20.0", "10.0", "2.000"])

    def test_a_failing_build_fails(self):
        with tempfile.TemporaryDirectory() as directory:
            log = os.path.join(directory, "runs.log")
            self.make_builds(directory, log, {
                "a": ({1: [1.0, 1.0]}, False, 0), "b": ({1: [1.0, 1.0]}, True, 1)})
            bench = self.run_tool("bench", directory, "--rounds", "1", "--", "bench", "mla")
            self.assertNotEqual(bench.returncode, 0)
            self.assertIn("b failed", bench.stderr)
            test = self.run_tool("test", directory, "--", "--gtest_filter=*Mla*")
            self.assertNotEqual(test.returncode, 0)
            self.assertIn("failed in b", test.stderr)
            with open(log, encoding="utf-8") as handle:
                self.assertIn("a --gtest_filter=*Mla*", handle.read())

    def test_a_variant_adds_environment_and_graph_rows_are_compared(self):
        with tempfile.TemporaryDirectory() as directory:
            log = os.path.join(directory, "runs.log")
            # One build run plain and with the switch, in turns: runs 1 and 3 plain, 2 and 4 on.
            self.make_builds(directory, log, {
                "main": ({1: [100.0, 200.0], 2: [50.0, 100.0], 3: [100.0, 200.0],
                          4: [50.0, 100.0]}, False, 0)},
                graph_times={1: 300.0, 2: 240.0, 3: 310.0, 4: 250.0})
            variant = "main+GPU_AB_TEST_SWITCH=on"
            result = self.run_tool("bench", directory, "--names", f"main,{variant}", "--rounds",
                                   "2", "--", "bench", "decode")
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(log, encoding="utf-8") as handle:
                switches = [line.split()[-1] for line in handle.read().splitlines()]
            self.assertEqual(switches, ["SWITCH=-", "SWITCH=on", "SWITCH=-", "SWITCH=on"])
            table = self.table(result.stdout)
            self.assertEqual(table[0], ["row", "main us", f"{variant} us", f"{variant} / main"])
            self.assertEqual(table[1][1:], ["100.0, 100.0", "50.0, 50.0", "2.000"])
            # The graph step: medians 305 and 245 -> 1.245.
            self.assertEqual(table[3], ["graph batch=1 kv_len=1024", "300.0, 310.0",
                                        "240.0, 250.0", "1.245"])
            test = self.run_tool("test", directory, "--names", variant, "--", "--gtest_brief=1")
            self.assertEqual(test.returncode, 0, test.stderr)
            with open(log, encoding="utf-8") as handle:
                self.assertIn("main --gtest_brief=1 SWITCH=on", handle.read())
            # A '+' without VAR=VALUE, or a build that is not there: an error naming it.
            for bad, message in (("main+ON", "expected VAR=VALUE"), ("other", "no build 'other'")):
                result = self.run_tool("bench", directory, "--names", bad, "--", "bench", "mla")
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(message, result.stderr)

    def test_command_after_the_separator_is_required(self):
        with tempfile.TemporaryDirectory() as directory:
            result = self.run_tool("bench", directory)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("after --", result.stderr)


if __name__ == "__main__":
    unittest.main()
