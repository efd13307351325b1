#!/usr/bin/env python3
"""CPU checks of bench/torch_grouped_mm.py (no GPU): flags, the plan (routing, rows per expert,
floor) against `epmoe bench runner`'s definitions, the bf16 MLP through torch's CPU grouped GEMM
against a per-expert loop, the fp8 calls against torch's own shape/layout checks (meta tensors) and
an emulation of the row-wise scaled GEMM, and the rows a refusal or a memory shortfall prints."""
import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "bench", "torch_grouped_mm.py"))
spec = importlib.util.spec_from_file_location("torch_grouped_mm", SCRIPT)
tgm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tgm)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=240)


def loop_reference(x, w13, w2, counts):
    """The expert MLP one expert at a time in float32 (w13, w2 in the [E, out, in] layout)."""
    I = w2.shape[2]
    out, row = [], 0
    for e, c in enumerate(counts):
        xs = x[row:row + c].float()
        h = xs @ w13[e].float().T
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        out.append(a @ w2[e].float().T)
        row += c
    return torch.cat(out)


class Flags(unittest.TestCase):
    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for flag in ("--preset", "--m", "--quick", "--routing", "--skew", "--formats", "--local-experts", "--reps",
                     "--dry-run"):
            self.assertIn(flag, r.stdout)

    def test_bad_flags_exit_2_naming_the_flag(self):
        for args, msg in ((["--preset", "nope"], "--preset: unknown preset 'nope'"),
                          (["--m", "128,x"], "--m: 'x'"), (["--m", "0"], "--m: '0'"),
                          (["--formats", "nvfp4"], "--formats: unknown format 'nvfp4'"),
                          (["--reps", "0"], "--reps: 0"), (["--local-experts", "-1"], "--local-experts: -1"),
                          (["--routing", "zipf"], "--routing: invalid choice: 'zipf'")):
            r = run(*args, "--dry-run")
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(msg, r.stderr)

    def test_defaults_mirror_the_runner_bench(self):
        a = tgm.parse_args([])
        self.assertEqual(a.presets, ["deepseek-v3"])
        self.assertEqual(a.Ms, [128, 512, 2048, 4096, 8192, 16384, 32768, 131072])
        self.assertEqual((a.fmts, a.reps), (["bf16", "fp8"], 7))
        q = tgm.parse_args(["--quick"])
        self.assertEqual((q.Ms, q.reps), ([128, 2048, 32768], 3))
        self.assertEqual(tgm.parse_args(["--preset", "all"]).presets,
                         ["deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"])
        self.assertEqual([tgm.reps_for(M, 7) for M in (16384, 32768, 131072)], [7, 3, 3])

    def test_dry_run_prints_the_points(self):
        r = run("--dry-run", "--preset", "all", "--quick")
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in ("deepseek-v3: H=7168 I=2048, 128 local experts", "qwen3-235b-a22b: H=4096 I=1536, 64 local",
                     "mixtral-8x7b: H=4096 I=14336, 4 local", "gpt-oss-120b: H=2880 I=2880, 64 local"):
            self.assertIn(name, r.stdout)
        # DeepSeek-V3 at M 128: one row per expert; skewed, 76 experts (12 hot + 64) get rows.
        self.assertIn("| 128 | 128/128 experts get rows, 1..1 rows each | 76/128 experts get rows, 1..6 rows each "
                      "| bf16 | 2.973 | 1.765 | 3 |", r.stdout)


class Plan(unittest.TestCase):
    def test_rows_per_expert_counts_the_runner_routing(self):
        for E in (1, 4, 7, 10, 64, 128):
            for M in (1, 5, 37, 128, 513, 2048, 4099):
                for skew in (False, True):
                    want = [0] * E
                    for j in range(M):
                        want[tgm.expert_of(j, M, E, skew)] += 1
                    self.assertEqual(tgm.rows_per_expert(M, E, skew), want, (E, M, skew))

    def test_skew_flag_is_short_for_routing_skew(self):
        self.assertEqual(tgm.parse_args(["--skew"]).routing, "skew")
        self.assertEqual(tgm.parse_args([]).routing, "uniform")
        a = tgm.parse_args(["--routing", "router"])
        self.assertEqual((a.routing, a.skew), ("router", False))

    def test_router_rows_follow_the_preset_router(self):
        E_local = 128
        ids = tgm.router_ids("deepseek-v3", 8192, E_local)
        self.assertEqual(ids.numel(), 8192)
        self.assertTrue(bool((ids >= 0).all()) and bool((ids < E_local).all()))
        # Reproducible, and a smaller M is a prefix of the same stream (as in the runner bench).
        self.assertTrue(torch.equal(tgm.router_ids("deepseek-v3", 8192, E_local), ids))
        self.assertTrue(torch.equal(tgm.router_ids("deepseek-v3", 1000, E_local), ids[:1000]))
        counts = tgm.routed_counts("deepseek-v3", 8192, E_local, "router")
        self.assertEqual(sum(counts), 8192)
        # Every local expert touched, unevenly (random logits spread the load around the mean of 64).
        self.assertGreater(min(counts), 0)
        self.assertGreater(max(counts), 64)
        self.assertEqual(tgm.routed_counts("deepseek-v3", 100, E_local, "skew"), tgm.rows_per_expert(100, E_local, True))

    def test_grouped_router_keeps_topk_group_groups(self):
        g = torch.Generator().manual_seed(7)
        logits = torch.randn(512, 256, generator=g)
        ids = tgm.route_topk(logits, ("sigmoid", 8, 4), 8, torch)
        self.assertEqual(tuple(ids.shape), (512, 8))
        for row in ids.tolist():
            self.assertEqual(len(set(row)), 8)
            self.assertLessEqual(len({e // 32 for e in row}), 4)
        # Within the kept groups the picks are the best sigmoid scores: no better expert of a kept
        # group is left out.
        s = torch.sigmoid(logits)
        for t, row in enumerate(ids.tolist()):
            groups = {e // 32 for e in row}
            worst = min(s[t, e].item() for e in row)
            for e in range(256):
                if e // 32 in groups and e not in row:
                    self.assertLessEqual(s[t, e].item(), worst)
        soft = tgm.route_topk(logits, ("softmax",), 4, torch)
        self.assertTrue(torch.equal(soft, torch.topk(logits, 4, dim=1).indices))

    def test_uniform_matches_the_cublas_loop_split(self):
        M, E = 1000, 128
        self.assertEqual(tgm.rows_per_expert(M, E, False), [M // E + (1 if e < M % E else 0) for e in range(E)])
        self.assertEqual(tgm.offsets([2, 0, 3]), [2, 2, 5])

    def test_floor(self):
        H, I, E = 7168, 2048, 128
        # bf16 M 128: 128 experts' weights over 0.9 x 4214 GB/s.
        c = tgm.rows_per_expert(128, E, False)
        self.assertAlmostEqual(tgm.floor_ms("bf16", 128, H, I, c, 4214), 128 * 3 * H * I * 2 / (0.9 * 4214e9) * 1e3)
        # fp8 counts the runner's 128x128 block scales.
        el = 3 * H * I
        self.assertAlmostEqual(tgm.floor_ms("fp8", 128, H, I, c, 4214), 128 * (el + el / 16384 * 4) / (0.9 * 4214e9) * 1e3)
        # Compute bound at large M: FLOPs / P.
        c = tgm.rows_per_expert(131072, E, False)
        self.assertAlmostEqual(tgm.floor_ms("bf16", 131072, H, I, c, 4214), 2 * 131072 * 3 * H * I / 700e12 * 1e3)
        self.assertAlmostEqual(tgm.floor_ms("fp8", 131072, H, I, c, 4214), 2 * 131072 * 3 * H * I / 1100e12 * 1e3)
        # Skewed M 128: only the 76 experts that receive rows are read.
        c = tgm.rows_per_expert(128, E, True)
        self.assertAlmostEqual(tgm.floor_ms("bf16", 128, H, I, c, 4214), 76 * el * 2 / (0.9 * 4214e9) * 1e3)

    def test_memory_estimate_covers_weights_and_grows_with_M(self):
        H, I, E = 7168, 2048, 128
        self.assertGreaterEqual(tgm.memory_needed("bf16", E, H, I, 0), E * 3 * H * I * 2)
        self.assertGreater(tgm.memory_needed("fp8", E, H, I, 4096), tgm.memory_needed("fp8", E, H, I, 128))
        self.assertGreater(tgm.memory_needed("bf16", E, H, I, 128, True), tgm.memory_needed("bf16", E, H, I, 128))


class Ops(unittest.TestCase):
    def test_bf16_mlp_on_cpu_equals_a_per_expert_loop(self):
        if not hasattr(torch, "_grouped_mm"):
            self.skipTest(f"torch {torch.__version__} has no torch._grouped_mm")
        E, H, I = 6, 64, 32
        w = tgm.make_weights("bf16", E, H, I, "cpu", torch)
        self.assertEqual((w["w13"].shape, w["w2"].shape), ((E, 2 * I, H), (E, H, I)))
        for counts in ([3, 0, 5, 1, 0, 7], tgm.rows_per_expert(40, E, True)):
            M = sum(counts)
            x = torch.randn(M, H).to(torch.bfloat16)
            offs = torch.tensor(tgm.offsets(counts), dtype=torch.int32)
            try:
                y = tgm.mlp_bf16(x, w, offs, torch)
            except (RuntimeError, NotImplementedError) as e:
                self.skipTest(f"torch._grouped_mm does not run on this CPU build: {e}")
            ref = loop_reference(x, w["w13"], w["w2"], counts)
            self.assertEqual(y.shape, (M, H))
            torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=3e-2)

    def test_permuted_equals_sorted_then_unsorted(self):
        E, H = 5, 16
        ids = torch.tensor([3, 0, 4, 0, 1, 3, 3, 2])
        x = torch.randn(8, H)
        wts = torch.rand(8)
        calls = []

        def mlp(xs, offs):  # rows must arrive grouped by expert with matching offsets
            calls.append(offs.tolist())
            return xs * 2
        y = tgm.permuted(mlp, x, ids, wts, E, torch)
        self.assertEqual(calls, [[2, 3, 4, 7, 8]])
        torch.testing.assert_close(y, x * 2 * wts[:, None])

    def test_row_quantization(self):
        t = (torch.randn(33, 80) * 3).to(torch.bfloat16)
        t[5] = 0  # an all-zero row keeps a finite scale
        q, s = tgm.quant_rows(t, torch)
        self.assertEqual((q.dtype, q.shape, s.dtype, s.shape), (torch.float8_e4m3fn, (33, 80), torch.float32, (33,)))
        self.assertTrue(torch.isfinite(s).all())
        self.assertLessEqual(q.float().abs().max().item(), 448)
        torch.testing.assert_close(q.float() * s[:, None], t.float(), atol=0.08, rtol=0.07)
        # Weights [E, N, K]: one scale per output channel, shape [E, N] as torch's 3-D mat_b needs.
        w = tgm.make_weights("fp8", 3, 32, 16, "cpu", torch)
        self.assertEqual((w["s13"].shape, w["s2"].shape, w["w13"].dtype), ((3, 32), (3, 32), torch.float8_e4m3fn))

    def test_fp8_calls_pass_torchs_checks_for_every_preset(self):
        """Meta tensors run torch's own argument checks of _grouped_mm / _scaled_grouped_mm (layout of
        mat_b, scale shapes, offs dtype, out dtype) without memory or a GPU."""
        for name, (H, I, _, _) in tgm.PRESETS.items():
            E = tgm.local_experts(name)
            for fmt in ("bf16", "fp8"):
                dt = torch.bfloat16 if fmt == "bf16" else torch.float8_e4m3fn
                w = {"w13": torch.empty(E, 2 * I, H, dtype=dt, device="meta"),
                     "w2": torch.empty(E, H, I, dtype=dt, device="meta"),
                     "s13": torch.empty(E, 2 * I, device="meta"), "s2": torch.empty(E, H, device="meta")}
                x = torch.empty(4096, H, dtype=torch.bfloat16, device="meta")
                offs = torch.empty(E, dtype=torch.int32, device="meta")
                y = tgm.mlp_bf16(x, w, offs, torch) if fmt == "bf16" else tgm.mlp_fp8(x, w, offs, torch)
                self.assertEqual((tuple(y.shape), y.dtype), ((4096, H), torch.bfloat16), (name, fmt))

    def test_fp8_mlp_with_an_emulated_scaled_grouped_mm(self):
        """torch's row-wise semantics (out = (a * scale_a[:, None]) @ (b * scale_b[g][None, :]) per
        group) emulated on the CPU: the fp8 MLP then tracks the bf16 one within fp8 error."""
        class Emulated:
            def __getattr__(self, n):
                return getattr(torch, n)

            @staticmethod
            def _scaled_grouped_mm(a, b, sa, sb, offs=None, out_dtype=None):
                assert b.stride(-2) == 1, "mat_b must be column-major"
                out, start = [], 0
                for g, end in enumerate(offs.tolist()):
                    out.append((a[start:end].float() * sa[start:end, None]) @ (b[g].float() * sb[g][None, :]))
                    start = end
                return torch.cat(out).to(out_dtype)
        E, H, I = 4, 64, 32
        wb = tgm.make_weights("bf16", E, H, I, "cpu", torch)
        w8 = tgm.make_weights("fp8", E, H, I, "cpu", torch)
        counts = [5, 0, 9, 2]
        x = torch.randn(16, H).to(torch.bfloat16)
        offs = torch.tensor(tgm.offsets(counts), dtype=torch.int32)
        y8 = tgm.mlp_fp8(x, w8, offs, Emulated())
        ref = loop_reference(x, wb["w13"], wb["w2"], counts)
        err = (y8.float() - ref).norm() / ref.norm()
        self.assertLess(err.item(), 0.1)


class Smoke(unittest.TestCase):
    def bench(self, args, **patch):
        saved = {k: getattr(tgm, k) for k in patch}
        for k, v in patch.items():
            setattr(tgm, k, v)
        try:
            a = tgm.parse_args(args)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                tgm.bench_preset(a.presets[0], a, a.Ms, a.fmts, 1000.0, "cpu", torch, "CPU")
            return out.getvalue()
        finally:
            for k, v in saved.items():
                setattr(tgm, k, v)

    def test_cpu_run_prints_a_row_per_point_and_refusals_as_rows(self):
        r = run("--device", "cpu", "--preset", "tiny", "--m", "64,100", "--reps", "1", "--skew")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# torch grouped-GEMM bench: CPU, torch", r.stdout)
        self.assertIn("| M | format | torch op | time ms | floor ms | floor / time | TFLOP/s |", r.stdout)
        rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| 64 |") or ln.startswith("| 100 |")]
        self.assertEqual(len(rows), 4, r.stdout)
        # fp8 on the CPU: torch refuses _scaled_grouped_mm; the row says why and the run goes on.
        self.assertTrue(any("| fp8 | _scaled_grouped_mm | failed:" in ln for ln in rows), r.stdout)
        self.assertIn("routing skewed", r.stdout)

    def test_router_routing_runs(self):
        r = run("--device", "cpu", "--preset", "tiny", "--m", "64", "--reps", "1", "--routing", "router", "--permute")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("routing the preset's router on random N(0, 1) logits", r.stdout)
        self.assertIn("| 64 | bf16 |", r.stdout)

    def test_permute_path_runs(self):
        out = self.bench(["--preset", "tiny", "--m", "50", "--reps", "1", "--formats", "bf16", "--permute"])
        self.assertRegex(out, r"\| 50 \| bf16 \| _grouped_mm \+permute \| (\d+\.\d+|failed)")

    def test_memory_shortfall_skips_with_the_reason(self):
        out = self.bench(["--preset", "deepseek-v3", "--m", "128", "--reps", "1", "--formats", "bf16"],
                         free_bytes=lambda device, torch: 1 << 30)
        self.assertIn("| 128 | bf16 | _grouped_mm | skipped: needs ~11.3 GB at M=128, 1.1 GB free |", out)
        # Weights fit, the largest M's activations do not: only that point is skipped.
        need = tgm.memory_needed("bf16", 8, 256, 128, 64)
        out = self.bench(["--preset", "tiny", "--m", "64,10000000", "--reps", "1", "--formats", "bf16"],
                         free_bytes=lambda device, torch: int(need * 1.1) + (600 << 20))
        self.assertRegex(out, r"\| 64 \| bf16 \| _grouped_mm \| \d")
        self.assertIn("| 10000000 | bf16 | _grouped_mm | skipped: activations need", out)

    def test_missing_op_is_a_row(self):
        class NoScaled:
            def __getattr__(self, n):
                if n == "_scaled_grouped_mm":
                    raise AttributeError(n)
                return getattr(torch, n)
        a = tgm.parse_args(["--preset", "tiny", "--m", "64", "--formats", "fp8"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tgm.bench_preset("tiny", a, a.Ms, a.fmts, 1000.0, "cpu", NoScaled(), "CPU")
        self.assertIn("skipped: torch", out.getvalue())
        self.assertIn("has no torch._scaled_grouped_mm", out.getvalue())


if __name__ == "__main__":
    unittest.main(verbosity=2)
