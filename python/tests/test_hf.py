"""epmoe.torch.from_hf against transformers' own MoE blocks (Qwen3-MoE, Mixtral, DeepSeek-V3 with a
shared expert), on the CPU reference and, where a GPU is present, on runner cuda.

Tolerance: the transformers blocks compute in bf16 (bf16 GEMM outputs, bf16 SwiGLU, a bf16 sum over
k); epmoe accumulates in fp32 and rounds once per stage. The two agree within 3% of the output's
largest magnitude (max_err / max_ref); measured 0.5-0.8% on these shapes."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional extra epmoe[hf])")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional extra epmoe[hf])")
import epmoe  # noqa: E402
import epmoe.torch as et  # noqa: E402

TOL = 3e-2


def blocks():
    from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    return {
        "qwen3": lambda: Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(
            hidden_size=256, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)),
        "qwen3-no-renorm": lambda: Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(
            hidden_size=256, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)),
        "mixtral": lambda: MixtralSparseMoeBlock(MixtralConfig(
            hidden_size=256, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)),
        "deepseek-v3": lambda: DeepseekV3MoE(DeepseekV3Config(
            hidden_size=256, moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
            topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5)),
    }


def make(name, seed, device):
    torch.manual_seed(seed)
    blk = blocks()[name]()
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.05)
    if hasattr(blk.gate, "e_score_correction_bias"):
        blk.gate.e_score_correction_bias.normal_(std=0.1)
    return blk.bfloat16().to(device).eval()


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and epmoe.with_cuda:
        out.append("cuda")
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", ["qwen3", "qwen3-no-renorm", "mixtral", "deepseek-v3"])
@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_from_hf_matches_the_block(name, device, tokens):
    blk = make(name, 100 + tokens, device)
    mod = et.from_hf(blk, capacity=128)  # one rank on the block's device
    x = torch.randn(1, tokens, 256, device=device).bfloat16()
    with torch.no_grad():
        ref = blk(x).float()
        got = mod(x).float()
    assert got.shape == ref.shape
    assert torch.isfinite(got).all()
    err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    assert err < TOL, f"{name} on {device}, T={tokens}: max_err/max_ref {err:.3g}"


def test_from_hf_takes_the_router_of_each_block():
    assert et._router_of(make("mixtral", 0, "cpu")) == dict(kind="softmax_topk", renormalize=True)
    assert et._router_of(make("qwen3-no-renorm", 0, "cpu"))["renormalize"] is False
    r = et._router_of(make("deepseek-v3", 0, "cpu"))
    assert r["kind"] == "sigmoid_grouped_topk" and r["n_group"] == 4 and r["topk_group"] == 2
    assert r["routed_scaling_factor"] == 2.5


def test_from_hf_refuses_what_it_cannot_split():
    with pytest.raises(epmoe.UsageError, match="do not split evenly over 3 ranks"):
        et.from_hf(make("qwen3", 0, "cpu"), epmoe.cpu_group(3)[0])
