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

from . import ExpertWeights, MoeConfig, UsageError
from . import MoeLayer as _Layer

_layers: Dict[int, _Layer] = {}
_next_id = itertools.count(1)
_lock = threading.Lock()

_lib = torch.library.Library("epmoe", "FRAGMENT")
_lib.define("forward(Tensor hidden, Tensor router_logits, int layer) -> Tensor")
_lib.define("forward_routed(Tensor hidden, Tensor topk_ids, Tensor topk_weights, int layer) -> Tensor")


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


def _forward_impl(hidden: torch.Tensor, router_logits: torch.Tensor, layer: int) -> torch.Tensor:
    out = torch.empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16, device=hidden.device)
    _layer(layer)._forward(_dl(hidden), _dl(router_logits), _dl(out), _stream_of(hidden))
    return out


def _forward_routed_impl(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                         layer: int) -> torch.Tensor:
    out = torch.empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16, device=hidden.device)
    _layer(layer)._forward_routed(_dl(hidden), _dl(topk_ids), _dl(topk_weights), _dl(out), _stream_of(hidden))
    return out


for _key in ("CPU", "CUDA"):
    _lib.impl("forward", _forward_impl, _key)
    _lib.impl("forward_routed", _forward_routed_impl, _key)


@torch.library.register_fake("epmoe::forward")
def _forward_fake(hidden, router_logits, layer):
    return hidden.new_empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16)


@torch.library.register_fake("epmoe::forward_routed")
def _forward_routed_fake(hidden, topk_ids, topk_weights, layer):
    return hidden.new_empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16)


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

    def __init__(self, config: MoeConfig, comm, w13: torch.Tensor, w2: torch.Tensor):
        super().__init__()
        for name, t in (("w13", w13), ("w2", w2)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
                raise UsageError(f"EpMoE {name} must be a bfloat16 torch.Tensor, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}; convert with .to(torch.bfloat16)")
        self.register_buffer("w13", w13.contiguous(), persistent=False)
        self.register_buffer("w2", w2.contiguous(), persistent=False)
        self._weights = ExpertWeights.bf16(_dl(self.w13), _dl(self.w2))
        self._comm = comm
        self._layer = _Layer(config, comm, self._weights)
        self._handle = _register(self._layer)

    @property
    def config(self) -> MoeConfig:
        return self._layer.config

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        return torch.ops.epmoe.forward(hidden, router_logits, self._handle)

    def forward_routed(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                       topk_weights: torch.Tensor) -> torch.Tensor:
        return torch.ops.epmoe.forward_routed(hidden, topk_ids, topk_weights, self._handle)

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None:
            with _lock:
                _layers.pop(handle, None)
