#!/usr/bin/env python3
"""CPU checks of bench/plot_runner.py's reading and floor (no matplotlib needed): the preset shapes
against `epmoe bench runner --dry-run`, both summary-table shapes, the skip marker and the copy rate
a table takes, the check of a printed ratio against the script's floor, and the committed results.
usage: plot_runner_test.py [path of the epmoe CLI]"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
spec = importlib.util.spec_from_file_location("plot_runner", os.path.join(ROOT, "bench", "plot_runner.py"))
pr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pr)
CLI = sys.argv[1] if len(sys.argv) > 1 else None

TABLES = """# results
HBM copy was 4000 GB/s.

| preset | M | bf16 | fp8 | nvfp4 | nvfp4 / fp8 |
|---|---|---|---|---|---|
| DeepSeek-V3 | 128 | 2.543 (1.05) | 1.324 | 1.160 | 0.88 |
| | 2048 | 2.634, SM 1500 MHz | 1.408 | 0.963 (nvfp4w) | 0.68 |
| Qwen3-30B | 128 | 0.162 | - | 0.101 | |

<!-- plot: skip -->
| preset | M | bf16 | fp8 | nvfp4 |
|---|---|---|---|---|
| DeepSeek-V3 | 128 | 9.999 | 9.999 | 9.999 |

## Later, HBM copy 4200 GB/s

| preset | M | format | uniform ms (floor / time) | router ms | router / uniform | skew ms | skew / uniform |
|---|---|---|---|---|---|---|---|
| mixtral-8x7b | 8192 | fp8 | 2.561 | 2.746 | 1.07 | **2.584** | 1.01 |
"""


class Reading(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".md", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_both_table_shapes_the_skip_marker_and_the_copy_rate(self):
        pts = dict(pr.read_points(self.write(TABLES)))
        self.assertEqual(pts[("deepseek-v3", 128, "bf16", "uniform")], (2.543, 4000.0, 1.05))
        self.assertEqual(pts[("deepseek-v3", 2048, "bf16", "uniform")][0], 2.634)  # the empty preset repeats
        self.assertEqual(pts[("deepseek-v3", 2048, "nvfp4", "uniform")], (0.963, 4000.0, None))
        self.assertNotIn(("qwen3-30b-a3b", 128, "fp8", "uniform"), pts)  # "-" is no time
        self.assertEqual(pts[("qwen3-30b-a3b", 128, "nvfp4", "uniform")][0], 0.101)
        self.assertNotIn(9.999, [v[0] for v in pts.values()])  # after the skip marker
        self.assertEqual(pts[("mixtral-8x7b", 8192, "fp8", "uniform")], (2.561, 4200.0, None))
        self.assertEqual(pts[("mixtral-8x7b", 8192, "fp8", "router")][0], 2.746)
        self.assertEqual(pts[("mixtral-8x7b", 8192, "fp8", "skew")][0], 2.584)
        self.assertEqual(len(pts), 11)

    def test_the_floor_is_the_benchs(self):
        # DeepSeek-V3 bf16 at M 128 streams 128 experts x 3 x 7168 x 2048 x 2 bytes at 0.9 x copy.
        self.assertAlmostEqual(pr.floor_ms("deepseek-v3", "bf16", 128, 4000.0),
                               128 * 3 * 7168 * 2048 * 2 / (0.9 * 4000e9) * 1e3)
        # Mixtral fp8 at M 32768 is bound by FLOPs at 1100 TFLOP/s.
        self.assertAlmostEqual(pr.floor_ms("mixtral-8x7b", "fp8", 32768, 4000.0),
                               2 * 32768 * 3 * 4096 * 14336 / 1100e12 * 1e3)
        # nvfp4: 4.5 bits per weight with its e4m3 scale per 16.
        self.assertAlmostEqual(pr.weight_bytes("qwen3-30b-a3b", "nvfp4") / pr.weight_bytes("qwen3-30b-a3b", "bf16"),
                               4.5 / 16)

    def test_a_printed_ratio_that_disagrees_stops_the_plot(self):
        d = tempfile.mkdtemp()
        self.addCleanup(lambda: (os.unlink(os.path.join(d, "a.md")), os.rmdir(d)))
        with open(os.path.join(d, "a.md"), "w") as f:
            f.write(TABLES.replace("2.543 (1.05)", "2.543 (0.50)"))
        with self.assertRaisesRegex(SystemExit, "accounting differs"):
            pr.latest_points(d)

    def test_the_committed_results_cover_every_preset(self):
        latest, _ = pr.latest_points(os.path.join(ROOT, "bench", "results"))  # raises on a ratio mismatch
        for p in pr.SHAPES:
            for fmt in pr.FORMATS:
                for M in (8192, 32768):
                    self.assertIn((p, M, fmt, "uniform"), latest)

    @unittest.skipIf(CLI is None, "no epmoe CLI given")
    def test_the_shapes_are_the_benchs(self):
        out = subprocess.run([CLI, "bench", "runner", "--dry-run", "--preset", "all", "--m", "128"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        seen = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
                for m in re.finditer(r"dry run \(no GPU\): (\S+) H=(\d+) I=(\d+), (\d+) local experts", out)}
        self.assertEqual(seen, pr.SHAPES)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
