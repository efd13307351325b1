"""The Python front end gives the same output bytes as the C++ `epmoe run` path for the same seed:
the same synthetic model (epmoe.harness), the same stack of layers, compared byte for byte with the
final hidden states `epmoe run --dump` writes."""
import os
import subprocess

import numpy as np
import pytest

import epmoe
import epmoe.harness as hz

CLI = os.environ.get("EPMOE_CLI", "")


@pytest.mark.skipif(not CLI or not os.path.exists(CLI), reason="EPMOE_CLI (the epmoe tool, set by CTest) not given")
@pytest.mark.parametrize("dispatch,weights", [("bf16", "bf16"), ("fp8", "fp8"), ("bf16", "nvfp4")])
def test_same_bytes_as_epmoe_run(tmp_path, dispatch, weights):
    prefix = str(tmp_path / "h")
    r = subprocess.run([CLI, "run", "--device", "cpu", "--dispatch", dispatch, "--weights", weights, "--layers", "2",
                        "--seed", "5", "--dump", prefix], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = epmoe.preset("tiny").config
    tokens = [37, 0, 64, 0]
    cfg.num_ranks, cfg.capacity, cfg.dispatcher, cfg.runner = 4, 64, "cpu", "reference"
    cfg.dispatch_format, cfg.weight_format = dispatch, weights
    outs = hz.run_stack(cfg, tokens, layers=2, seed=5)
    for rank, got in enumerate(outs):
        want = np.fromfile(f"{prefix}.{dispatch}-{weights}.rank{rank}.bin", dtype=np.uint16).reshape(-1, cfg.hidden)
        assert want.shape == (tokens[rank], cfg.hidden)
        np.testing.assert_array_equal(got, want, err_msg=f"rank {rank}")


def test_harness_pieces_are_deterministic():
    a = hz.random_hidden(3, 256, 9)
    assert a.dtype == np.uint16 and a.shape == (3, 256)
    assert np.array_equal(a, hz.random_hidden(3, 256, 9)) and not np.array_equal(a, hz.random_hidden(3, 256, 10))
    cfg = epmoe.preset("tiny").config
    g = hz.router_logits(cfg, 1, 0, a)
    assert g.shape == (3, cfg.num_experts) and np.isfinite(g).all()
    w = hz.rank_weights(cfg, 1, 0, 0)
    assert w.num_local_experts == cfg.num_experts and w.hidden == cfg.hidden
