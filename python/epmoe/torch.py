"""PyTorch integration: the layer's forward as a torch custom op (``torch.ops.epmoe.forward``),
registered through a ``torch.library`` fragment (define + impl, the low-overhead way) with a fake
implementation for ``torch.compile``; outputs come from PyTorch's caching allocator and the work
is enqueued on the caller's current CUDA stream, so ``torch.cuda.graph`` can capture it.

Layers are referred to by an integer handle inside the op (custom ops take tensors and scalars);
``EpMoE`` (an ``nn.Module``) holds one layer, its weights and its handle."""

from __future__ import annotations

import itertools
import threading
from typing import Dict, Optional

import torch
from torch.utils import dlpack as _dlpack

from . import ExpertWeights, MoeConfig, RouterKind, UsageError
from . import MoeLayer as _Layer

_layers: Dict[int, _Layer] = {}
_next_id = itertools.count(1)
_lock = threading.Lock()

_lib = torch.library.Library("epmoe", "FRAGMENT")
_lib.define("forward(Tensor hidden, Tensor router_logits, int layer) -> Tensor")
_lib.define("forward_routed(Tensor hidden, Tensor topk_ids, Tensor topk_weights, int layer) -> Tensor")
# Into a caller's buffer (e.g. a framework's symmetric-memory output): out is written, nothing returned.
_lib.define("forward_out(Tensor hidden, Tensor router_logits, int layer, Tensor(a!) out) -> ()")
_lib.define("forward_routed_out(Tensor hidden, Tensor topk_ids, Tensor topk_weights, int layer, Tensor(a!) out) -> ()")


def _layer(handle: int) -> _Layer:
    layer = _layers.get(handle)
    if layer is None:
        raise UsageError(f"epmoe layer handle {handle} is not registered (the module was deleted or never built)")
    return layer


def _stream_of(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _dl(t: torch.Tensor):
    # to_dlpack does not synchronize streams (Tensor.__dlpack__() without a stream would make the
    # legacy default stream wait on the current one, which a graph capture refuses).
    return _dlpack.to_dlpack(t)


def _forward_out_impl(hidden: torch.Tensor, router_logits: torch.Tensor, layer: int, out: torch.Tensor) -> None:
    _layer(layer)._forward(_dl(hidden), _dl(router_logits), _dl(out), _stream_of(hidden))


def _forward_routed_out_impl(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, layer: int,
                             out: torch.Tensor) -> None:
    _layer(layer)._forward_routed(_dl(hidden), _dl(topk_ids), _dl(topk_weights), _dl(out), _stream_of(hidden))


def _new_out(hidden: torch.Tensor) -> torch.Tensor:
    return torch.empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16, device=hidden.device)


def _forward_impl(hidden: torch.Tensor, router_logits: torch.Tensor, layer: int) -> torch.Tensor:
    out = _new_out(hidden)
    _forward_out_impl(hidden, router_logits, layer, out)
    return out


def _forward_routed_impl(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                         layer: int) -> torch.Tensor:
    out = _new_out(hidden)
    _forward_routed_out_impl(hidden, topk_ids, topk_weights, layer, out)
    return out


for _key in ("CPU", "CUDA"):
    _lib.impl("forward", _forward_impl, _key)
    _lib.impl("forward_routed", _forward_routed_impl, _key)
    _lib.impl("forward_out", _forward_out_impl, _key)
    _lib.impl("forward_routed_out", _forward_routed_out_impl, _key)


@torch.library.register_fake("epmoe::forward")
def _forward_fake(hidden, router_logits, layer):
    return _new_out(hidden)


@torch.library.register_fake("epmoe::forward_routed")
def _forward_routed_fake(hidden, topk_ids, topk_weights, layer):
    return _new_out(hidden)


@torch.library.register_fake("epmoe::forward_out")
def _forward_out_fake(hidden, router_logits, layer, out):
    return None


@torch.library.register_fake("epmoe::forward_routed_out")
def _forward_routed_out_fake(hidden, topk_ids, topk_weights, layer, out):
    return None


def _register(layer: _Layer) -> int:
    with _lock:
        handle = next(_next_id)
        _layers[handle] = layer
    return handle


class EpMoE(torch.nn.Module):
    """One rank's routed experts as a module: ``forward(hidden [T, H] bf16, router_logits [T, E])
    -> [T, H] bf16``, or ``forward_routed(hidden, topk_ids, topk_weights)``.

    ``w13`` [E_loc, 2I, H] (gate rows, then up) and ``w2`` [E_loc, H, I] are bf16 tensors on the
    layer's device (the CPU for the reference runner); they are kept as buffers of the module and
    used in place. Construction is collective over ``comm``'s ranks."""

    def __init__(self, config: MoeConfig, comm, w13: torch.Tensor, w2: torch.Tensor,
                 router_bias: Optional[torch.Tensor] = None):
        super().__init__()
        for name, t in (("w13", w13), ("w2", w2)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
                raise UsageError(f"EpMoE {name} must be a bfloat16 torch.Tensor, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}; convert with .to(torch.bfloat16)")
        self.register_buffer("w13", w13.contiguous(), persistent=False)
        self.register_buffer("w2", w2.contiguous(), persistent=False)
        self._weights = ExpertWeights.bf16(_dl(self.w13), _dl(self.w2))
        self._build(config, comm, router_bias)

    def _build(self, config: MoeConfig, comm, router_bias: Optional[torch.Tensor]) -> None:
        """The layer over self._weights (collective), with the router bias kept as a buffer."""
        self._comm = comm
        bias = None
        if router_bias is not None:
            self.register_buffer("router_bias", router_bias.detach().float().contiguous(), persistent=False)
            bias = _dl(self.router_bias)
        self._layer = _Layer(config, comm, self._weights, bias)
        self._handle = _register(self._layer)

    @property
    def config(self) -> MoeConfig:
        return self._layer.config

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[T, H] bf16 out; into ``out`` (bf16 [T, H], contiguous, on hidden's device) when given."""
        if out is None:
            return torch.ops.epmoe.forward(hidden, router_logits, self._handle)
        torch.ops.epmoe.forward_out(hidden, router_logits, self._handle, out)
        return out

    def forward_routed(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if out is None:
            return torch.ops.epmoe.forward_routed(hidden, topk_ids, topk_weights, self._handle)
        torch.ops.epmoe.forward_routed_out(hidden, topk_ids, topk_weights, self._handle, out)
        return out

    def _stream(self) -> int:
        if self._layer.device == "cuda":
            return torch.cuda.current_stream(self._layer.device_index).cuda_stream
        return 0

    def fault_counts(self) -> dict:
        """Data faults the forwards met (NaN/inf inputs, bad ids; docs/DESIGN.md section 7), counted
        on the device at no host synchronization; reading them waits for the current stream."""
        return self._layer.fault_counts(self._stream())

    def reset_fault_counts(self) -> None:
        self._layer.reset_fault_counts(self._stream())

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None:
            with _lock:
                _layers.pop(handle, None)


# ---- Hugging Face MoE blocks ------------------------------------------------------------------


def _expert_tensors(experts: torch.nn.Module, up_first: bool):
    """(w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I]) from transformers' experts: fused 3-D
    parameters (gate_up_proj / down_proj, transformers >= 5) or a ModuleList of MLPs (w1/w3/w2 or
    gate_proj/up_proj/down_proj)."""
    if hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj"):
        w13, w2 = experts.gate_up_proj.detach(), experts.down_proj.detach()
        if up_first:
            half = w13.shape[1] // 2
            w13 = torch.cat([w13[:, half:], w13[:, :half]], dim=1)
        return w13, w2
    mods = list(experts)
    names = [("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj")]
    for g, u, d in names:
        if all(hasattr(m, g) and hasattr(m, u) and hasattr(m, d) for m in mods):
            w13 = torch.stack([torch.cat([getattr(m, g).weight, getattr(m, u).weight], dim=0) for m in mods])
            w2 = torch.stack([getattr(m, d).weight for m in mods])
            return w13.detach(), w2.detach()
    raise UsageError(f"from_hf: experts of type {type(experts).__name__} have neither gate_up_proj/down_proj nor "
                     "per-expert w1/w3/w2 or gate_proj/up_proj/down_proj")


def _router_of(block: torch.nn.Module) -> dict:
    """The block's router as MoeConfig fields, from transformers' Qwen3-MoE, Mixtral and DeepSeek-V3."""
    gate = block.gate
    name = type(block).__name__
    if hasattr(gate, "e_score_correction_bias") or "Deepseek" in name:
        return dict(kind="sigmoid_grouped_topk", renormalize=bool(getattr(gate, "norm_topk_prob", True)),
                    n_group=int(gate.num_group if hasattr(gate, "num_group") else gate.n_group),
                    topk_group=int(gate.topk_group), routed_scaling_factor=float(gate.routed_scaling_factor))
    renorm = bool(getattr(gate, "norm_topk_prob", getattr(block, "norm_topk_prob", True)))
    return dict(kind="softmax_topk", renormalize=renorm)


class EpMoEBlock(torch.nn.Module):
    """A drop-in for a transformers MoE block: the router's logits are computed as the block did
    (its own gate weights; fp32 for DeepSeek-V3's sigmoid router), the routed experts run in epmoe,
    shared experts (DeepSeek-V3) stay the model's and are added as before."""

    def __init__(self, experts: EpMoE, gate_weight: torch.Tensor, fp32_logits: bool,
                 shared_experts: Optional[torch.nn.Module]):
        super().__init__()
        self.experts = experts
        self.register_buffer("gate_weight", gate_weight.detach(), persistent=False)
        self.fp32_logits = fp32_logits
        self.shared_experts = shared_experts

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        if self.fp32_logits:
            logits = torch.nn.functional.linear(x.float(), self.gate_weight.float())
        else:
            logits = torch.nn.functional.linear(x, self.gate_weight)
        y = self.experts(x.to(torch.bfloat16).contiguous(), logits.contiguous())
        y = y.to(hidden_states.dtype).reshape(shape)
        if self.shared_experts is not None:
            y = y + self.shared_experts(hidden_states)
        return y


def from_hf(block: torch.nn.Module, comm=None, *, capacity: int = 4096, weight_format: str = "bf16",
            dispatch_format: str = "bf16", up_first: bool = False, **config) -> EpMoEBlock:
    """An epmoe module for a transformers MoE block (Qwen3-MoE, Mixtral, DeepSeek-V3): the block's
    expert weights (this rank's share when ``comm`` has several ranks: experts
    [r*E/R, (r+1)*E/R)), router kind and parameters. ``capacity`` bounds the tokens of one call;
    ``config`` sets any other MoeConfig field. Weights are converted once: bf16 in place; fp8 or
    nvfp4 quantized on the host (``epmoe.quantize_weights``) and copied to the block's device.
    With fp8 weights the SwiGLU intermediate is re-quantized to fp8 (1x128 blocks) before the
    second GEMM, as DeepSeek-V3/R1 fp8 checkpoints are served (``intermediate_quant="auto"``, the
    default); ``intermediate_quant="none"`` keeps it bf16.
    ``up_first``: the checkpoint stacks up rows before gate rows."""
    from . import local_comm

    experts = block.experts
    w13, w2 = _expert_tensors(experts, up_first)
    E, I2, H = w13.shape
    gate = block.gate
    K = int(getattr(gate, "top_k", getattr(block, "top_k", 0)))
    device = w13.device
    if comm is None:  # one rank on the block's device
        comm = local_comm("cuda", device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else local_comm()
    R = comm.size
    if E % R != 0:
        raise UsageError(f"from_hf: {E} experts do not split evenly over {R} ranks")
    lo, n = comm.rank * (E // R), E // R
    cfg = MoeConfig(hidden=int(H), intermediate=int(I2 // 2), num_experts=int(E), top_k=K, num_ranks=R,
                    capacity=capacity, dispatch_format=dispatch_format, weight_format=weight_format,
                    dispatcher=("local" if R == 1 else "nvlink") if device.type == "cuda" else ("local" if R == 1 else "cpu"),
                    runner="cuda" if device.type == "cuda" else "reference")
    for k, v in _router_of(block).items():
        setattr(cfg.router, k, v)
    for k, v in config.items():
        setattr(cfg, k, v)
    mine13 = w13[lo:lo + n].to(torch.bfloat16).contiguous()
    mine2 = w2[lo:lo + n].to(torch.bfloat16).contiguous()
    bias = getattr(gate, "e_score_correction_bias", None)
    if weight_format == "bf16":
        mod = EpMoE(cfg, comm, mine13, mine2, bias)
    else:
        mod = EpMoEQuantized(cfg, comm, mine13.float().cpu().numpy(), mine2.float().cpu().numpy(), device, bias)
    fp32_logits = cfg.router.kind == RouterKind.sigmoid_grouped_topk
    return EpMoEBlock(mod, gate.weight, fp32_logits, getattr(block, "shared_experts", None))


class EpMoEQuantized(EpMoE):
    """EpMoE over fp8 / nvfp4 weights quantized from fp32 arrays on the host, held on ``device``."""

    def __init__(self, config: MoeConfig, comm, w13_f32, w2_f32, device, router_bias=None):
        torch.nn.Module.__init__(self)
        from . import quantize_weights
        fmt = config.weight_format.name
        ck = quantize_weights(w13_f32, w2_f32, fmt)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in ck.items()}
        for k, t in tensors.items():
            self.register_buffer(k, t, persistent=False)
        make = getattr(ExpertWeights, fmt)
        self._weights = make(**{k: _dl(t) for k, t in tensors.items()})
        self._build(config, comm, router_bias)


def communicator(group=None, device: Optional[int] = None, timeout_ms: int = 60000, comm_ptr: Optional[int] = None,
                 adopt: bool = False):
    """An epmoe NCCL communicator for a torch.distributed process group (default: the world).

    ``adopt=True`` uses the NCCL communicator the group already owns (ProcessGroupNCCL's
    ``comm_ptr``, where this PyTorch has it, after one collective has made it): epmoe never destroys
    it, and the caller must keep the group's own collectives and epmoe's calls in the same order on
    every rank (they share one communicator). ``comm_ptr`` adopts a given ``ncclComm_t`` address
    instead (e.g. torchcomms' ``get_nccl_comm_ptr()``). Otherwise (the default) a new communicator
    is made: rank and size from the group, an NCCL id made on the group's rank 0 and broadcast
    through the group. The GPU is ``device`` or the current CUDA device."""
    from . import with_nccl

    if not with_nccl:
        raise UsageError("epmoe.torch.communicator: this epmoe was built without NCCL (no nvcc/NCCL at build time); "
                         "rebuild on a machine with the CUDA toolkit and NCCL")
    if not torch.cuda.is_available():
        raise UsageError("epmoe.torch.communicator: no CUDA device is visible to this process")
    if comm_ptr is None and adopt:
        comm_ptr = _group_comm_ptr(group, device)
    if comm_ptr is not None:
        from . import adopt_nccl_comm
        return adopt_nccl_comm(comm_ptr, timeout_ms)
    import torch.distributed as dist
    from . import nccl_comm, nccl_unique_id

    if not dist.is_initialized():
        raise UsageError("epmoe.torch.communicator: torch.distributed is not initialized (init_process_group first)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    obj = [nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(obj, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    dev = torch.cuda.current_device() if device is None else device
    return nccl_comm(obj[0], rank, world, dev, timeout_ms)


def _group_comm_ptr(group, device: Optional[int]) -> int:
    """The ncclComm_t of a ProcessGroupNCCL, made by one collective if it does not exist yet."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise UsageError("epmoe.torch.communicator(adopt=True): torch.distributed is not initialized")
    pg = group if group is not None else dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    try:
        backend = pg._get_backend(dev)
    except Exception as e:  # noqa: BLE001  (no NCCL backend on this group)
        raise UsageError(f"epmoe.torch.communicator(adopt=True): the group has no NCCL backend ({e}); "
                         "use adopt=False (a new communicator made through the group)") from e
    getter = getattr(backend, "comm_ptr", None)
    if getter is None:
        getter = getattr(backend, "_comm_ptr", None)
    if getter is None:
        raise UsageError("epmoe.torch.communicator(adopt=True): this PyTorch's ProcessGroupNCCL does not expose "
                         "its communicator (comm_ptr); use adopt=False")

    def read() -> int:
        return int(getter() if callable(getter) else getter)

    ptr = read()
    if ptr == 0:  # NCCL communicators are made lazily, at the group's first collective on the device
        dist.all_reduce(torch.zeros(1, device=dev), group=pg)
        torch.cuda.synchronize(dev)
        ptr = read()
    if ptr == 0:
        raise UsageError("epmoe.torch.communicator(adopt=True): the group's NCCL communicator does not exist "
                         "after a collective; use adopt=False")
    return ptr
