#!/usr/bin/env python3
"""A test of scripts/bench-serve-run, issue 17's serving rows in one command, end to end on the
embedded model (models/austen-3m) on the CPU: the server starts on a free loopback port, `pagedattn
bench serve` drives it at saturation and at half that rate, the engine counters are read from
/metrics around the saturation run, SIGTERM stops the server (exit 0, every KV page free: the
script fails otherwise), and the same requests run offline through `pagedattn bench throughput`
(the embedded model has fewer token ids than nano-vllm's prompts use: the script caps them).
Checked here: every request of every run completed with its full output, the counters moved by
at least the steps the outputs need, and the overhead ratio is the two runs' output rates.

  bench_serve_run_test.py PAGEDATTN_BINARY   (ctest: test bench_serve_run)
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "bench-serve-run")
MODEL = os.path.join(ROOT, "models", "austen-3m")
BINARY = None
REQUESTS, OUTPUT_LEN = 6, 4


class BenchServeRun(unittest.TestCase):
    def test_embedded_model_on_the_cpu(self):
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [sys.executable, SCRIPT, "--bin", BINARY, "--out", out, "--model", MODEL,
                 "--device", "cpu", "--requests", str(REQUESTS), "--input-len", "8",
                 "--output-len", str(OUTPUT_LEN), "--fractions", "0.5", "--start-timeout", "120",
                 "--metadata", "commit=test"],
                capture_output=True, text=True, timeout=600)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(os.path.join(out, "serve_summary.json"), encoding="utf-8") as handle:
                summary = json.load(handle)
            with open(os.path.join(out, "serve_offline.json"), encoding="utf-8") as handle:
                offline = json.load(handle)
        self.assertEqual([run["label"] for run in summary["runs"]], ["saturation", "rate_0.5"])
        for run in summary["runs"]:
            self.assertEqual(run["completed"], REQUESTS, run["label"])
            self.assertEqual(run["failed"], 0, run["label"])
            self.assertEqual(run["output_tokens"], REQUESTS * OUTPUT_LEN, run["label"])
        engine = summary["saturation_engine"]
        self.assertGreaterEqual(engine["steps"], OUTPUT_LEN)  # one token per sequence per step
        self.assertEqual(engine["overlapped_steps"], 0)  # the CPU model runs steps one at a time
        self.assertGreater(engine["forward_s"], 0)
        self.assertGreaterEqual(engine["engine_s"], engine["forward_s"])
        row = offline["rows"][0]
        self.assertEqual(row["requests"], REQUESTS)
        self.assertEqual(row["output_tokens"], REQUESTS * OUTPUT_LEN)
        self.assertEqual(offline["workload"]["max_token_id"], 4095)  # 4,096 ids in the model
        self.assertEqual(summary["metadata"], {"commit": "test"})
        saturation = summary["runs"][0]
        self.assertAlmostEqual(summary["saturation_over_offline"],
                               saturation["output_throughput"] / row["output_tok_s"], places=9)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: bench_serve_run_test.py PAGEDATTN_BINARY")
    BINARY = sys.argv.pop(1)
    unittest.main()
