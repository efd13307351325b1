"""The synthetic model of ``epmoe run`` (src/harness/synthetic.h) from Python: for a seed, the same
expert weights (any rank builds only its own), inputs, router bias and router logits the C++ driver
builds, and ``run_stack``, which runs the same stack of layers (h <- bf16(h + MoE(h))) on simulated
CPU ranks. The Python front end's parity test compares its bytes with ``epmoe run --dump``."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from . import MoeConfig, MoeLayer, bf16_bits, bf16_to_float, cpu_group, local_comm, run_ranks
from ._C import _harness_random_hidden, _harness_rank_weights, _harness_router_bias, _harness_router_logits


def rank_weights(config: MoeConfig, seed: int, layer: int, rank: int):
    """Rank ``rank``'s experts of ``layer`` in config.weight_format (an ExpertWeights)."""
    return _harness_rank_weights(config, seed, layer, rank)


def random_hidden(tokens: int, hidden: int, seed: int) -> np.ndarray:
    """bf16 bits [T, H], entries ~ N(0, 1)."""
    return _harness_random_hidden(tokens, hidden, seed)


def router_bias(config: MoeConfig, seed: int, layer: int) -> np.ndarray:
    return _harness_router_bias(config, seed, layer)


def router_logits(config: MoeConfig, seed: int, layer: int, hidden: np.ndarray) -> np.ndarray:
    """float32 [T, E]: the layer's router applied to bf16 bits ``hidden`` (fp32, index order)."""
    return _harness_router_logits(config, seed, layer, np.ascontiguousarray(hidden))


def input_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s input in ``epmoe run``."""
    return seed * 7919 + 17 + rank


def run_stack(config: MoeConfig, tokens: Sequence[int], layers: int, seed: int = 1) -> List[np.ndarray]:
    """Every rank's final hidden state (bf16 bits [T_r, H]) after ``layers`` layers, as ``epmoe run``
    computes it on the CPU: one thread per rank (dispatcher "cpu", or "local" for one rank).
    nvfp4 dispatch needs the driver's per-layer calibration of the global scale, not done here."""
    if config.dispatch_format.name == "nvfp4":
        raise ValueError("run_stack: nvfp4 dispatch calibrates its global scale across ranks per layer; "
                         "not reproduced here")
    R, H = config.num_ranks, config.hidden

    def rank(comm):
        r = comm.rank
        h = random_hidden(tokens[r], H, input_seed(seed, r))
        for layer in range(layers):
            bias = router_bias(config, seed, layer)
            ml = MoeLayer(config, comm, rank_weights(config, seed, layer, r), bias)
            out = ml.forward(h, router_logits(config, seed, layer, h))
            h = bf16_bits(bf16_to_float(h) + bf16_to_float(out))
        return h

    comms = [local_comm()] if R == 1 and config.dispatcher == "local" else cpu_group(R, config.timeout_ms)
    return run_ranks(comms, rank)
