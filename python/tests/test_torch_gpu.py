"""epmoe.torch on one GPU (runner cuda, dispatcher local): token counts 0, 1, odd and large, every
weight format against the float64 oracle, CUDA graph replay == eager, torch.compile, a non-default
stream, and 10 000 back-to-back forwards without growth in GPU memory."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional extra epmoe[torch])")
import epmoe  # noqa: E402

if not (torch.cuda.is_available() and epmoe.with_cuda):
    pytest.skip("no CUDA device, or epmoe built without CUDA", allow_module_level=True)
import epmoe.torch as et  # noqa: E402

E, H, I, K = 16, 512, 256, 4
DEV = torch.device("cuda", torch.cuda.current_device())
TOL = {"bf16": 2e-2, "fp8": 8e-2, "nvfp4": 2.5e-1}


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, 2 * I, H, generator=g) / 24), (torch.randn(E, H, I, generator=g) / 16)


def module(fmt="bf16", capacity=4096, seed=0, **kw):
    w13, w2 = weights(seed)
    cfg = epmoe.MoeConfig(hidden=H, intermediate=I, num_experts=E, top_k=K, capacity=capacity,
                          dispatcher="local", runner="cuda", weight_format=fmt, **kw)
    comm = epmoe.local_comm("cuda", DEV.index)
    if fmt == "bf16":
        return et.EpMoE(cfg, comm, w13.bfloat16().to(DEV), w2.bfloat16().to(DEV)), (w13, w2)
    return et.EpMoEQuantized(cfg, comm, w13.numpy(), w2.numpy(), DEV), (w13, w2)


def inputs(T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g).bfloat16().to(DEV), torch.randn(T, E, generator=g).to(DEV)


def oracle(w13, w2, x, logits):
    """float64 softmax top-k (renormalized) MoE with the unquantized fp32 weights."""
    xf, lg = x.double().cpu(), logits.double().cpu()
    p = torch.softmax(lg, dim=1)
    top, ids = torch.topk(p, K, dim=1)
    top = top / top.sum(dim=1, keepdim=True)
    out = torch.zeros_like(xf)
    for t in range(xf.shape[0]):
        for k in range(K):
            e = int(ids[t, k])
            gu = w13[e].double() @ xf[t]
            h = torch.nn.functional.silu(gu[:I]) * gu[I:]
            out[t] += top[t, k] * (w2[e].double() @ h)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("T", [0, 1, 7, 333])
def test_formats_against_float64(fmt, T):
    m, (w13, w2) = module(fmt)
    x, logits = inputs(T)
    y = m(x, logits)
    torch.cuda.synchronize()
    assert y.shape == (T, H) and y.dtype == torch.bfloat16 and y.device == DEV
    if T == 0:
        return
    want = oracle(w13, w2, x, logits)
    got = y.double().cpu()
    assert torch.isfinite(got).all()
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < TOL[fmt], f"{fmt} T={T}: max_err/max_ref {err:.3g}"


def test_large_token_count_matches_cpu_reference_tolerance():
    m, (w13, w2) = module("bf16", capacity=8192)
    x, logits = inputs(8192, seed=5)
    y = m(x, logits)
    sub = slice(0, 64)  # the float64 oracle on a subset
    want = oracle(w13, w2, x[sub], logits[sub])
    err = (y[sub].double().cpu() - want).abs().max().item() / want.abs().max().item()
    assert err < TOL["bf16"]


def test_graph_replay_equals_eager_bitwise():
    m, _ = module("fp8")
    x, logits = inputs(100)
    eager = m(x, logits).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(x, logits)  # warm up: workspaces grow outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m(x, logits)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    x2, l2 = inputs(100, seed=9)  # new inputs copied into the captured buffers
    x.copy_(x2)
    logits.copy_(l2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, m(x2, l2))


def test_torch_compile_fullgraph():
    m, _ = module("bf16")
    x, logits = inputs(33)
    eager = m(x, logits)
    compiled = torch.compile(m, fullgraph=True)(x, logits)
    assert torch.equal(compiled, eager)


def test_non_default_stream():
    m, _ = module("bf16")
    x, logits = inputs(50)
    ref = m(x, logits)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = m(x, logits)
    s.synchronize()
    assert torch.equal(y, ref)


def test_ten_thousand_forwards_do_not_grow_gpu_memory():
    m, _ = module("bf16")
    x, logits = inputs(16)
    for _ in range(10):
        m(x, logits)
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    alloc0 = torch.cuda.memory_allocated()
    for _ in range(10_000):
        m(x, logits)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    assert torch.cuda.memory_allocated() == alloc0
    assert free0 - free1 < (8 << 20), f"free GPU memory fell by {(free0 - free1) >> 20} MiB"


def test_bad_device_inputs_are_usage_errors():
    m, _ = module("bf16")
    x, logits = inputs(4)
    with pytest.raises(epmoe.UsageError):
        m(x.cpu(), logits)
    with pytest.raises(epmoe.UsageError):
        m(x.float(), logits)
    with pytest.raises(epmoe.UsageError, match="capacity"):
        m2, _ = module("bf16", capacity=8)
        m2(*inputs(9))


def test_fault_counts_without_sync_inside_a_cuda_graph_and_raise_mode():
    m, _ = module("bf16")
    x, logits = inputs(50)
    clean = m(x, logits).clone()
    x[3, 7] = float("nan")
    logits[9, 2] = float("inf")
    out = m(x, logits)
    assert m.fault_counts() == {"nonfinite_hidden": 1, "nonfinite_logits": 1, "nonfinite_weights": 1,
                                "bad_ids": 0}
    keep = [t for t in range(50) if t not in (3, 9)]
    assert torch.equal(out[keep], clean[keep])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(x, logits)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        m(x, logits)
    m.reset_fault_counts()
    graph.replay()
    graph.replay()
    assert m.fault_counts()["nonfinite_hidden"] == 2
    strict, _ = module("bf16", tuning=epmoe.Tuning(fault_check="raise"))
    with pytest.raises(epmoe.UsageError, match="NaN/inf"):
        strict(x, logits)
