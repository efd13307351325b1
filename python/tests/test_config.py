"""MoeConfig / Tuning / validate / presets / errors from Python: the C++ API's mirror."""
import pytest

import epmoe


def small(**kw):
    base = dict(hidden=256, intermediate=128, num_experts=8, top_k=2, capacity=4,
                dispatcher="local", runner="reference")
    base.update(kw)
    return epmoe.MoeConfig(**base)


def test_version_and_build_flags():
    assert epmoe.__version__.count(".") == 2
    assert isinstance(epmoe.with_cuda, bool) and isinstance(epmoe.with_nccl, bool)


def test_keywords_set_every_field_and_enums_take_names():
    c = small(dispatch_format="fp8", weight_format=epmoe.WeightFormat.nvfp4, fp8_ue8m0=True,
              intermediate_quant="fp8", timeout_ms=77)
    assert c.dispatch_format == epmoe.ActFormat.fp8
    assert c.weight_format == epmoe.WeightFormat.nvfp4
    assert c.intermediate_quant == epmoe.IntermediateQuant.fp8
    assert c.fp8_ue8m0 is True and c.timeout_ms == 77


def test_intermediate_quant_auto_follows_the_weights():
    assert small().intermediate_quant == epmoe.IntermediateQuant.auto
    fp8 = small(weight_format="fp8", intermediate_quant="auto")
    assert fp8.intermediate_quant == epmoe.IntermediateQuant.auto
    assert fp8.effective_intermediate_quant == epmoe.IntermediateQuant.fp8
    assert small(weight_format="bf16").effective_intermediate_quant == epmoe.IntermediateQuant.none
    assert small(weight_format="nvfp4").effective_intermediate_quant == epmoe.IntermediateQuant.none
    # nvfp4 weights: none whatever I; fp8 weights with gpt-oss' I = 2880 (a partial last 128-block):
    # fp8; auto is never an issue.
    odd = small(weight_format="nvfp4", intermediate=2880)
    assert odd.effective_intermediate_quant == epmoe.IntermediateQuant.none and odd.validate() == []
    odd8 = small(weight_format="fp8", intermediate=2880)
    assert odd8.effective_intermediate_quant == epmoe.IntermediateQuant.fp8 and odd8.validate() == []
    # Explicit values are kept.
    assert small(weight_format="fp8", intermediate_quant="none").effective_intermediate_quant.name == "none"
    assert small(intermediate_quant=epmoe.IntermediateQuant.fp8).effective_intermediate_quant.name == "fp8"
    # Ranks spelling the same choice differently share a fingerprint; describe shows the resolution.
    assert fp8.fingerprint() == small(weight_format="fp8", intermediate_quant="fp8").fingerprint()
    assert fp8.fingerprint() != small(weight_format="fp8", intermediate_quant="none").fingerprint()
    assert "interm. q:  fp8 (auto" in fp8.describe()
    with pytest.raises(epmoe.UsageError, match="one of auto, none, fp8"):
        small(intermediate_quant="bf16")


def test_nested_structs_are_references():
    c = small()
    c.router.kind = "sigmoid_grouped_topk"
    c.router.n_group = 4
    c.tuning.engine = "mma"
    c.tuning.comm_sms = 12
    assert c.router.kind == epmoe.RouterKind.sigmoid_grouped_topk and c.router.n_group == 4
    assert c.tuning.engine == epmoe.RunnerEngine.mma and c.tuning.comm_sms == 12
    assert "comm_sms" in c.describe()
    c.tuning.cutlass_swap = "1"
    assert c.tuning.cutlass_swap == epmoe.CutlassSwap.on
    c.tuning.cutlass_swap = "128"
    assert c.tuning.cutlass_swap == epmoe.CutlassSwap.n128
    c.tuning.cutlass_swap = "192"
    assert c.tuning.cutlass_swap == epmoe.CutlassSwap.n192
    c.tuning.cutlass_swap = "byrows"
    assert c.tuning.cutlass_swap == epmoe.CutlassSwap.byrows
    c.tuning.cutlass_swap = epmoe.CutlassSwap.auto
    c.tuning.decode_max_rows = 64
    assert c.tuning.decode_max_rows == 64 and "cutlass_swap" in c.describe()
    c.tuning.nvfp4_wide_max_rows = 512
    assert c.tuning.nvfp4_wide_max_rows == 512 and "nvfp4_wide_max_rows" in c.describe()
    assert c.tuning.concurrent_buckets is True
    c.tuning.concurrent_buckets = False
    assert c.tuning.concurrent_buckets is False and "concurrent_buckets" in c.describe()
    assert c.tuning.fp8_mixed is True
    c.tuning.fp8_mixed = False
    assert c.tuning.fp8_mixed is False and "fp8_mixed" in c.describe()
    assert c.tuning.nvfp4_mixed is True
    c.tuning.nvfp4_mixed = False
    assert c.tuning.nvfp4_mixed is False and "nvfp4_mixed" in c.describe()
    with pytest.raises(epmoe.UsageError, match="Tuning.cutlass_swap"):
        epmoe.Tuning(cutlass_swap="maybe")


def test_unknown_field_and_wrong_type_are_usage_errors():
    with pytest.raises(epmoe.UsageError, match="hiden"):
        epmoe.MoeConfig(hiden=7168)
    with pytest.raises(ValueError, match="MoeConfig.hidden='x' is not an int"):
        epmoe.MoeConfig(hidden="x")
    with pytest.raises(epmoe.UsageError, match="one of bf16, fp8, nvfp4"):
        epmoe.MoeConfig(dispatch_format="fp4")
    with pytest.raises(epmoe.UsageError, match="Tuning.engine"):
        epmoe.Tuning(engine="fast")


def test_validate_returns_field_value_message():
    c = small(hidden=200, dispatch_format="fp8", capacity=0)
    issues = c.validate()
    fields = {i.field: i for i in issues}
    assert "hidden" in fields and fields["hidden"].value == "200"
    assert "multiple of 16" in fields["hidden"].message
    assert "capacity" in fields
    with pytest.raises(epmoe.UsageError, match="invalid MoE configuration"):
        c.validate_or_raise()
    t = epmoe.Tuning(push_warps=20)
    assert [i.field for i in t.validate()] == ["tuning.push_warps"]


def test_presets_and_pairs():
    names = epmoe.presets()
    assert "deepseek-v3" in names and "tiny" in names
    p = epmoe.preset("deepseek-v3")
    assert p.config.hidden == 7168 and p.config.num_experts == 256 and p.num_layers > 0
    with pytest.raises(epmoe.UsageError, match="tiny"):
        epmoe.preset("nope")
    pairs = epmoe.legal_pairs()
    assert any(s.startswith("local+reference") for s in pairs)
    assert any(s.startswith("cpu+reference") for s in pairs)


def test_exception_hierarchy():
    assert issubclass(epmoe.UsageError, ValueError)
    assert issubclass(epmoe.TimeoutError, TimeoutError)
    assert issubclass(epmoe.BackendError, RuntimeError)
