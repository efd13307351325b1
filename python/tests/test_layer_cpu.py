"""The layer on the CPU reference from Python: numpy in, numpy out, simulated ranks on threads."""
import numpy as np
import pytest

import epmoe

E, H, I, K = 8, 256, 128, 2


def cfg(**kw):
    base = dict(hidden=H, intermediate=I, num_experts=E, top_k=K, capacity=8,
                dispatcher="local", runner="reference")
    base.update(kw)
    return epmoe.MoeConfig(**base)


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(1)
    w13 = (rng.standard_normal((E, 2 * I, H), dtype=np.float32) / 16).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I), dtype=np.float32) / 16).astype(np.float32)
    return w13, w2


def inputs(T, seed=2):
    rng = np.random.default_rng(seed)
    x = epmoe.bf16_bits(rng.standard_normal((T, H), dtype=np.float32))
    g = rng.standard_normal((T, E), dtype=np.float32)
    return x, g


def plain_layer(w13, w2, x, g):
    """float64 softmax top-k MoE with renormalized weights (the reference's semantics, unrounded)."""
    xf = epmoe.bf16_to_float(x).astype(np.float64)
    p = np.exp(g - g.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(xf)
    for t in range(x.shape[0]):
        ids = np.argsort(-p[t], kind="stable")[:K]
        w = p[t, ids] / p[t, ids].sum()
        for e, wk in zip(ids, w):
            gu = w13[e].astype(np.float64) @ xf[t]
            h = gu[:I] / (1 + np.exp(-gu[:I])) * gu[I:]
            out[t] += wk * (w2[e].astype(np.float64) @ h)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_forward_matches_float64(weights, fmt):
    w13, w2 = weights
    c = cfg(weight_format=fmt)
    layer = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, fmt))
    x, g = inputs(5)
    out = layer.forward(x, g)
    assert out.dtype == np.uint16 and out.shape == (5, H)
    got = epmoe.bf16_to_float(out)
    want = plain_layer(w13, w2, x, g)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert np.isfinite(got).all()
    assert err < {"bf16": 2e-2, "fp8": 8e-2, "nvfp4": 2.5e-1}[fmt], err


def test_out_is_written_in_place_and_zero_tokens_work(weights):
    w13, w2 = weights
    layer = epmoe.MoeLayer(cfg(), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    x, g = inputs(3)
    out = np.full((3, H), 0x7E7E, dtype=np.uint16)
    assert layer.forward(x, g, out) is out
    assert not (out == 0x7E7E).all()
    empty = layer.forward(x[:0], g[:0])
    assert empty.shape == (0, H)


def test_forward_routed_equals_forward(weights):
    w13, w2 = weights
    layer = epmoe.MoeLayer(cfg(), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    x, g = inputs(4)
    p = np.exp(g - g.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :K].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=1)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    a = epmoe.bf16_to_float(layer.forward(x, g))
    b = epmoe.bf16_to_float(layer.forward_routed(x, ids, w))
    assert np.abs(a - b).max() <= 1e-2 * np.abs(a).max()


def test_bad_inputs_are_usage_errors_naming_the_argument(weights):
    w13, w2 = weights
    layer = epmoe.MoeLayer(cfg(), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    x, g = inputs(3)
    with pytest.raises(epmoe.UsageError, match="router_logits"):
        layer.forward(x, g[:, :4].copy())
    with pytest.raises(epmoe.UsageError, match="hidden"):
        layer.forward(x[:, ::2], g)
    with pytest.raises(epmoe.UsageError, match="hidden"):
        layer.forward(epmoe.bf16_to_float(x), g)  # float32 where bf16 is expected
    big_x, big_g = inputs(9)  # capacity is 8
    with pytest.raises(epmoe.UsageError, match="capacity"):
        layer.forward(big_x, big_g)
    with pytest.raises(epmoe.UsageError, match=r"w2 is f32\[8, 256, 128\].*expected \[8, 100, 128\]"):
        epmoe.ExpertWeights.quantize(w13[:, :, :100].copy(), w2, "bf16")  # H from w13 disagrees with w2
    with pytest.raises(epmoe.UsageError, match="float32 CPU arrays"):
        epmoe.ExpertWeights.quantize(w13.astype(np.float64), w2, "bf16")
    with pytest.raises(epmoe.UsageError, match="ExpertWeights.quantize.format='fp4'"):
        epmoe.ExpertWeights.quantize(w13, w2, "fp4")


def test_simulated_ranks_agree_with_one_rank(weights):
    w13, w2 = weights
    x, g = inputs(6)
    one = epmoe.MoeLayer(cfg(), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16")).forward(x, g)
    c2 = cfg(num_ranks=2, dispatcher="cpu")

    def rank(comm):
        lo = comm.rank * (E // 2)
        mine = epmoe.ExpertWeights.quantize(w13[lo:lo + E // 2].copy(), w2[lo:lo + E // 2].copy(), "bf16")
        return epmoe.MoeLayer(c2, comm, mine).forward(x, g)

    outs = epmoe.run_ranks(epmoe.cpu_group(2), rank)
    ref = epmoe.bf16_to_float(one)
    for o in outs:  # the combine adds per-rank bf16 partial sums: equal up to bf16 rounding
        assert np.abs(epmoe.bf16_to_float(o) - ref).max() <= 2e-2 * np.abs(ref).max()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_failing_rank_is_the_error_raised_not_the_timeout(weights):
    w13, w2 = weights
    c2 = cfg(num_ranks=2, dispatcher="cpu", timeout_ms=500)

    def rank(comm):
        if comm.rank == 1:
            raise RuntimeError("rank 1 broke")
        epmoe.MoeLayer(c2, comm, epmoe.ExpertWeights.quantize(w13[:4].copy(), w2[:4].copy(), "bf16"))

    with pytest.raises(RuntimeError, match="rank 1 broke"):
        epmoe.run_ranks(epmoe.cpu_group(2, 500), rank)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_checkpoint_layouts_give_the_same_bytes_as_host_quantization(weights, fmt):
    """quantize_weights -> checkpoint tensors -> ExpertWeights.<fmt> in place: the same output bytes
    as ExpertWeights.quantize (one quantization, two ways in)."""
    w13, w2 = weights
    c = cfg(weight_format=fmt)
    x, g = inputs(4)
    ref = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, fmt)).forward(x, g)
    ck = epmoe.quantize_weights(w13, w2, fmt)
    views = getattr(epmoe.ExpertWeights, fmt)(**ck)
    assert views.format == getattr(epmoe.WeightFormat, fmt)
    got = epmoe.MoeLayer(c, epmoe.local_comm(), views).forward(x, g)
    np.testing.assert_array_equal(got, ref)


def test_fp8_partial_tiles_gate_and_up_tiled_apart():
    # I = 192 (1.5 tiles), H = 320 (2.5): W13's scales are the gate's and the up's tile grids
    # stacked, [E, 2*ceil(I/128), ceil(H/128)]; the checkpoint tensors run in place, equal to the
    # layer built from the same fp32 weights, and close to float64.
    rng = np.random.default_rng(3)
    h, i = 320, 192
    w13 = (rng.standard_normal((E, 2 * i, h), dtype=np.float32) / 16).astype(np.float32)
    w2 = (rng.standard_normal((E, h, i), dtype=np.float32) / 16).astype(np.float32)
    w13[:, i:] *= 8  # up rows far larger than gate rows: a tile mixing both would show
    ck = epmoe.quantize_weights(w13, w2, "fp8")
    assert ck["w13_scale_inv"].shape == (E, 4, 3) and ck["w2_scale_inv"].shape == (E, 3, 2)
    assert ck["w13_scale_inv"][:, 2:].min() > 4 * ck["w13_scale_inv"][:, :2].max()
    c = cfg(hidden=h, intermediate=i, weight_format="fp8")
    x = epmoe.bf16_bits(rng.standard_normal((5, h), dtype=np.float32))
    g = rng.standard_normal((5, E), dtype=np.float32)
    ref = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "fp8")).forward(x, g)
    got = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.fp8(**ck)).forward(x, g)
    np.testing.assert_array_equal(got, ref)
    xf = epmoe.bf16_to_float(x).astype(np.float64)
    p = np.exp(g - g.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = np.zeros_like(xf)
    for t in range(5):
        ids = np.argsort(-p[t], kind="stable")[:K]
        for e, wk in zip(ids, p[t, ids] / p[t, ids].sum()):
            gu = w13[e].astype(np.float64) @ xf[t]
            want[t] += wk * (w2[e].astype(np.float64) @ (gu[:i] / (1 + np.exp(-gu[:i])) * gu[i:]))
    err = np.abs(epmoe.bf16_to_float(got) - want).max() / np.abs(want).max()
    assert err < 8e-2, err


def test_checkpoint_tensors_of_the_wrong_layout_are_refused(weights):
    w13, w2 = weights
    ck = epmoe.quantize_weights(w13, w2, "fp8")
    bad = dict(ck, w13_scale_inv=ck["w13_scale_inv"][:, :1].copy())
    with pytest.raises(epmoe.UsageError, match=r"w13_scale_inv .*expected \[8, 2, 2\]"):
        epmoe.ExpertWeights.fp8(**bad)
    n = epmoe.quantize_weights(w13, w2, "nvfp4")
    with pytest.raises(epmoe.UsageError, match="global scales must be float32"):
        epmoe.ExpertWeights.nvfp4(**dict(n, w2_global_scale=n["w2_global_scale"].astype(np.float64)))
    with pytest.raises(epmoe.UsageError, match=r"w2 is u8\[8, 256, 64\] on cpu; expected \[8, 512, 64\]"):
        epmoe.ExpertWeights.nvfp4(**dict(n, w13=ck["w13"]))  # fp8 codes: H read off w13 disagrees with w2


def test_more_bad_inputs_are_usage_errors(weights):
    """Issue 16's list: ids out of range or of the wrong dtype, weights of the wrong format for the
    configuration, wrong shapes; every one a UsageError before any work, the layer usable after."""
    w13, w2 = weights
    layer = epmoe.MoeLayer(cfg(), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    x, g = inputs(3)
    ids = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int32)
    w = np.full((3, K), 0.5, dtype=np.float32)
    with pytest.raises(epmoe.UsageError, match=r"topk_ids\[.*outside"):
        layer.forward_routed(x, np.array([[0, 1], [2, E], [4, 5]], dtype=np.int32), w)
    with pytest.raises(epmoe.UsageError, match="topk_ids"):
        layer.forward_routed(x, ids.astype(np.int64), w)
    with pytest.raises(epmoe.UsageError, match="topk_weights"):
        layer.forward_routed(x, ids, w.astype(np.float64))
    with pytest.raises(epmoe.UsageError, match="out"):
        layer.forward(x, g, np.empty((3, H + 1), dtype=np.uint16))
    with pytest.raises(epmoe.UsageError, match="weight_format"):  # fp8 configured, bf16 weights given
        epmoe.MoeLayer(cfg(weight_format="fp8"), epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    ok = layer.forward_routed(x, ids, w)  # nothing was lost
    assert np.isfinite(epmoe.bf16_to_float(ok)).all()


def test_the_layer_keeps_its_communicator_alive(weights):
    w13, w2 = weights
    comms = epmoe.cpu_group(1)
    layer = epmoe.MoeLayer(cfg(dispatcher="cpu"), comms[0], epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    del comms  # the layer holds a reference: no dangling communicator
    import gc

    gc.collect()
    x, g = inputs(2)
    assert layer.forward(x, g).shape == (2, H)


def test_finite_logits_of_any_magnitude_give_finite_outputs(weights):
    w13, w2 = weights
    c = cfg(num_experts=E)
    c.router.kind = "sigmoid_grouped_topk"
    c.router.n_group = 2
    c.router.topk_group = 1
    layer = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.quantize(w13, w2, "bf16"))
    x, _ = inputs(4)
    for scale in (-1e30, -300.0, -90.0, 1e30):
        g = np.full((4, E), scale, dtype=np.float32) + np.arange(E, dtype=np.float32)
        out = epmoe.bf16_to_float(layer.forward(x, g))
        assert np.isfinite(out).all(), scale


def test_fault_counts_only_faulty_tokens_and_raise_mode(weights):
    """NaN/inf inputs (DESIGN.md section 7): counted, only those tokens' outputs affected; raise
    mode raises naming them; off counts nothing."""
    w13, w2 = weights
    ew = epmoe.ExpertWeights.quantize(w13, w2, "bf16")
    x, g = inputs(4)
    clean = epmoe.MoeLayer(cfg(), epmoe.local_comm(), ew).forward(x, g)
    x[1, 3] = 0x7FC0  # a bf16 NaN
    g[2, 0] = np.inf  # softmax: NaN weights for token 2
    layer = epmoe.MoeLayer(cfg(), epmoe.local_comm(), ew)
    out = layer.forward(x, g)
    assert layer.fault_counts() == {"nonfinite_hidden": 1, "nonfinite_logits": 1, "nonfinite_weights": 1,
                                    "bad_ids": 0}
    assert np.array_equal(out[[0, 3]], clean[[0, 3]])
    layer.reset_fault_counts()
    assert sum(layer.fault_counts().values()) == 0
    strict = epmoe.MoeLayer(cfg(tuning=epmoe.Tuning(fault_check="raise")), epmoe.local_comm(), ew)
    with pytest.raises(epmoe.UsageError, match="1 token with NaN/inf in hidden"):
        strict.forward(x, g)
    off = epmoe.MoeLayer(cfg(tuning=epmoe.Tuning(fault_check="off")), epmoe.local_comm(), ew)
    off.forward(x, g)
    assert sum(off.fault_counts().values()) == 0
    with pytest.raises(epmoe.UsageError, match="fault_check"):
        epmoe.Tuning(fault_check="loud")
