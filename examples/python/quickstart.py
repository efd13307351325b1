"""epmoe from Python on the CPU reference: one MoE layer over 2 simulated ranks (threads), numpy in
and out. Runs anywhere (no GPU); the test suite runs it from an installed wheel.

    python3 examples/python/quickstart.py
"""
import numpy as np

import epmoe

# A small model; every MoeConfig field is a keyword argument (epmoe.preset("deepseek-v3").config
# gives the public shapes).
cfg = epmoe.MoeConfig(hidden=256, intermediate=128, num_experts=8, top_k=2, num_ranks=2, capacity=16,
                      dispatch_format="fp8", weight_format="fp8", dispatcher="cpu", runner="reference")
for issue in cfg.validate():  # every problem names its field, the value and the fix
    raise SystemExit(issue.message)

rng = np.random.default_rng(0)  # the weights; each rank draws its tokens from its own generator
E, H, I = cfg.num_experts, cfg.hidden, cfg.intermediate
w13 = rng.standard_normal((E, 2 * I, H), dtype=np.float32) / 16  # gate rows, then up rows
w2 = rng.standard_normal((E, H, I), dtype=np.float32) / 16
tokens = {0: 5, 1: 3}  # each rank sends its own tokens; counts may differ (and be 0)


def rank(comm):
    lo = comm.rank * (E // comm.size)  # contiguous placement: this rank's experts
    mine = epmoe.ExpertWeights.quantize(w13[lo:lo + E // comm.size].copy(), w2[lo:lo + E // comm.size].copy(),
                                        cfg.weight_format.name)
    layer = epmoe.MoeLayer(cfg, comm, mine)  # collective
    T, mine_rng = tokens[comm.rank], np.random.default_rng(100 + comm.rank)
    hidden = epmoe.bf16_bits(mine_rng.standard_normal((T, H), dtype=np.float32))  # bf16 as uint16 bits
    logits = mine_rng.standard_normal((T, E), dtype=np.float32)
    out = layer.forward(hidden, logits)  # collective; bf16 [T, H]
    return epmoe.bf16_to_float(out)


outs = epmoe.run_ranks(epmoe.cpu_group(cfg.num_ranks), rank)
for r, out in enumerate(outs):
    assert np.isfinite(out).all()
    print(f"rank {r}: out {out.shape}, |out| max {np.abs(out).max():.4f}")
print(f"epmoe {epmoe.__version__} quickstart: ok")
