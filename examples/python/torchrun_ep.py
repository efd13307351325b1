"""Expert parallelism from PyTorch: one process per GPU under torchrun, checked against one GPU.

Every rank (one process per GPU) builds the same synthetic MoE layer from one seed and keeps its
share of the experts (E/R contiguous experts, DESIGN.md §3.1). Each rank routes its own tokens,
with different counts per rank (rank 1 has none by default), through ``epmoe.torch.EpMoE`` over an
epmoe NCCL communicator made by ``epmoe.torch.communicator()`` from the torch.distributed world
(or, with ``--comm-ptr``, adopting the communicator torch's ProcessGroupNCCL already owns). The
forward is then captured in a CUDA graph and replayed. Rank 0 finally rebuilds the whole layer on
its own GPU (all E experts, dispatcher "local", runner "cuda", the same weights) and runs every
rank's tokens through it as the reference.

What is checked, and why with which strictness:
  * replays of the captured graph == the eager forward, bitwise, on every rank: the combine adds
    the ranks' rows in a fixed order (ascending rank, fp32 from +0; DESIGN.md §5), so one rank's
    output is the same bits from run to run. Two eager forwards are compared the same way.
  * the R-rank layer against the one-GPU reference, within a tolerance (max|a-b| / max|ref| and
    1 - cosine): NOT bitwise, by design. With R ranks each rank's runner rounds its partial sum
    (the token's experts that live on it) to bf16 before the combine adds the partials (§4.1,
    §5); on one GPU all K experts are summed in fp32 and rounded once. An fp8 combine
    (--combine-format fp8) re-quantizes each partial as well. The defaults are the bounds
    DESIGN.md §6 sets for a multi-GPU layer: 3e-2 and 1e-3 (1e-1 with an fp8 combine or an fp8
    intermediate, which fp8 weights get by default: intermediate_quant "auto"). A wrong expert
    slice, routing or combine shows up as errors of order 1.

Run it (2 GPUs of one node; the "nvlink" dispatcher needs them in one NVLink domain):

    torchrun --standalone --nproc-per-node 2 examples/python/torchrun_ep.py
    torchrun --standalone --nproc-per-node 2 examples/python/torchrun_ep.py --comm-ptr
    torchrun --standalone --nproc-per-node 4 examples/python/torchrun_ep.py --weight-format fp8 \\
        --dispatch-format fp8 --tokens 96,0,33,200
    torchrun --standalone --nproc-per-node 2 examples/python/torchrun_ep.py --dispatcher nccl

(PYTHONPATH=<build>/python for a build tree, or pip install . first.) The "nccl" dispatcher
synchronizes with the host once per dispatch and cannot be captured: the graph step is skipped for
it. epmoe must be built against the NCCL that torch loads (setup.sh does this where torch is
installed; importing epmoe after torch checks it). Exit code 0 when every check passes on every
rank, 1 otherwise; each rank prints one line per check.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                epilog="Run under torchrun: torchrun --standalone --nproc-per-node N " + sys.argv[0])
    p.add_argument("--experts", type=int, default=16, help="routed experts E (a multiple of the rank count)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size H")
    p.add_argument("--intermediate", type=int, default=512, help="intermediate size I of one expert")
    p.add_argument("--top-k", type=int, default=4, help="experts per token K")
    p.add_argument("--tokens", default="96,0,33,1,200,7,64,129",
                   help="tokens per rank, comma-separated (rank r takes entry r mod the list's length)")
    p.add_argument("--capacity", type=int, default=0, help="tokens one rank may send per call (0: the largest count)")
    p.add_argument("--dispatcher", choices=["nvlink", "nccl"], default="nvlink")
    p.add_argument("--weight-format", choices=["bf16", "fp8", "nvfp4"], default="bf16")
    p.add_argument("--dispatch-format", choices=["bf16", "fp8", "nvfp4"], default="bf16")
    p.add_argument("--combine-format", choices=["bf16", "fp8"], default="bf16")
    p.add_argument("--routed", action="store_true",
                   help="forward_routed with ids/weights made here (some ids -1, one token with none) "
                        "instead of forward with router logits")
    p.add_argument("--comm-ptr", action="store_true",
                   help="adopt the ncclComm_t of torch's ProcessGroupNCCL instead of making a new one")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other MoeConfig field, e.g. intermediate_quant=none (default auto: fp8 for fp8 "
                        "weights) or tuning.comm_sms=16")
    p.add_argument("--replays", type=int, default=20, help="back-to-back graph replays (timed)")
    p.add_argument("--tol", type=float, default=0.0, help="max|a-b|/max|ref| bound (0: DESIGN.md §6's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=60000)
    return p.parse_args(argv)


# ---- the synthetic layer: every rank computes the same from the seed ---------------------------


def token_counts(args, world: int) -> list[int]:
    counts = [int(v) for v in args.tokens.split(",") if v.strip()]
    return [counts[r % len(counts)] for r in range(world)]


def full_weights(args):
    """fp32 W13 [E, 2I, H] (gate rows, then up) and W2 [E, H, I] on the CPU, from the seed."""
    g = torch.Generator().manual_seed(args.seed)
    E, H, I = args.experts, args.hidden, args.intermediate
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    return w13, w2


def rank_inputs(args, r: int, T: int):
    """Rank r's tokens (CPU): hidden bf16 [T, H] and either router logits fp32 [T, E] or, with
    --routed, topk_ids int32 [T, K] (some -1, the last token all -1) and topk_weights fp32 [T, K]."""
    g = torch.Generator().manual_seed(args.seed * 1000 + 17 + r)
    E, K = args.experts, args.top_k
    hidden = torch.randn(T, args.hidden, generator=g).bfloat16()
    scores = torch.randn(T, E, generator=g)
    if not args.routed:
        return hidden, (scores,)
    top, ids = scores.topk(K, dim=1)
    weights = torch.softmax(top, dim=1)
    ids = ids.int()
    ids[torch.rand(T, K, generator=g) < 0.1] = -1
    if T > 2:
        ids[-1] = -1
    return hidden, (ids.contiguous(), weights.contiguous())


def apply_sets(cfg, sets):
    for item in sets:
        key, _, text = item.partition("=")
        value: object = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for conv in (int, float):
                try:
                    value = conv(text)
                    break
                except ValueError:
                    pass
        *path, last = key.split(".")
        obj = cfg
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)


def make_config(args, R: int, capacity: int, dispatcher: str, all_hidden: torch.Tensor):
    import epmoe

    cfg = epmoe.MoeConfig(hidden=args.hidden, intermediate=args.intermediate, num_experts=args.experts,
                          top_k=args.top_k, num_ranks=R, capacity=max(capacity, 1), dispatcher=dispatcher,
                          runner="cuda", weight_format=args.weight_format, dispatch_format=args.dispatch_format,
                          combine_format=args.combine_format, timeout_ms=args.timeout_ms)
    if args.dispatch_format == "nvfp4":  # the activations' global scale: the same on every rank
        amax = all_hidden.float().abs().max().item() if all_hidden.numel() else 1.0
        cfg.nvfp4_global_scale = 448.0 * 6.0 / max(amax, 1e-30)
    apply_sets(cfg, args.set)
    for issue in cfg.validate():
        raise SystemExit(f"configuration: {issue.field}={issue.value}: {issue.message}")
    return cfg


def make_module(cfg, comm, w13, w2, device):
    import epmoe.torch as et

    if cfg.weight_format.name == "bf16":
        return et.EpMoE(cfg, comm, w13.bfloat16().to(device), w2.bfloat16().to(device))
    return et.EpMoEQuantized(cfg, comm, w13.contiguous().numpy(), w2.contiguous().numpy(), device)


def run(module, hidden, route):
    return module.forward_routed(hidden, *route) if len(route) == 2 else module(hidden, *route)


def bounds(args, cfg):
    # The resolved value: intermediate_quant "auto" (the default) means fp8 for fp8 weights.
    loose = args.combine_format == "fp8" or cfg.effective_intermediate_quant.name == "fp8"
    tol = args.tol or (1e-1 if loose else 3e-2)
    return tol, 1e-3


# ---- the run -----------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("run this under torchrun: torchrun --standalone --nproc-per-node N " + sys.argv[0])
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off, also in torch's communicator
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    # device_id makes torch create its NCCL communicator now (needed before --comm-ptr reads it).
    dist.init_process_group("nccl", device_id=device)
    rank, R = dist.get_rank(), dist.get_world_size()

    import epmoe  # after torch: epmoe checks that the NCCL torch loaded is the one it was built for
    import epmoe.torch as et

    def say(msg):
        print(f"[rank {rank}/{R}] {msg}", flush=True)

    if not epmoe.with_nccl:
        raise SystemExit("epmoe was built without NCCL: multi-GPU needs a build with CUDA and NCCL")
    if args.experts % R:
        raise SystemExit(f"--experts {args.experts} does not split evenly over {R} ranks")
    counts = token_counts(args, R)
    capacity = args.capacity or max(counts)
    inputs = [rank_inputs(args, r, counts[r]) for r in range(R)]  # every rank's, for the shared scale
    all_hidden = torch.cat([h for h, _ in inputs])

    # --comm-ptr: adopt the communicator torch's ProcessGroupNCCL already owns.
    comm = et.communicator(device=local, timeout_ms=args.timeout_ms, adopt=args.comm_ptr)
    say(f"{comm!r} on cuda:{local}; tokens per rank {counts}, capacity {capacity}")

    w13, w2 = full_weights(args)
    n = args.experts // R
    cfg = make_config(args, R, capacity, args.dispatcher, all_hidden)
    layer = make_module(cfg, comm, w13[rank * n:(rank + 1) * n], w2[rank * n:(rank + 1) * n], device)

    hidden, route = inputs[rank]
    hidden = hidden.to(device)
    route = tuple(t.to(device) for t in route)
    failures = []

    def check(ok: bool, what: str):
        say(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    eager = run(layer, hidden, route).clone()
    again = run(layer, hidden, route)
    torch.cuda.synchronize()
    check(torch.equal(eager, again), "two eager forwards: bitwise equal")

    if args.dispatcher == "nvlink":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run(layer, hidden, route)  # warm up on the capture stream: workspaces grow outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # every rank captures; replays are collective like forwards
            captured = run(layer, hidden, route)
        same = True
        for _ in range(3):
            captured.zero_()
            graph.replay()
            torch.cuda.synchronize()
            same = same and torch.equal(captured, eager)
        check(same, "graph replays == eager, bitwise")
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(args.replays):  # back to back, as a serving loop replays them
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
        check(torch.equal(captured, eager), f"{args.replays} back-to-back replays: still bitwise equal "
                                            f"({start.elapsed_time(stop) * 1e3 / max(args.replays, 1):.1f} us "
                                            "per replay on this rank)")
        del graph
    else:
        say("skip  graph capture: the nccl dispatcher synchronizes with the host once per dispatch")

    # Rank 0 gathers every rank's output and compares it with one GPU running all experts.
    outs = [None] * R if rank == 0 else None
    dist.gather_object(eager.cpu(), outs, dst=0)
    if rank == 0:
        one = epmoe.local_comm("cuda", local)
        ref_cfg = make_config(args, 1, sum(counts), "local", all_hidden)
        ref_layer = make_module(ref_cfg, one, w13, w2, device)
        all_route = tuple(torch.cat([rt[i] for _, rt in inputs]).to(device) for i in range(len(route)))
        ref = run(ref_layer, all_hidden.to(device), all_route).float().cpu()
        tol, cos_tol = bounds(args, cfg)
        got = torch.cat([o.float() for o in outs])
        finite = bool(torch.isfinite(got).all())
        scale = ref.abs().max().item()
        rel = (got - ref).abs().max().item() / scale if scale > 0 else 0.0
        cos = torch.nn.functional.cosine_similarity(got.flatten().double(), ref.flatten().double(), dim=0).item() \
            if got.numel() else 1.0
        check(finite and rel <= tol and 1 - cos <= cos_tol,
              f"{R} ranks vs one GPU with all {args.experts} experts: max|diff|/max|ref| {rel:.3g} (bound {tol:g}), "
              f"1-cos {1 - cos:.3g} (bound {cos_tol:g}), {got.shape[0]} tokens, finite {finite}")
        del ref_layer

    verdict = torch.tensor([len(failures)], device=device)
    dist.all_reduce(verdict)
    # The epmoe objects go before the process group: an adopted communicator must outlive them.
    del layer, comm
    gc.collect()
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("torchrun_ep: " + ("ok" if verdict.item() == 0 else f"{int(verdict.item())} check(s) failed"))
    return 0 if verdict.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
