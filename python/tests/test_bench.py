"""python -m epmoe.bench runs and prints its table (here on the CPU reference, tiny shape)."""
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the benchmark times the torch op too)")


def test_bench_runs_on_the_cpu_and_prints_every_path():
    r = subprocess.run([sys.executable, "-m", "epmoe.bench", "--device", "cpu", "--preset", "tiny", "--tokens", "4",
                        "--iters", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for path in ("C++ MoeLayer::forward", "Python MoeLayer._forward", "torch op EpMoE", "torch op, out="):
        assert path in r.stdout
    assert "Targets:" in r.stdout
