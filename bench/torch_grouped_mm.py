#!/usr/bin/env python3
"""PyTorch's grouped GEMMs on the shapes and routing of `epmoe bench runner`, in the same GPU session.

The expert MLP written the way a PyTorch user would with the grouped primitives, rows already
sorted by expert (the permute into expert order, the weighting and the scatter back are excluded
unless --permute):
  bf16: torch._grouped_mm(x [M, H], w13^T, offs) -> silu(gate) * up -> torch._grouped_mm(., w2^T, offs)
  fp8:  x and the intermediate quantized to e4m3 per row (torch ops, timed; --prequant-x leaves x's
        out), weights e4m3 with one scale per output channel, torch._scaled_grouped_mm for both
        GEMMs (the row-wise recipe torch runs on Hopper), bf16 out.
Presets, M list, local experts (the preset's experts / 2), routing (slot j -> expert j % E; --skew:
the first half of the slots on the first tenth of the experts; --routing router: the preset's router
on random N(0, 1) logits, its picks of local experts in token order, the same rule as the runner
bench's but torch's random numbers, so the same distribution and not the same rows) and the floor
column are those of `epmoe bench runner`, so the two tables compare row by row: floor = max(weight bytes of the experts
that received rows / (0.9 x the HBM copy rate measured in this run), 2*M*3*H*I / P), P = 700 TFLOP/s
(bf16) or 1100 (fp8), with the runner's weight bytes (fp8: its 128x128 block scales; the per-channel
scales used here differ by < 0.1%).

    python3 bench/torch_grouped_mm.py [--preset LIST|all] [--m LIST] [--quick] [--routing uniform|skew|router]
                                      [--formats bf16,fp8] [--local-experts N] [--reps N] [--dry-run]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

# name -> (hidden H, intermediate I, experts, top-k): src/core/presets.cpp. "tiny" is the test shape
# and runs only when named, as in `epmoe bench runner --preset all`.
PRESETS = {
    "tiny": (256, 128, 16, 4),
    "deepseek-v3": (7168, 2048, 256, 8),
    "qwen3-235b-a22b": (4096, 1536, 128, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "gpt-oss-120b": (2880, 2880, 128, 4),
}
# name -> router: ("softmax",) = top-k of the logits, or ("sigmoid", n_group, topk_group) = DeepSeek's
# grouped top-k (groups ranked by the sum of their two best sigmoid scores): src/core/presets.cpp.
ROUTERS = {
    "tiny": ("softmax",),
    "deepseek-v3": ("sigmoid", 8, 4),
    "qwen3-235b-a22b": ("softmax",),
    "qwen3-30b-a3b": ("softmax",),
    "mixtral-8x7b": ("softmax",),
    "gpt-oss-120b": ("softmax",),
}
ROUTINGS = ("uniform", "skew", "router")
ROUTER_SEED = 4242  # the runner bench's
DEFAULT_MS = [128, 512, 2048, 4096, 8192, 16384, 32768, 131072]
QUICK_MS = [128, 2048, 32768]
FORMATS = ("bf16", "fp8")
PEAK_FLOPS = {"bf16": 700e12, "fp8": 1100e12}
FP8_MAX = 448.0
HBM_COPY_BYTES = 2 << 30  # the runner bench's D2D copy: 2 GiB, read + written


# ---- Plan: plain functions (no GPU), tested on the CPU ------------------------------------------

def parse_presets(text):
    if text == "all":
        return [n for n in PRESETS if n != "tiny"]
    names = [t.strip() for t in text.split(",")]
    for n in names:
        if n not in PRESETS:
            raise ValueError(f"--preset: unknown preset '{n}'; use all or one of {', '.join(PRESETS)}")
    return names


def parse_positive_list(text, flag):
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok.isdigit() or int(tok) <= 0:
            raise ValueError(f"{flag}: '{tok}' is not a positive integer")
        out.append(int(tok))
    return out


def parse_formats(text):
    out = [t.strip() for t in text.split(",")]
    for f in out:
        if f not in FORMATS:
            raise ValueError(f"--formats: unknown format '{f}'; use bf16, fp8 (torch has no nvfp4 grouped GEMM on Hopper)")
    return out


def local_experts(preset, override=0):
    """The runner bench's default: the preset's experts / 2 (EP 2), at least 1."""
    return override if override > 0 else max(1, PRESETS[preset][2] // 2)


def expert_of(j, M, E, skew):
    """Expert of slot j of an M-slot call, exactly as `epmoe bench runner` routes."""
    hot = max(1, E // 10)
    return j % hot if skew and j < M // 2 else j % E


def _count_mod(a, b, n, r):
    """Number of j in [a, b) with j % n == r."""
    def upto(x):  # j in [0, x)
        return (x - r + n - 1) // n if x > r else 0
    return upto(b) - upto(a)


def rows_per_expert(M, E, skew):
    """Rows each local expert receives (sums to M); closed form of counting expert_of over the slots."""
    if not skew:
        return [M // E + (1 if e < M % E else 0) for e in range(E)]
    hot, half = max(1, E // 10), M // 2
    return [(_count_mod(0, half, hot, e) if e < hot else 0) + _count_mod(half, M, E, e) for e in range(E)]


def route_topk(logits, router, K, torch):
    """Expert ids [T, K] the preset's router picks (best first) for logits [T, E] (float32, CPU)."""
    if router[0] == "softmax":
        return torch.topk(logits, K, dim=1).indices
    _, n_group, topk_group = router
    T, E = logits.shape
    s = torch.sigmoid(logits)
    group = torch.topk(s.view(T, n_group, E // n_group), 2, dim=2).values.sum(dim=2)  # [T, n_group]
    keep = torch.topk(group, topk_group, dim=1).indices
    mask = torch.zeros(T, n_group, dtype=torch.bool).scatter_(1, keep, True)
    s = s.masked_fill(~mask.repeat_interleave(E // n_group, dim=1), float("-inf"))
    return torch.topk(s, K, dim=1).indices


def router_ids(preset, M, E_local, seed=ROUTER_SEED):
    """The first M local-expert picks (ids < E_local, token by token, k by k) of the preset's router on
    random N(0, 1) logits, 4096 tokens at a time; a prefix of the same stream for a smaller M."""
    import torch
    _, _, E, K = PRESETS[preset]
    gen = torch.Generator().manual_seed(seed)
    out, have = [], 0
    while have < M:
        ids = route_topk(torch.randn(4096, E, generator=gen), ROUTERS[preset], K, torch).reshape(-1)
        local = ids[ids < E_local]
        out.append(local[:M - have])
        have += out[-1].numel()
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def routed_counts(preset, M, E, routing):
    """Rows per local expert of an M-row call under `routing` (uniform, skew or router)."""
    if routing != "router":
        return rows_per_expert(M, E, routing == "skew")
    import torch
    return torch.bincount(router_ids(preset, M, E), minlength=E).tolist()


def offsets(counts):
    """Cumulative end offsets of each expert's rows (torch._grouped_mm's offs)."""
    out, s = [], 0
    for c in counts:
        s += c
        out.append(s)
    return out


def weight_bytes(fmt, H, I):
    """Bytes of one expert's weights as the runner bench counts them (fp8 with 128x128 block scales)."""
    el = 3.0 * H * I
    return el * 2 if fmt == "bf16" else el + el / (128 * 128) * 4


def flops(M, H, I):
    return 2.0 * M * 3.0 * H * I


def floor_ms(fmt, M, H, I, counts, hbm_gbs):
    """max(weight bytes of the experts that received rows / (0.9 x HBM copy), FLOPs / P), in ms."""
    touched = sum(1 for c in counts if c > 0)
    return max(touched * weight_bytes(fmt, H, I) / (0.9 * hbm_gbs * 1e9), flops(M, H, I) / PEAK_FLOPS[fmt]) * 1e3


def reps_for(M, reps):
    """The runner bench's repetitions: fewer at large M."""
    return max(3, reps // 2) if M >= 32768 else reps


def memory_needed(fmt, E, H, I, M, permute=False):
    """Upper estimate of the device bytes one point allocates: weights plus the activations and the
    temporaries of the torch ops (the fp8 quantization makes float32 copies of a row block)."""
    el = 3 * H * I
    if fmt == "bf16":
        w = E * el * 2
    else:  # e4m3 weights, per-channel scales, and one expert's bf16 + float32 source while quantizing
        w = E * el + E * (2 * I + H) * 4 + 2 * I * H * 6
    act = M * (H * 2 + 2 * I * 2 + I * 2 * 2 + H * 2)  # x, gate|up, silu temp + intermediate, y
    if fmt == "fp8":
        act += M * (H + I) + M * max(H, I) * 10 + M * 8  # codes, abs/float32/scaled temporaries, scales
    if permute:
        act += M * (H * 2 * 2 + 16)  # gathered x, weighted y, order/ids
    return w + act


def plan(preset, Ms, E_override, routing, formats):
    """H, I, local experts and the points [(M, rows per expert)] of one preset; `routing` is uniform,
    skew or router (a bool is read as skew or uniform)."""
    if isinstance(routing, bool):
        routing = "skew" if routing else "uniform"
    H, I, _, _ = PRESETS[preset]
    E = local_experts(preset, E_override)
    return H, I, E, [(M, routed_counts(preset, M, E, routing)) for M in Ms]


def describe_counts(counts):
    """Short text of a row distribution: touched experts, min/max rows among them."""
    nz = [c for c in counts if c > 0]
    if not nz:
        return "no rows"
    return f"{len(nz)}/{len(counts)} experts get rows, {min(nz)}..{max(nz)} rows each"


def dry_run(args, presets, Ms, formats, out=sys.stdout):
    """The planned points, with floors at an assumed HBM rate (--hbm-gbs); touches no device."""
    print(f"# torch grouped-GEMM bench, dry run: HBM copy assumed {args.hbm_gbs:.0f} GB/s", file=out)
    for name in presets:
        H, I, E, pts = plan(name, Ms, args.local_experts, False, formats)
        _, _, _, skew_pts = plan(name, Ms, args.local_experts, True, formats)
        print(f"\n## {name}: H={H} I={I}, {E} local experts, gemm1 [M,{H}]x[{H},{2 * I}], "
              f"gemm2 [M,{I}]x[{I},{H}]", file=out)
        print("| M | uniform rows | skew rows | format | floor ms (uniform) | floor ms (skew) | reps | "
              "device GB needed |", file=out)
        print("|---|---|---|---|---|---|---|---|", file=out)
        for (M, cu), (_, cs) in zip(pts, skew_pts):
            for f in formats:
                print(f"| {M} | {describe_counts(cu)} | {describe_counts(cs)} | {f} | "
                      f"{floor_ms(f, M, H, I, cu, args.hbm_gbs):.3f} | {floor_ms(f, M, H, I, cs, args.hbm_gbs):.3f} | "
                      f"{reps_for(M, args.reps)} | {memory_needed(f, E, H, I, M, args.permute) / 1e9:.2f} |", file=out)


# ---- Device work ---------------------------------------------------------------------------------

def quant_rows(t, torch):
    """e4m3 codes and float32 scales, one per row (the last dim is reduced): the row-wise recipe."""
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    q = (t.float() * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, (amax / FP8_MAX).squeeze(-1).contiguous()


def make_weights(fmt, E, H, I, device, torch, seed=1234):
    """Random expert weights in the nn.Linear layout ([E, out, in]); fp8 quantized one expert at a
    time so that the bf16 copy of all experts never exists."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def one(n, k):
        return (torch.randn(n, k, generator=g, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16)

    if fmt == "bf16":
        w = {"w13": torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=device),
             "w2": torch.empty(E, H, I, dtype=torch.bfloat16, device=device)}
        for e in range(E):
            w["w13"][e], w["w2"][e] = one(2 * I, H), one(H, I)
        return w
    w = {"w13": torch.empty(E, 2 * I, H, dtype=torch.float8_e4m3fn, device=device),
         "s13": torch.empty(E, 2 * I, dtype=torch.float32, device=device),
         "w2": torch.empty(E, H, I, dtype=torch.float8_e4m3fn, device=device),
         "s2": torch.empty(E, H, dtype=torch.float32, device=device)}
    for e in range(E):
        w["w13"][e], w["s13"][e] = quant_rows(one(2 * I, H), torch)
        w["w2"][e], w["s2"][e] = quant_rows(one(H, I), torch)
    return w


def mlp_bf16(x, w, offs, torch):
    """GEMM1 -> SwiGLU -> GEMM2 on rows sorted by expert; mat_b is the transposed [E, out, in] view."""
    I = w["w2"].shape[2]
    h = torch._grouped_mm(x, w["w13"].transpose(-2, -1), offs=offs)
    a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    return torch._grouped_mm(a, w["w2"].transpose(-2, -1), offs=offs)


def mlp_fp8(x, w, offs, torch, xq=None):
    """The same with e4m3 operands: x and the intermediate quantized per row (x skipped when given as
    xq = (codes, scales)); weights column-major for torch._scaled_grouped_mm, one scale per channel."""
    I = w["w2"].shape[2]
    q, s = xq if xq is not None else quant_rows(x, torch)
    h = torch._scaled_grouped_mm(q, w["w13"].transpose(-2, -1), s, w["s13"], offs=offs, out_dtype=torch.bfloat16)
    a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    q2, s2 = quant_rows(a, torch)
    return torch._scaled_grouped_mm(q2, w["w2"].transpose(-2, -1), s2, w["s2"], offs=offs, out_dtype=torch.bfloat16)


def permuted(mlp, x, ids, wts, E, torch):
    """What a layer adds around the grouped MLP: order rows by expert, offsets from the ids, gather,
    and the weighted scatter back into slot order."""
    order = torch.argsort(ids, stable=True)
    offs = torch.cumsum(torch.bincount(ids, minlength=E), 0, dtype=torch.int32)
    y = mlp(x.index_select(0, order), offs)
    out = torch.empty_like(y)
    out.index_copy_(0, order, y * wts.index_select(0, order).unsqueeze(1).to(y.dtype))
    return out


def time_ms(fn, warm, reps, device, torch):
    """Median ms of `reps` calls after `warm` untimed ones, each call waited for (CUDA events)."""
    for _ in range(warm):
        fn()
    t = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            t.append(a.elapsed_time(b))
    else:  # the CPU smoke run: host wall time
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median_high(t)


def hbm_copy_gbs(device, torch, nbytes=HBM_COPY_BYTES):
    """The copy rate the floor is based on: a D2D copy of nbytes, read + written counted."""
    src = torch.full((nbytes,), 1, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 2, 5, device, torch)
    del src, dst
    return 2.0 * nbytes / (ms * 1e6)


def free_bytes(device, torch):
    if device != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def short_error(e):
    text = " ".join(str(e).split()).replace("|", "/")  # a "|" would split the table cell
    return f"{type(e).__name__}: {text[:160]}"


def bench_preset(name, args, Ms, formats, hbm_gbs, device, torch, gpu):
    H, I, E, pts = plan(name, Ms, args.local_experts, args.routing, formats)
    how = {"uniform": "uniform", "skew": "skewed",
           "router": "the preset's router on random N(0, 1) logits (torch's generator)"}[args.routing]
    print(f"\n# torch grouped_mm: {gpu}, {name} H={H} I={I}, {E} local experts, median of {args.reps}, "
          f"routing {how}{', with permute' if args.permute else ''}")
    print("\n| M | format | torch op | time ms | floor ms | floor / time | TFLOP/s |\n|---|---|---|---|---|---|---|")
    sys.stdout.flush()
    notes = []
    for fmt in formats:
        op = ("_grouped_mm" if fmt == "bf16" else "_scaled_grouped_mm") + (" +permute" if args.permute else "")
        if fmt == "fp8" and args.prequant_x:
            op += " (x pre-quantized)"
        have = hasattr(torch, "_grouped_mm" if fmt == "bf16" else "_scaled_grouped_mm")
        free = free_bytes(device, torch)

        def fits(M):
            return free is None or memory_needed(fmt, E, H, I, M, args.permute) * 1.1 + (512 << 20) <= free
        # The weights serve every M: a large M that does not fit is skipped alone, below.
        fit = [M for M, _ in pts if fits(M)]
        why = None
        if not have:
            why = f"torch {torch.__version__} has no torch.{op.split()[0]}"
        elif fmt == "fp8" and not hasattr(torch, "float8_e4m3fn"):
            why = f"torch {torch.__version__} has no float8_e4m3fn"
        elif not fit:
            m0 = min(Ms)
            why = f"needs ~{memory_needed(fmt, E, H, I, m0, args.permute) / 1e9:.1f} GB at M={m0}, {free / 1e9:.1f} GB free"
        if why:
            for M, _ in pts:
                print(f"| {M} | {fmt} | {op} | skipped: {why} | - | - | - |")
            continue
        # x is shared by the points: sized for the largest M that fits.
        try:
            w = make_weights(fmt, E, H, I, device, torch)
            x = torch.randn(max(fit), H, device=device, dtype=torch.bfloat16)
        except Exception as e:  # noqa: BLE001 - any refusal becomes a row, never a crash
            for M, _ in pts:
                print(f"| {M} | {fmt} | {op} | weights/inputs failed: {short_error(e)} | - | - | - |")
            w = x = None
            free_bytes(device, torch)
            continue
        for M, counts in pts:
            fl = floor_ms(fmt, M, H, I, counts, hbm_gbs)
            free = free_bytes(device, torch)
            act = memory_needed(fmt, E, H, I, M, args.permute) - memory_needed(fmt, E, H, I, 0, args.permute)
            if M not in fit or (free is not None and act * 1.1 + (256 << 20) > free):
                print(f"| {M} | {fmt} | {op} | skipped: activations need ~{act / 1e9:.1f} GB, "
                      f"{free / 1e9:.1f} GB free | {fl:.3f} | - | - |")
                continue
            try:
                xm = x[:M]
                if fmt == "bf16":
                    def mlp(xs, offs):
                        return mlp_bf16(xs, w, offs, torch)
                else:
                    xq = quant_rows(xm, torch) if args.prequant_x and not args.permute else None

                    def mlp(xs, offs):
                        return mlp_fp8(xs, w, offs, torch, xq)
                if args.permute:
                    if args.routing == "router":
                        ids = router_ids(name, M, E).to(device)
                    else:
                        ids = torch.tensor([expert_of(j, M, E, args.routing == "skew") for j in range(M)],
                                           dtype=torch.int64, device=device)
                    wts = torch.ones(M, dtype=torch.float32, device=device)

                    def fn():
                        return permuted(mlp, xm, ids, wts, E, torch)
                else:
                    offs = torch.tensor(offsets(counts), dtype=torch.int32, device=device)

                    def fn():
                        return mlp(xm, offs)
                ms = time_ms(fn, 2, reps_for(M, args.reps), device, torch)
            except Exception as e:  # noqa: BLE001 - a refused shape or an OOM is reported in the row
                print(f"| {M} | {fmt} | {op} | failed: {short_error(e)} | {fl:.3f} | - | - |")
                sys.stdout.flush()
                fn = mlp = None
                free_bytes(device, torch)
                continue
            print(f"| {M} | {fmt} | {op} | {ms:.3f} | {fl:.3f} | {fl / ms:.2f} | {flops(M, H, I) / (ms * 1e9):.0f} |")
            sys.stdout.flush()
            fn = mlp = None
        w = x = None
        free_bytes(device, torch)
        if fmt == "fp8" and H % 128:
            notes.append(f"fp8 runs here although H={H} is not a multiple of 128 (epmoe's block-scaled fp8 "
                         "skips this shape; torch's row-wise recipe needs multiples of 16)")
    for n in notes:
        print(f"\nnote: {n}")
    print(f"\nHBM copy {hbm_gbs:.0f} GB/s. TFLOP/s counts 2*M*3*H*I; floor = max(weight bytes of the experts that "
          "received rows / (0.9 x HBM copy), FLOPs / P), P = 700 TFLOP/s (bf16) or 1100 (fp8), weight bytes as "
          "`epmoe bench runner` counts them. Timed: " +
          ("argsort/bincount/gather by expert, " if args.permute else "rows already sorted by expert, ") +
          ("GEMM1, SwiGLU, GEMM2" if "fp8" not in formats else
           "GEMM1, SwiGLU, GEMM2 (fp8: per-row e4m3 quantization of " +
           ("the intermediate" if args.prequant_x and not args.permute else "x and the intermediate") + ")") +
          (", weighted scatter back" if args.permute else "; no permute, no weighting, no scatter") + ".")
    sys.stdout.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="torch_grouped_mm.py",
        description="PyTorch grouped GEMMs (torch._grouped_mm, torch._scaled_grouped_mm) on the shapes, routing "
                    "and floor of `epmoe bench runner`.")
    p.add_argument("--preset", default="deepseek-v3", help="a name, a comma list, or all (default deepseek-v3)")
    p.add_argument("--m", help="rows routed to this GPU, comma list (default " + ",".join(map(str, DEFAULT_MS)) + ")")
    p.add_argument("--quick", action="store_true", help="M = 128,2048,32768 and fewer repetitions")
    p.add_argument("--routing", default="uniform", choices=ROUTINGS,
                   help="uniform (default), skew (half of the rows on a tenth of the experts) or router (the "
                        "preset's router on random logits)")
    p.add_argument("--skew", action="store_true", help="short for --routing skew")
    p.add_argument("--formats", default="bf16,fp8", help="bf16, fp8 or both (default bf16,fp8)")
    p.add_argument("--local-experts", type=int, default=0,
                   help="experts on this GPU (default: the preset's experts / 2; 128 for deepseek-v3)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per point, median reported (default 7, quick 3)")
    p.add_argument("--permute", action="store_true",
                   help="also time the permute into expert order (argsort, bincount, gather) and the weighted "
                        "scatter back, as a layer built on these ops would")
    p.add_argument("--prequant-x", action="store_true",
                   help="fp8: quantize x outside the timed region (epmoe's runner receives fp8 tokens from dispatch)")
    p.add_argument("--dry-run", action="store_true", help="print the planned points and exit; touches no GPU")
    p.add_argument("--hbm-gbs", type=float, default=4214.0,
                   help="--dry-run only: the HBM copy rate its floors assume (default 4214, an H200)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run of the whole path on the host (bf16 only runs there; for tests)")
    a = p.parse_args(argv)
    try:
        a.presets = parse_presets(a.preset)
        a.Ms = parse_positive_list(a.m, "--m") if a.m else (QUICK_MS if a.quick else DEFAULT_MS)
        a.fmts = parse_formats(a.formats)
        if a.local_experts < 0:
            raise ValueError(f"--local-experts: {a.local_experts} must be positive")
        if a.reps is not None and a.reps <= 0:
            raise ValueError(f"--reps: {a.reps} must be positive")
        if a.hbm_gbs <= 0:
            raise ValueError(f"--hbm-gbs: {a.hbm_gbs} must be positive")
    except ValueError as e:
        p.error(str(e))
    a.reps = a.reps or (3 if a.quick else 7)
    if a.skew:
        a.routing = "skew"
    a.skew = a.routing == "skew"
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        dry_run(args, args.presets, args.Ms, args.fmts)
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"torch_grouped_mm: torch is not importable ({e})", file=sys.stderr)
        return 1
    device = args.device
    if device == "cuda":
        if not torch.cuda.is_available():
            print(f"torch_grouped_mm: no CUDA device for torch {torch.__version__} (use --dry-run or --device cpu)",
                  file=sys.stderr)
            return 1
        cap = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})"
        if cap not in ((9, 0), (10, 0)):
            print(f"note: torch's grouped GEMM kernels need sm_90 or sm_100; this GPU is sm_{cap[0]}{cap[1]}: bf16 "
                  "takes torch's per-group fallback and fp8 is refused")
        hbm = hbm_copy_gbs(device, torch)
    else:
        gpu = "CPU"
        hbm = hbm_copy_gbs(device, torch, 64 << 20)
    print(f"# torch grouped-GEMM bench: {gpu}, torch {torch.__version__}, "
          f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%MZ')}")
    print(f"# HBM copy (D2D, read+write): {hbm:.0f} GB/s")
    for i, name in enumerate(args.presets):
        print(f"[torch bench] preset {i + 1}/{len(args.presets)}: {name}", file=sys.stderr)
        bench_preset(name, args, args.Ms, args.fmts, hbm, device, torch, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
