"""epmoe: expert-parallel Mixture-of-Experts layers for LLM inference.

The C++ core (``epmoe._C``) is reached through DLPack tensors: numpy arrays or torch tensors on the
CPU, torch tensors on a CUDA device. ``epmoe.torch`` adds the PyTorch integration. numpy has no
bfloat16: pass bf16 data as uint16 arrays holding the raw bits (``epmoe.bf16_bits``)."""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

import numpy as _np

def _load_build_nccl() -> None:
    """Makes the NCCL the extension was built against the one this process loads, where that can
    be arranged: NCCL is loaded once per process (by its soname), by whoever comes first."""
    try:
        from ._build import nccl_library
    except ImportError:
        return
    import importlib.util
    import os
    import sys

    if not nccl_library or "torch" in sys.modules:
        return  # torch already loaded its NCCL: the version check below decides
    if importlib.util.find_spec("torch") is not None:
        if f"{os.sep}nvidia{os.sep}nccl{os.sep}" in nccl_library:
            import torch  # noqa: F401  (built against PyTorch's NCCL: torch loads that copy)
        return  # otherwise loading ours first would hand torch an NCCL it was not built for
    if os.path.exists(nccl_library):
        import ctypes

        ctypes.CDLL(nccl_library, mode=ctypes.RTLD_GLOBAL)


_load_build_nccl()
try:
    from . import _C
except ImportError as _e:  # e.g. libnccl.so.2 / libcudart not found by the dynamic loader
    raise ImportError(f"epmoe's extension could not be loaded ({_e}); the CUDA/NCCL libraries it was built "
                      "with must be findable (LD_LIBRARY_PATH), or build a CPU-only wheel on a machine without "
                      "nvcc") from _e
from ._C import (  # noqa: F401  (the public API)
    ActFormat,
    BackendError,
    CombineMode,
    Communicator,
    ConfigIssue,
    CutlassSwap,
    ExpertPlacement,
    ExpertWeights,
    FaultCheck,
    IntermediateQuant,
    ModelPreset,
    MoeConfig,
    RouterConfig,
    RouterKind,
    RunnerEngine,
    TimeoutError,
    Tuning,
    UsageError,
    WeightFormat,
    cpu_group,
    default_tuning,
    describe,
    environment_issues,
    legal_pairs,
    local_comm,
    preset,
    presets,
    quantize_weights,
    validate,
)

__version__ = _C.__version__
with_cuda: bool = _C.with_cuda
with_nccl: bool = _C.with_nccl

if with_nccl:
    from ._C import adopt_nccl_comm, nccl_comm, nccl_group, nccl_unique_id, nccl_versions  # noqa: F401

    # NCCL's device API is inlined from the headers the extension was built with: the library loaded
    # now (perhaps PyTorch's copy, if torch was imported first) must be the same version.
    _problem = _C._nccl_version_problem()
    if _problem:
        raise ImportError(_problem)


def bf16_bits(x: _np.ndarray) -> _np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even: num::f32_to_bf16, bit for bit."""
    u = _np.ascontiguousarray(x, dtype=_np.float32).view(_np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    out = (rounded >> 16).astype(_np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000  # quiet NaN with the sign and top payload bits kept
    out[nan] = ((u[nan] >> 16) | 0x40).astype(_np.uint16)
    return out


def bf16_to_float(bits: _np.ndarray) -> _np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly."""
    return (_np.ascontiguousarray(bits, dtype=_np.uint16).astype(_np.uint32) << 16).view(_np.float32)


def _empty_like_rows(hidden, cols: int):
    """An output [T, cols] bf16 on hidden's device, from hidden's own library."""
    T = hidden.shape[0]
    if isinstance(hidden, _np.ndarray):
        return _np.empty((T, cols), dtype=_np.uint16)
    try:
        import torch  # only when the caller already uses torch tensors
    except ImportError as e:  # pragma: no cover
        raise UsageError(f"out=None with a {type(hidden).__name__} input: pass out=") from e
    if isinstance(hidden, torch.Tensor):
        return torch.empty((T, cols), dtype=torch.bfloat16, device=hidden.device)
    raise UsageError(f"out=None with a {type(hidden).__name__} input: pass out= (a bf16 [T, H] tensor)")


class MoeLayer(_C.MoeLayer):
    """One rank's share of an expert-parallel MoE layer.

    ``MoeLayer(config, comm, weights)`` is collective over the communicator's ranks. ``forward``
    routes with the configured router; ``forward_routed`` takes routing done elsewhere. Both return
    ``out`` (allocated like ``hidden`` when not given)."""

    def forward(self, hidden, router_logits, out=None, stream: int = 0):
        if out is None:
            out = _empty_like_rows(hidden, self.config.hidden)
        self._forward(hidden, router_logits, out, stream)
        return out

    def forward_routed(self, hidden, topk_ids, topk_weights, out=None, stream: int = 0):
        if out is None:
            out = _empty_like_rows(hidden, self.config.hidden)
        self._forward_routed(hidden, topk_ids, topk_weights, out, stream)
        return out


def run_ranks(comms: Sequence[Communicator], fn: Callable[[Communicator], object]) -> list:
    """Runs fn(comm) on one thread per communicator (simulated ranks) and returns the results in
    rank order. If ranks raise, the lowest rank's exception is re-raised, preferring one that is
    not a TimeoutError: a failing rank leaves its peers to time out, and the cause is what matters."""
    results: list = [None] * len(comms)
    errors: list[Optional[BaseException]] = [None] * len(comms)

    def body(i: int) -> None:
        try:
            results[i] = fn(comms[i])
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), name=f"epmoe-rank{i}") for i in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        first = next((e for e in failed if not isinstance(e, TimeoutError)), failed[0])
        raise first
    return results
