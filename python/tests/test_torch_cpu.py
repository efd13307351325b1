"""epmoe.torch on CPU tensors: the custom op, its fake for torch.compile, the module wrapper."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional extra epmoe[torch])")
import epmoe  # noqa: E402
import epmoe.torch as et  # noqa: E402

E, H, I, K = 8, 256, 128, 2


def make(seed=0):
    c = epmoe.MoeConfig(hidden=H, intermediate=I, num_experts=E, top_k=K, capacity=8,
                        dispatcher="local", runner="reference")
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / 16).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / 16).bfloat16()
    x = torch.randn(5, H, generator=g).bfloat16()
    logits = torch.randn(5, E, generator=g)
    return c, w13, w2, x, logits


def bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def test_module_equals_the_numpy_path_bitwise():
    c, w13, w2, x, logits = make()
    y = et.EpMoE(c, epmoe.local_comm(), w13, w2)(x, logits)
    assert y.dtype == torch.bfloat16 and y.shape == (5, H)
    layer = epmoe.MoeLayer(c, epmoe.local_comm(), epmoe.ExpertWeights.bf16(bits(w13), bits(w2)))
    np.testing.assert_array_equal(bits(y), layer.forward(bits(x), logits.numpy()))


def test_custom_op_is_registered_with_a_fake():
    c, w13, w2, x, logits = make()
    m = et.EpMoE(c, epmoe.local_comm(), w13, w2)
    y = torch.ops.epmoe.forward(x, logits, m._handle)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fx, fl = mode.from_tensor(x), mode.from_tensor(logits)
        fy = torch.ops.epmoe.forward(fx, fl, m._handle)
    assert fy.shape == y.shape and fy.dtype == y.dtype


def test_torch_compile_fullgraph_equals_eager():
    c, w13, w2, x, logits = make(1)
    m = et.EpMoE(c, epmoe.local_comm(), w13, w2)
    eager = m(x, logits)
    compiled = torch.compile(m, fullgraph=True)(x, logits)
    assert torch.equal(compiled, eager)


def test_bad_weights_and_stale_handles_are_usage_errors():
    c, w13, w2, x, logits = make()
    with pytest.raises(epmoe.UsageError, match="w13 must be a bfloat16"):
        et.EpMoE(c, epmoe.local_comm(), w13.float(), w2)
    with pytest.raises(epmoe.UsageError, match="handle 987654"):
        torch.ops.epmoe.forward(x, logits, 987654)


def test_communicator_without_a_gpu_or_nccl_is_a_usage_error():
    import torch.distributed as dist

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the multi-GPU issue's torchrun run covers communicator()")
    with pytest.raises(epmoe.UsageError, match="NCCL|CUDA device"):
        et.communicator()
    if not dist.is_available():
        return
    with pytest.raises(epmoe.UsageError, match="NCCL|CUDA device"):
        et.communicator(adopt=True)


def test_out_variants_write_the_callers_buffer_eager_and_compiled():
    c, w13, w2, x, logits = make(2)
    m = et.EpMoE(c, epmoe.local_comm(), w13, w2)
    ref = m(x, logits)
    out = torch.full_like(ref, 7.0)
    assert m(x, logits, out=out) is out
    assert torch.equal(out, ref)

    def f(x, logits, out):
        m(x, logits, out=out)
        return out * 1

    out2 = torch.zeros_like(ref)
    got = torch.compile(f, fullgraph=True)(x, logits, out2)
    assert torch.equal(got, ref) and torch.equal(out2, ref)
    ids = torch.tensor([[0, 1]] * 5, dtype=torch.int32)
    wts = torch.full((5, 2), 0.5)
    out3 = torch.empty_like(ref)
    assert torch.equal(m.forward_routed(x, ids, wts, out=out3), m.forward_routed(x, ids, wts))
    with pytest.raises(epmoe.UsageError, match="out"):
        m(x, logits, out=torch.empty(5, H + 1, dtype=torch.bfloat16))
