#!/usr/bin/env python3
"""Tests of scripts/sass-hotspots on a small SASS page written here in ncu's CSV shape: the
groups by execution count, the shares, the stall reasons and the hottest instructions against
figures worked out by hand, and a clear error for a file that is not such a page. Run by ctest
(test sass_hotspots) or directly."""

import csv
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "scripts", "sass-hotspots")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed", "stall_barrier",
          "stall_long_sb", "stall_wait", "stall_barrier (Not Issued)"]
# (source, samples, executions, barrier, long_sb, wait): 100 samples in all; executed 64 times a
# region of three (60 samples), 8 times a region of two (40), once one instruction (0).
ROWS = [("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 10, 64, 0, 0, 10),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 30, 64, 30, 0, 0),
        ("FMUL R1, R2, R3", 20, 64, 0, 0, 20),
        ("@!P0 BRA 0x7f00", 35, 8, 0, 35, 0),
        ("STG.E desc[UR12][R2.64], R5", 5, 8, 0, 0, 5),
        ("EXIT", 0, 1, 0, 0, 0)]


def write_page(path, rows=ROWS, header=HEADER):
    with open(path, "w", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_ALL)
        out.writerow(["Kernel Name", "void demo_kernel(int)"])
        out.writerow(header)
        for i, (source, samples, executed, barrier, long_sb, wait) in enumerate(rows):
            out.writerow([f"0x{16 * i:x}", source, samples, samples, executed, barrier, long_sb,
                          wait, 0])


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def table_rows(text, title):
    """The data rows of the table after the line starting with `title`, split on 2+ spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        body.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return body


class SassHotspots(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.page = os.path.join(self.dir.name, "page.csv")
        write_page(self.page)

    def tearDown(self):
        self.dir.cleanup()

    def test_totals_and_reasons(self):
        result = run(self.page)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("demo_kernel", result.stdout)
        self.assertIn("6 instructions, 100 samples", result.stdout)
        # long_sb 35, wait 35, barrier 30 of 100; the "(Not Issued)" column is not a reason
        self.assertIn("stall reasons: long_sb 35.0%, wait 35.0%, barrier 30.0%", result.stdout)

    def test_groups_by_execution_count(self):
        rows = table_rows(run(self.page).stdout, "executions")
        self.assertEqual(rows, [["64", "3", "0", "60.0"], ["8", "2", "3", "40.0"],
                                ["1", "1", "5", "0.0"]])

    def test_hottest_instructions(self):
        rows = table_rows(run(self.page, "--top", "3").stdout, "index")
        self.assertEqual([row[:3] for row in rows],
                         [["3", "35.00", "8"], ["1", "30.00", "64"], ["2", "20.00", "64"]])
        self.assertEqual(rows[0][3:], ["@!P0 BRA 0x7f00", "long_sb 100%"])
        self.assertEqual(rows[1][3:], ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "barrier 100%"])

    def test_two_pages_side_by_side(self):
        other = os.path.join(self.dir.name, "other.csv")
        write_page(other, ROWS[:3])  # only the 64-execution region: all 60 samples
        rows = table_rows(run(self.page, other).stdout, "executions")
        self.assertEqual(rows[0], ["64", "3", "0", "60.0", "3", "0", "100.0"])
        self.assertEqual(rows[1], ["8", "2", "3", "40.0", "-", "-", "-"])

    def test_not_a_sass_page(self):
        bad = os.path.join(self.dir.name, "bad.csv")
        with open(bad, "w") as f:
            f.write('"Kernel Name","k"\n"ID","Metric Name"\n')
        result = run(bad)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no 'Address' header row", result.stderr)
        write_page(bad, header=[h for h in HEADER if h != "Instructions Executed"])
        result = run(bad)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no column 'Instructions Executed'", result.stderr)


if __name__ == "__main__":
    unittest.main()
