#!/usr/bin/env python3
"""Tests of scripts/sdpa-peer that need no torch and no GPU: --flops-only's count for each row
against a naive count (a loop over query rows summing the keys each sees, and figures derived by
hand), row-syntax errors that name the row, and that --help / --flops-only never import torch.
With the CLI's path as argument, the count is also compared with `pagedattn bench prefill
--device cpu` on small rows. The CUDA bench's own count (bench_cuda_prefill.cpp, visible_pairs)
is reachable only on a GPU; the CPU bench's comes from tests/reference/cases.cpp
(AttentionCase::flops), a per-query-row loop of its own. Run by ctest (test sdpa_peer) or
directly: sdpa_peer_test.py [PATH_TO_PAGEDATTN].
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEER = os.path.join(ROOT, "scripts", "sdpa-peer")
CLI = None  # set from argv

HEADS, HEAD_DIM = 32, 128


def run_peer(*args, env=None):
    return subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True, env=env)


def peer_flops(rows, *extra):
    result = run_peer("--flops-only", "--rows", rows, *extra)
    if result.returncode != 0:
        raise AssertionError(f"sdpa-peer failed: {result.stderr}")
    out = {}
    for line in result.stdout.splitlines():
        name, value = line.split(" ", 1)
        out[name] = value if value.startswith("n/a") else int(value)
    return out


def naive_flops(batch, q_len, kv_len, causal=True, heads=HEADS, head_dim=HEAD_DIM):
    """Query row i of q_len sits at position kv_len - q_len + i and sees keys 0 .. position."""
    pairs = 0
    for i in range(q_len):
        pairs += (kv_len - q_len + i + 1) if causal else kv_len
    return 2 * batch * pairs * heads * (head_dim + head_dim)


class FlopsOnly(unittest.TestCase):
    def test_default_rows_against_a_naive_count(self):
        got = peer_flops("1x8192,1x32768,ragged16/4096,1x512/8192,1x512/32768,8x256/8192")
        self.assertEqual(got["1x8192"], naive_flops(1, 8192, 8192))
        self.assertEqual(got["1x32768"], naive_flops(1, 32768, 32768))
        self.assertEqual(got["1x512/8192"], naive_flops(1, 512, 8192))
        self.assertEqual(got["1x512/32768"], naive_flops(1, 512, 32768))
        self.assertEqual(got["8x256/8192"], naive_flops(8, 256, 8192))
        self.assertTrue(got["ragged16/4096"].startswith("n/a (ragged rows skipped"))
        # By hand: 1x8192 sees 8192 * 8193 / 2 = 33558528 pairs; * 2 * 32 * 256.
        self.assertEqual(got["1x8192"], 33558528 * 2 * 32 * 256)
        # 1x512/8192: 512 * 7680 + 512 * 513 / 2 = 4063488 pairs.
        self.assertEqual(got["1x512/8192"], 4063488 * 2 * 32 * 256)

    def test_other_heads_and_non_causal(self):
        got = peer_flops("2x16/64,3x40", "--qo-heads", "16", "--kv-heads", "4", "--head-dim",
                         "64")
        self.assertEqual(got["2x16/64"], naive_flops(2, 16, 64, heads=16, head_dim=64))
        self.assertEqual(got["3x40"], naive_flops(3, 40, 40, heads=16, head_dim=64))
        got = peer_flops("2x16/64", "--non-causal")
        self.assertEqual(got["2x16/64"], naive_flops(2, 16, 64, causal=False))
        self.assertEqual(got["2x16/64"], 2 * 2 * 16 * 64 * 32 * 256)

    def test_names_as_the_bench_writes_them(self):
        self.assertEqual(list(peer_flops("1x64/64,2x8/16,ragged4/32")),
                         ["1x64", "2x8/16", "ragged4/32"])

    def test_bad_rows_are_errors_naming_the_row(self):
        for rows, expected in (("4y8", "'4y8'"), ("2x0", "'2x0'"), ("2x64/32", "'2x64/32'"),
                               ("ragged4", "'ragged4'"), ("x8", "'x8'"), (",", "no rows")):
            result = run_peer("--flops-only", "--rows", rows)
            self.assertEqual(result.returncode, 2, rows)
            self.assertIn(expected, result.stderr, rows)

    def test_rows_from_a_bench_json(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "prefill.json")
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"shape": {"num_qo_heads": 16, "num_kv_heads": 8, "head_dim": 64,
                                     "causal": True},
                           "rows": [{"row": "1x64", "page_size": 16},
                                    {"row": "1x64", "page_size": 1},
                                    {"row": "2x16/64", "page_size": 16}]}, handle)
            result = run_peer("--flops-only", "--rows-from", path)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout.split(), [
                "1x64", str(naive_flops(1, 64, 64, heads=16, head_dim=64)),
                "2x16/64", str(naive_flops(2, 16, 64, heads=16, head_dim=64))])

    def test_help_and_flops_only_never_import_torch(self):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "torch.py"), "w", encoding="utf-8") as handle:
                handle.write("raise ImportError('torch imported')\n")
            env = dict(os.environ, PYTHONPATH=directory)
            self.assertEqual(run_peer("--help", env=env).returncode, 0)
            result = run_peer("--flops-only", "--rows", "1x64", env=env)
            self.assertEqual(result.returncode, 0, result.stderr)


@unittest.skipUnless(len(sys.argv) > 1 or CLI, "no pagedattn binary given")
class AgainstTheBench(unittest.TestCase):
    def test_flops_equal_the_cpu_bench(self):
        """bench prefill --device cpu reports gflops = flops / ns and run_us_median = ns / 1e3,
        so flops = gflops * run_us_median * 1e3 (to rounding)."""
        got = peer_flops("2x16/64,2x64")
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "prefill.json")
            result = subprocess.run(
                [CLI, "bench", "prefill", "--device", "cpu", "--batch", "2", "--kv-len", "64",
                 "--q-len", "16,64", "--page-size", "16", "--min-time", "0.01", "--threads", "1",
                 "--json", path], capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(path, encoding="utf-8") as handle:
                results = json.load(handle)["results"]
        self.assertEqual(len(results), 2)
        for r in results:
            self.assertEqual((r["num_qo_heads"], r["head_dim_qk"], r["head_dim_vo"]),
                             (HEADS, HEAD_DIM, HEAD_DIM))
            name = f"2x{r['q_len']}/64" if r["q_len"] < 64 else "2x64"
            bench = r["gflops"] * r["run_us_median"] * 1e3
            self.assertAlmostEqual(bench / got[name], 1.0, places=9, msg=name)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        CLI = sys.argv.pop(1)
    unittest.main()
