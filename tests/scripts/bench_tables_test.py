#!/usr/bin/env python3
"""Tests of scripts/bench-tables, the writer of bench/RESULTS.md's current tables.

Every cell of every table written from the committed JSON (bench/current/) is checked against
the JSON itself, recomputed here (figure, ceiling, ratio, page-size ratio, target from
bench/targets.json, met); small made-up documents check the corner cases (no target, a missing
page size, the CPU table, a target at most, the throughput table's target on the whole workload
only and its commit from the run's metadata); --update replaces only the marked blocks and fails on
a missing one; and bench/RESULTS.md holds exactly what the writer makes of bench/current/, so
refreshing it is one command. Run by ctest (test bench_tables) or directly.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WRITER = os.path.join(ROOT, "scripts", "bench-tables")
CURRENT = os.path.join(ROOT, "bench", "current")
FIXTURES = os.path.join(ROOT, "tests", "scripts", "fixtures")
with open(os.path.join(ROOT, "bench", "targets.json"), encoding="utf-8") as targets_file:
    TARGETS = json.load(targets_file)


def run_writer(*args, check=True):
    result = subprocess.run([sys.executable, WRITER, *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"bench-tables {args} failed: {result.stderr}")
    return result


def blocks(text):
    """{family: [table rows as lists of cells]} from the marked blocks of `text`."""
    out = {}
    family = None
    for line in text.splitlines():
        if line.startswith("<!-- table:"):
            family = line[len("<!-- table:"):-len(" -->")]
            out[family] = []
        elif line.startswith("<!-- /table:"):
            family = None
        elif family and line.startswith("| ") and not line.startswith("|---"):
            out[family].append([cell.strip() for cell in line.strip("|").split("|")])
    return out


def tables_by_header(rows):
    """Splits a block's rows into tables: each starts at a row whose first cell is a header."""
    tables, current = [], None
    for row in rows:
        if row[0] in ("B x kv_len", "row", "H", "form", "layout", "device"):
            current = {"header": row, "rows": []}
            tables.append(current)
        else:
            current["rows"].append(row)
    return tables


def load(name):
    with open(os.path.join(CURRENT, name), encoding="utf-8") as handle:
        return json.load(handle)


def run_commit(doc):
    """The run's own commit where its JSON names one (metadata.commit), else the --commit given."""
    return doc.get("metadata", {}).get("commit", "abc1234")


def minute(doc):
    """The run's date to the minute, as the tables print it: '2026-12-05T17:08:29Z' ->
    '2026-12-05 17:08Z' (by slicing, not by the writer's regex)."""
    stamp = doc["date"]
    return stamp[:10] + " " + stamp[11:16] + "Z"


def r2(x):
    return f"{x:.2f}"


class CommittedJson(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text = run_writer(CURRENT, "--commit", "abc1234").stdout
        cls.blocks = blocks(cls.text)

    def test_every_family_with_json_has_a_table(self):
        self.assertEqual(set(self.blocks),
                         {"decode", "prefill", "mla", "planner", "cpu", "throughput", "model"})

    def test_decode_rows(self):
        doc = load("decode.json")
        ceiling = doc["ceilings"]["read_gbs"] / 1000.0
        tables = tables_by_header(self.blocks["decode"])
        rows = {row[0]: row for row in tables[0]["rows"]}
        p16 = [r for r in doc["rows"] if r["page_size"] == 16]
        self.assertEqual(len(rows), len(p16))
        for r in p16:
            name = f"{r['batch']}x{r['kv_len']}"
            p1 = [o for o in doc["rows"] if o["page_size"] == 1 and o["batch"] == r["batch"]
                  and o["kv_len"] == r["kv_len"]][0]
            target = TARGETS["decode"]["rows"][name]
            expected = [name, r2(r["kv_tbs"]), r2(ceiling), r2(r["kv_tbs"] / ceiling),
                        r2(p1["kv_tbs"] / r["kv_tbs"]), str(target),
                        "yes" if r["kv_tbs"] >= target else "no", run_commit(doc), minute(doc)]
            self.assertEqual(rows[name], expected)
        graph = {row[0]: row for row in tables[1]["rows"]}
        for g in doc["graphs"]:
            row = graph[f"{g['batch']}x{g['kv_len']}"]
            floor = g.get("graph_floor_wall_us")  # the launch floor, in JSON since it exists
            self.assertEqual(row[1:9], [str(g["layers"]), str(g["page_size"]),
                                        f"{g['graph_step_wall_us']:.1f}",
                                        f"{g['eager_step_wall_us']:.1f}",
                                        f"{floor:.1f}" if floor else "-",
                                        f"{g['graph_step_wall_us'] / floor:.2f}" if floor else "-",
                                        f"{g['graph_host_us_per_step']:.1f}",
                                        f"{g['eager_host_us_per_step']:.1f}"])
        self.assertEqual(graph["1x1024"][9:11], ["<= 160", "no"])  # 256.8 us against 160

    def test_prefill_rows(self):
        doc = load("prefill.json")
        ceiling = doc["ceilings"]["matmul_bf16_tflops"]
        # The run's own commit where its JSON names one, else --commit.
        commit = run_commit(doc)
        peer = None
        if os.path.exists(os.path.join(CURRENT, "prefill_sdpa.json")):
            peer = {r["row"]: r for r in load("prefill_sdpa.json")["rows"]}
        tables = tables_by_header(self.blocks["prefill"])
        rows = {row[0]: row for table in tables for row in table["rows"]}
        # A run of P 16 alone (--page-size 16) has no P 1 / P 16 column.
        with_p1 = any(o["page_size"] == 1 for o in doc["rows"])
        for r in [r for r in doc["rows"] if r["page_size"] == 16]:
            target = TARGETS["prefill"]["rows"].get(r["row"])
            expected = [r["row"], f"{r['tflops']:.1f}", f"{ceiling:.1f}",
                        r2(r["tflops"] / ceiling)]
            if with_p1:
                p1 = [o for o in doc["rows"] if o["page_size"] == 1 and o["row"] == r["row"]][0]
                expected.append(r2(p1["tflops"] / r["tflops"]))
            if peer is not None:
                backends = peer.get(r["row"], {}).get("backends", {})
                cudnn = backends.get("cudnn")
                others = [(b["tflops"], name) for name, b in backends.items()
                          if name != "cudnn" and "tflops" in b]
                expected += [f"{cudnn['tflops']:.1f}" if cudnn else "n/a",
                             f"{max(others)[1]} {max(others)[0]:.1f}" if others else "n/a",
                             r2(r["tflops"] / cudnn["tflops"]) if cudnn else "-"]
            expected += [str(target) if target else "-",
                         ("yes" if r["tflops"] >= target else "no") if target else "-", commit,
                         minute(doc)]
            self.assertEqual(rows[r["row"]], expected)

    def test_mla_rows(self):
        doc = load("mla.json")
        rows = {(row[0], row[1]): row for row in tables_by_header(self.blocks["mla"])[0]["rows"]}
        main = [r for r in doc["rows"] if r["page_size"] == 64]
        self.assertEqual(len(rows), len(main))
        for r in main:
            name = f"{r['batch']}x{r['kv_len']}"
            p1 = [o for o in doc["rows"] if o["page_size"] == 1 and o["heads"] == r["heads"]
                  and o["batch"] == r["batch"] and o["kv_len"] == r["kv_len"]][0]
            if r["heads"] == 128:  # compute-bound rows, in TFLOP/s against cuBLAS
                value, ceiling = r["tflops"], doc["ceilings"]["matmul_bf16_tflops"]
                cells = [f"{value:.1f} TFLOP/s", f"{ceiling:.1f} (cuBLAS)"]
                page_ratio = p1["tflops"] / value
            else:  # read-bound rows, in TB/s against the streaming read
                value, ceiling = r["latent_tbs"], doc["ceilings"]["read_gbs"] / 1000.0
                cells = [f"{value:.2f} TB/s", f"{ceiling:.2f} (read)"]
                page_ratio = p1["latent_tbs"] / value
            target = TARGETS["mla"]["rows"][f"{r['heads']}:{name}"]
            self.assertEqual(rows[(str(r["heads"]), name)], [
                str(r["heads"]), name, *cells, r2(value / ceiling), r2(page_ratio), str(target),
                "yes" if value >= target else "no", run_commit(doc), minute(doc)])

    def test_planner_rows(self):
        doc = load("plan.json")
        rows = {(row[0], row[1]): row
                for row in tables_by_header(self.blocks["planner"])[0]["rows"]}
        for r in doc["rows"]:
            row = rows[(r["form"], f"{r['batch']}x{r['kv_len']}")]
            column = {1: 2, 16: 3, 64: 4}[r["page_size"]]
            self.assertEqual(row[column], f"{r['gpu_us']:.1f} / {r['host_us']:.2f}")
            ratios = row[5].split(", ")
            self.assertEqual(ratios[column - 2], r2(r["host_us"] / r["gpu_us"]))
        self.assertEqual(len(rows) * 3, len(doc["rows"]))

    def test_throughput_rows(self):
        names = sorted(n for n in os.listdir(CURRENT) if n.startswith("throughput"))
        self.assertTrue(names)
        rows = tables_by_header(self.blocks["throughput"])[0]["rows"]
        expected = []
        for name in names:
            doc = load(name)
            for r in doc["rows"]:
                total = r["workload_requests"]
                workload = (f"all {total}" if r["requests"] == total
                            else f"first {r['requests']} of {total}")
                if r["max_input_len"]:
                    workload += f", prompts <= {r['max_input_len']}"
                if r["max_output_len"]:
                    workload += f", outputs <= {r['max_output_len']}"
                whole = workload == f"all {total}"
                target = TARGETS["throughput"]["rows"].get(f"{r['device']}:{r['model']}")
                target = target if whole else None
                expected.append([
                    f"{r['device']} ({doc['machine']})", r["model"], workload,
                    str(r["prompt_tokens"]), str(r["output_tokens"]), f"{r['output_tok_s']:.1f}",
                    f"{r['total_tok_s']:.1f}", f"{r['roofline_output_tok_s']:.1f}",
                    r2(r["output_tok_s"] / r["roofline_output_tok_s"]),
                    f"{doc['ceilings']['read_gbs']:.1f} GB/s, "
                    f"{doc['ceilings']['gemm_gflops']:.1f} GFLOP/s",
                    str(r["steps"]), f"{r['host_ms_median']:.3f}", f"{r['forward_ms_median']:.3f}",
                    f"{r['other_cores']:.2f}" if r.get("other_cores", -1) >= 0 else "-",
                    (f"{100 * r['gpu_idle_steady_decode']:.1f}%"
                     if "gpu_idle_steady_decode" in r else "-"),
                    str(target) if target is not None else "-",
                    ("yes" if r["ratio"] >= target else "no") if target is not None else "-",
                    doc.get("metadata", {}).get("commit") or "abc1234",
                    re.sub(r"T(\d\d:\d\d).*", r" \1Z", doc["date"])])
        self.assertEqual(rows, expected)


class MadeUpDocuments(unittest.TestCase):
    def write(self, directory, name, doc):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            json.dump(doc, handle)

    def test_cpu_table_target_and_commit_file(self):
        with tempfile.TemporaryDirectory() as directory:
            row = {"batch": 16, "kv_len": 4096, "layout": "NHD", "page_size": 16,
                   "kv_gbs": 50.0, "memory_bandwidth_gbs": 80.0}
            self.write(directory, "cpu_decode_NHD.json", {
                "benchmark": "decode", "device": "cpu", "machine": "Test CPU",
                "timestamp": "2026-01-02T03:04:05Z",
                "results": [row, dict(row, batch=1, kv_gbs=60.0),
                            dict(row, batch=2, kv_gbs=10.0)]})
            with open(os.path.join(directory, "commit.txt"), "w", encoding="utf-8") as handle:
                handle.write("feed123\n")
            rows = tables_by_header(blocks(run_writer(directory).stdout)["cpu"])[0]["rows"]
            # 50 / 80 = 0.625 >= 0.6 (B 16, both layouts); 60 / 80 = 0.75 >= 0.7 (NHD B 1);
            # B 2 has no target.
            self.assertEqual(rows[0], ["NHD", "16x4096", "16", "50.0", "80.0", "0.62", "0.6", "yes",
                                       "feed123", "2026-01-02 03:04Z"])
            self.assertEqual(rows[1][5:8], ["0.75", "0.7", "yes"])
            self.assertEqual(rows[2][5:8], ["0.12", "-", "-"])

    def test_prefill_extend_rows_and_sdpa_peer(self):
        """Extend rows (BxQ/L) get a table of their own; with the peer's JSON
        (tests/scripts/fixtures/prefill_sdpa.json, scripts/sdpa-peer's format) each row gets
        cuDNN's TFLOP/s, the best other SDPA backend and pagedattn / cuDNN."""
        with open(os.path.join(FIXTURES, "prefill_sdpa.json"), encoding="utf-8") as handle:
            peer = json.load(handle)
        row = {"page_size": 16, "target_tflops": 0}
        prefill = {"benchmark": "cuda_prefill", "date": "2026-01-02T03:04:05Z", "reps": 10,
                   "ceilings": {"matmul_bf16_tflops": 700.0, "matmul_size": 8192},
                   "shape": {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                             "dtype": "bf16", "causal": True},
                   "rows": [dict(row, row="1x8192", section="prefill", tflops=350.0),
                            dict(row, row="1x8192", section="prefill", page_size=1,
                                 tflops=315.0),
                            dict(row, row="ragged16/4096", section="prefill", tflops=300.0),
                            dict(row, row="1x512/8192", section="extend", tflops=200.0),
                            dict(row, row="8x256/8192", section="extend", tflops=250.0),
                            dict(row, row="1x512/32768", section="extend", tflops=280.0)]}
        date = "2026-01-02 03:04Z"
        with tempfile.TemporaryDirectory() as directory:
            self.write(directory, "prefill.json", prefill)
            # Without the peer: the columns as before, the extend rows apart.
            plain = tables_by_header(blocks(run_writer(directory, "--commit", "c1").stdout)[
                "prefill"])
            self.assertEqual(len(plain), 2)
            self.assertEqual(plain[0]["header"], ["row", "P 16 TFLOP/s", "cuBLAS bf16 TFLOP/s",
                                                  "ratio", "P 1 / P 16", "target TFLOP/s", "met",
                                                  "commit", "date"])
            self.assertEqual([r[0] for r in plain[0]["rows"]], ["1x8192", "ragged16/4096"])
            self.assertEqual([r[0] for r in plain[1]["rows"]],
                             ["1x512/8192", "8x256/8192", "1x512/32768"])
            self.assertNotIn("SDPA", run_writer(directory, "--commit", "c1").stdout)
            # With the peer.
            self.write(directory, "prefill_sdpa.json", peer)
            text = run_writer(directory, "--commit", "c1").stdout
            self.assertIn("torch 2.11.0's SDPA", text)
            merged = tables_by_header(blocks(text)["prefill"])
            self.assertEqual(merged[0]["header"][5:8], ["cuDNN SDPA TFLOP/s", "best other SDPA",
                                                        "pagedattn / cuDNN"])
            # 350 / 605 = 0.5785...; flash 320 beats efficient 274.9; target 620 not met.
            self.assertEqual(merged[0]["rows"][0],
                             ["1x8192", "350.0", "700.0", "0.50", "0.90", "605.0", "flash 320.0",
                              "0.58", "620", "no", "c1", date])
            # Skipped by the peer (ragged): no figures.
            self.assertEqual(merged[0]["rows"][1][5:8], ["n/a", "n/a", "-"])
            extend = {r[0]: r for r in merged[1]["rows"]}
            self.assertEqual(merged[1]["header"][4:7], ["cuDNN SDPA TFLOP/s", "best other SDPA",
                                                        "pagedattn / cuDNN"])
            # cuDNN n/a: the best other is efficient (266.3 > 221.9), no ratio.
            self.assertEqual(extend["1x512/8192"][4:7], ["n/a", "efficient 266.3", "-"])
            # 250 / 338.2 = 0.739...
            self.assertEqual(extend["8x256/8192"][4:7], ["338.2", "n/a", "0.74"])
            # A row the peer has not run.
            self.assertEqual(extend["1x512/32768"][4:7], ["n/a", "n/a", "-"])
            self.assertEqual(extend["1x512/32768"][7:], ["-", "-", "c1", date])

    def test_decode_without_second_page_size_or_target(self):
        with tempfile.TemporaryDirectory() as directory:
            self.write(directory, "decode.json", {
                "benchmark": "cuda_decode", "date": "2026-01-02T03:04:05Z", "reps": 3,
                "l2_flush": "clean", "ceilings": {"read_gbs": 2000.0, "device": "Test GPU"},
                "shape": {}, "rows": [
                    {"batch": 3, "kv_len": 100, "page_size": 16, "kv_tbs": 1.5},
                    {"batch": 1, "kv_len": 8192, "page_size": 16, "kv_tbs": 2.5},
                    {"batch": 1, "kv_len": 8192, "page_size": 1, "kv_tbs": 2.0}]})
            rows = tables_by_header(blocks(run_writer(directory, "--commit", "c1").stdout)[
                "decode"])[0]["rows"]
            self.assertEqual(rows[0], ["3x100", "1.50", "2.00", "0.75", "-", "-", "-", "c1",
                                       "2026-01-02 03:04Z"])
            # 2.5 TB/s against issue 18's 2.2: met; P 1 / P 16 = 0.8.
            self.assertEqual(rows[1], ["1x8192", "2.50", "2.00", "1.25", "0.80", "2.2", "yes", "c1",
                                       "2026-01-02 03:04Z"])

    def test_decode_graph_step_beside_its_floor(self):
        with tempfile.TemporaryDirectory() as directory:
            graph = {"batch": 1, "kv_len": 1024, "layers": 32, "page_size": 16,
                     "graph_step_wall_us": 140.0, "eager_step_wall_us": 300.0,
                     "graph_host_us_per_step": 5.0, "eager_host_us_per_step": 150.0}
            self.write(directory, "decode.json", {
                "benchmark": "cuda_decode", "date": "2026-01-02T03:04:05Z", "reps": 3,
                "l2_flush": "clean", "ceilings": {"read_gbs": 2000.0, "device": "Test GPU"},
                "shape": {}, "rows": [{"batch": 3, "kv_len": 100, "page_size": 16, "kv_tbs": 1.5}],
                "graphs": [dict(graph, graph_floor_wall_us=35.0),
                           dict(graph, batch=8, graph_step_wall_us=500.0)]})
            tables = tables_by_header(blocks(run_writer(directory, "--commit", "c1").stdout)[
                "decode"])
            self.assertEqual(tables[1]["header"][5:7], ["floor us", "graph / floor"])
            # 140 / 35 = 4.00; 140 us against issue 18's 160: met. B 8 has no floor (older JSON)
            # and no target.
            self.assertEqual(tables[1]["rows"][0],
                             ["1x1024", "32", "16", "140.0", "300.0", "35.0", "4.00", "5.0",
                              "150.0", "<= 160", "yes", "c1", "2026-01-02 03:04Z"])
            self.assertEqual(tables[1]["rows"][1][5:7], ["-", "-"])
            self.assertEqual(tables[1]["rows"][1][9:11], ["-", "-"])

    def test_throughput_target_only_for_the_whole_workload(self):
        with tempfile.TemporaryDirectory() as directory:
            row = {"device": "cuda", "model": "qwen3-0.6b", "requests": 256,
                   "workload_requests": 256, "max_input_len": 0, "max_output_len": 0,
                   "prompt_tokens": 142827, "output_tokens": 133966, "output_tok_s": 9000.0,
                   "total_tok_s": 18000.0, "roofline_output_tok_s": 12000.0, "ratio": 0.75,
                   "steps": 1100, "host_ms_median": 0.5, "forward_ms_median": 9.0,
                   "gpu_idle_steady_decode": 0.0312}
            doc = {"benchmark": "throughput", "date": "2026-01-02T03:04:05Z", "machine": "GPU",
                   "ceilings": {"read_gbs": 4400.0, "gemm_gflops": 790000.0},
                   "metadata": {"commit": "run0001"}, "rows": [row]}
            self.write(directory, "throughput_a.json", doc)
            subset = dict(row, requests=16, max_output_len=64, ratio=0.1, other_cores=0.5)
            self.write(directory, "throughput_b.json", dict(doc, metadata={}, rows=[subset]))
            rows = tables_by_header(blocks(run_writer(directory, "--commit", "dir0001").stdout)[
                "throughput"])[0]["rows"]
            # 0.75 >= issue 16's 0.67: met; the subset has no target; its commit is the folder's.
            self.assertEqual(rows[0][2], "all 256")
            self.assertEqual(rows[0][8], "0.75")
            # No other_cores; 3.1% of the steady decode time idle.
            self.assertEqual(rows[0][13:18], ["-", "3.1%", "0.67", "yes", "run0001"])
            self.assertEqual(rows[1][2], "first 16 of 256, outputs <= 64")
            self.assertEqual(rows[1][13:18], ["0.50", "3.1%", "-", "-", "dir0001"])

    def test_model_rows_and_targets(self):
        with tempfile.TemporaryDirectory() as directory:
            decode = {"kind": "decode", "batch": 64, "context": 1024, "tokens": 64,
                      "ms_median": 2.6, "tok_s": 24615.4, "tflops": 0.1, "floor_ms": 2.0,
                      "memory_bound": True, "x_floor": 1.3, "of_gemm_ceiling": 0.01}
            prefill = {"kind": "prefill", "batch": 1, "length": 2048, "tokens": 2048,
                       "ms_median": 5.0, "tok_s": 409600.0, "tflops": 450.0, "floor_ms": 3.1,
                       "memory_bound": False, "x_floor": 1.61, "of_gemm_ceiling": 0.59}
            self.write(directory, "model_qwen.json", {
                "benchmark": "model", "date": "2026-01-02T03:04:05Z", "machine": "GPU",
                "device": "cuda", "model": {"name": "qwen3-0.6b"},
                "ceilings": {"read_gbs": 4400.0, "gemm_gflops": 760000.0},
                "metadata": {"commit": "run0002"},
                "rows": [decode, prefill, dict(decode, batch=16, x_floor=3.0)]})
            self.write(directory, "model_cpu.json", {
                "benchmark": "model", "date": "2026-01-02T03:04:05Z", "machine": "CPU",
                "device": "cpu", "model": {"name": "qwen3-0.6b"},
                "ceilings": {"read_gbs": 8.0, "gemm_gflops": 40.0}, "rows": [decode]})
            rows = tables_by_header(blocks(run_writer(directory, "--commit", "dir0002").stdout)[
                "model"])[0]["rows"]
            # Files in name order: model_cpu.json first (no targets off the GPU).
            self.assertEqual(rows[0][:3], ["cpu (CPU)", "qwen3-0.6b", "decode 64 x 1024"])
            self.assertEqual(rows[0][12:15], ["-", "-", "dir0002"])
            # 1.3 <= 1.3: met; 0.59 < 0.6: not met; B 16 has no target.
            self.assertEqual(rows[1][2:5], ["decode 64 x 1024", "64", "2.600"])
            self.assertEqual(rows[1][7:11], ["2.000", "memory", "1.30", "0.01"])
            self.assertEqual(rows[1][11], "4400.0 GB/s, 760000.0 GFLOP/s")
            self.assertEqual(rows[1][12:15], ["x floor <= 1.3", "yes", "run0002"])
            self.assertEqual(rows[2][2], "prefill 1 x 2048")
            self.assertEqual(rows[2][8:11], ["compute", "1.61", "0.59"])
            self.assertEqual(rows[2][12:14], ["of GEMM >= 0.6", "no"])
            self.assertEqual(rows[3][12:14], ["-", "-"])

    def test_no_json_is_an_error(self):
        with tempfile.TemporaryDirectory() as directory:
            result = run_writer(directory, check=False)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("no bench JSON", result.stderr)


class Update(unittest.TestCase):
    def test_replaces_only_marked_blocks(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "RESULTS.md")
            blocks_text = "\n".join(f"<!-- table:{f} -->\nold {f}\n<!-- /table:{f} -->"
                                    for f in ("decode", "prefill", "mla", "planner", "cpu",
                                              "throughput", "model"))
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(f"# head\n\n{blocks_text}\n\ntail text\n")
            keep = os.path.join(directory, "kept")
            run_writer(CURRENT, "--commit", "x", "--update", path, "--keep", keep)
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            self.assertTrue(text.startswith("# head\n"))
            self.assertTrue(text.endswith("\n\ntail text\n"))
            for family in ("decode", "prefill", "mla", "planner", "cpu", "throughput", "model"):
                self.assertNotIn(f"old {family}", text)
            throughput = sorted(n for n in os.listdir(CURRENT)
                                if n.startswith("throughput") or n.startswith("model") or
                                n.startswith("cpu_decode"))
            peer = [n for n in os.listdir(CURRENT) if n == "prefill_sdpa.json"]
            self.assertEqual(sorted(os.listdir(keep)),
                             sorted(["commit.txt", "decode.json", "mla.json", "plan.json",
                                     "prefill.json"] + throughput + peer))

    def test_missing_block_is_an_error(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "RESULTS.md")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("<!-- table:decode -->\nx\n<!-- /table:decode -->\n")
            result = run_writer(CURRENT, "--update", path, check=False)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("no <!-- table:prefill --> block", result.stderr)


def raw_blocks(text):
    """{family: the text of its marked block, markers included}."""
    found = re.findall(r"(<!-- table:(\w+) -->\n.*?\n<!-- /table:\2 -->)", text, re.S)
    return {family: block for block, family in found}


class ResultsMd(unittest.TestCase):
    def test_results_md_is_what_the_writer_makes_of_bench_current(self):
        expected = raw_blocks(run_writer(CURRENT).stdout)
        self.assertEqual(set(expected),
                         {"decode", "prefill", "mla", "planner", "cpu", "throughput", "model"})
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), encoding="utf-8") as handle:
            actual = raw_blocks(handle.read())
        for family, block in expected.items():
            self.assertEqual(actual.get(family), block, f"bench/RESULTS.md table {family}: "
                             "run scripts/bench-tables bench/current --update bench/RESULTS.md")


if __name__ == "__main__":
    unittest.main()
