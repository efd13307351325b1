#!/usr/bin/env python3
"""Plots the runner's latest settled sweeps committed under bench/results/ (docs/runner_h200.png)
against the runner's targets: floor / time per preset and format, nvfp4 against fp8 at decode sizes
(with the best any exact nvfp4 kernel could do there), and skewed / routed loads against uniform.

It reads the summary tables that sessions commit from `epmoe bench runner` sweeps, of two shapes:
  | preset | M | format | uniform ms (floor / time) | router ms | router / uniform | skew ms | ... |
  | preset | M | bf16 | fp8 | nvfp4 | ...                      (uniform; an empty preset repeats)
A cell's first number is the time in ms. The HBM copy rate of a table is the last "HBM copy [was]
N GB/s" written before it in its file. For each (preset, M, format, routing) the table of the most
recently committed file wins (later in the file wins within one). Tables after a line
`<!-- plot: skip -->` are left out up to the next `## ` heading.

The floor is `epmoe bench runner`'s: max(weight bytes / (0.9 x HBM copy), FLOPs / P), P = 700
TFLOP/s (bf16, nvfp4 weights) or 1100 (fp8), every local expert receiving rows; where a table also
prints the ratio, the script checks that its own floor agrees. Needs matplotlib.
usage: python3 bench/plot_runner.py [results_dir] [out.png]
"""
import glob
import os
import re
import subprocess
import sys

# preset: (H, I, local experts as the bench runs them: the model's experts / 2)
SHAPES = {
    "deepseek-v3": (7168, 2048, 128),
    "qwen3-235b-a22b": (4096, 1536, 64),
    "qwen3-30b-a3b": (2048, 768, 64),
    "mixtral-8x7b": (4096, 14336, 4),
    "gpt-oss-120b": (2880, 2880, 64),
}
NAMES = {"deepseek-v3": "DeepSeek-V3", "qwen3-235b-a22b": "Qwen3-235B", "qwen3-30b-a3b": "Qwen3-30B",
         "mixtral-8x7b": "Mixtral-8x7B", "gpt-oss-120b": "gpt-oss-120b"}
FORMATS = ("bf16", "fp8", "nvfp4")
P = {"bf16": 700e12, "fp8": 1100e12, "nvfp4": 700e12}
H200_BF16_DENSE = 989e12  # the tensor cores' dense bf16 peak: no exact nvfp4 kernel beats it on Hopper


def preset_key(name):
    k = name.strip().lower().replace("`", "")
    for p in SHAPES:
        if k == p or k == NAMES[p].lower():
            return p
    return None


def weight_bytes(preset, fmt):
    H, I, E = SHAPES[preset]
    el = 3.0 * H * I * E
    return {"bf16": 2 * el, "fp8": el + el / (128 * 128) * 4, "nvfp4": el / 2 + el / 16}[fmt]


def flops(preset, M):
    H, I, _ = SHAPES[preset]
    return 2.0 * M * 3 * H * I


def floor_ms(preset, fmt, M, copy_gbs):
    """The bench's floor; every local expert has rows (uniform loads at M >= the local experts)."""
    return max(weight_bytes(preset, fmt) / (0.9 * copy_gbs * 1e9), flops(preset, M) / P[fmt]) * 1e3


def committed_at(path):
    """Commit time of the file's first version (its mtime when it is not committed)."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ct", "--", path], capture_output=True,
                             text=True, cwd=os.path.dirname(path), check=True).stdout.split()
        if out:
            return int(out[-1])
    except (OSError, subprocess.CalledProcessError):
        pass
    return int(os.path.getmtime(path))


def first_number(cell):
    m = re.match(r"\**\s*([0-9]+\.[0-9]+)", cell.strip())
    return float(m.group(1)) if m else None


def printed_ratio(cell):
    m = re.match(r"\**\s*[0-9.]+\s*\**\s*\((0\.[0-9]+|1\.[0-9]+)\)", cell.strip())
    return float(m.group(1)) if m else None


def read_points(path):
    """(preset, M, format, routing) -> (ms, copy GB/s, printed floor / time or None), in file order."""
    points = []
    copy_gbs = None
    header = None
    preset = None
    skip = False
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("## "):
            skip = False
        if line == "<!-- plot: skip -->":
            skip = True
        m = re.search(r"HBM copy (?:was )?(\d{4}) GB/s", line)
        if m:
            copy_gbs = float(m.group(1))
        if skip or not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == ["preset", "M"]:
            header = cells
            preset = None
            continue
        if not header:
            continue
        # An empty preset cell repeats the row above's; the separator row names none.
        preset = preset_key(cells[0]) or (preset if not cells[0] else None)
        if preset is None or copy_gbs is None or not cells[1].isdigit():
            continue
        M = int(cells[1])
        row = dict(zip(header, cells))
        if "format" in header and cells[2] in FORMATS:
            for col, routing in (("uniform ms (floor / time)", "uniform"), ("router ms", "router"),
                                 ("skew ms", "skew")):
                t = first_number(row.get(col, ""))
                if t:
                    points.append(((preset, M, cells[2], routing), (t, copy_gbs, printed_ratio(row.get(col, "")))))
        else:
            for fmt in FORMATS:
                t = first_number(row.get(fmt, ""))
                if t:
                    points.append(((preset, M, fmt, "uniform"), (t, copy_gbs, printed_ratio(row[fmt]))))
    return points


def latest_points(results):
    latest, source = {}, {}
    for path in sorted(glob.glob(os.path.join(results, "*.md")), key=committed_at):
        for key, val in read_points(path):
            latest[key] = val
            source[key] = os.path.basename(path)
    for (preset, M, fmt, routing), (t, copy_gbs, ratio) in latest.items():
        mine = floor_ms(preset, fmt, M, copy_gbs) / t
        if ratio is not None and abs(mine - ratio) > 0.015:
            raise SystemExit(f"{source[(preset, M, fmt, routing)]}: {preset} M {M} {fmt} prints floor / time "
                             f"{ratio}, this script's floor gives {mine:.3f}: the accounting differs")
    return latest, source


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "docs", "runner_h200.png")
    latest, source = latest_points(results)
    if not latest:
        raise SystemExit(f"no sweep tables under {results}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"bf16": "tab:blue", "fp8": "tab:green", "nvfp4": "tab:red"}
    presets = [p for p in SHAPES if any(k[0] == p for k in latest)]
    xs = range(len(presets))
    fig, ((a1, a2), (a3, a4)) = plt.subplots(2, 2, figsize=(15, 9.5))

    # 1: floor / time against M, uniform, DeepSeek-V3 (the other presets are in panel 2).
    for fmt in FORMATS:
        pts = sorted((k[1], floor_ms(k[0], fmt, k[1], v[1]) / v[0]) for k, v in latest.items()
                     if k[0] == "deepseek-v3" and k[2] == fmt and k[3] == "uniform")
        a1.plot([m for m, _ in pts], [r for _, r in pts], marker="o", color=colors[fmt], label=fmt)
    a1.axhline(0.91, color="gray", ls="--", lw=1)
    a1.text(0.01, 0.92, "target 0.91 (bf16 and fp8: time <= 1.10 x floor)", transform=a1.get_yaxis_transform(),
            fontsize=8, color="gray")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("M = rows routed to this GPU (128 local experts)")
    a1.set_ylabel("floor / time")
    a1.set_title("DeepSeek-V3, uniform: floor = max(bytes / (0.9 x copy), FLOPs / P)")
    a1.legend(fontsize=8)

    # 2: floor / time per preset at M 8192 (hollow) and 32768 (filled).
    for fi, fmt in enumerate(FORMATS):
        for M, face in ((8192, "white"), (32768, None)):
            pts = [(i, floor_ms(p, fmt, M, latest[(p, M, fmt, "uniform")][1]) / latest[(p, M, fmt, "uniform")][0])
                   for i, p in enumerate(presets) if (p, M, fmt, "uniform") in latest]
            a2.plot([i + (fi - 1) * 0.2 for i, _ in pts], [r for _, r in pts], "o", color=colors[fmt],
                    markerfacecolor=face or colors[fmt], label=f"{fmt} M {M}")
    a2.axhline(0.91, color="gray", ls="--", lw=1)
    a2.set_xticks(list(xs), [NAMES[p] for p in presets], fontsize=8)
    a2.set_ylabel("floor / time")
    a2.set_title("every preset at M 8192 (hollow) and 32768 (filled), uniform")
    a2.legend(fontsize=7, ncol=3)

    # 3: nvfp4 / fp8 time at decode sizes, and the lowest an exact nvfp4 kernel could reach there
    # (its bytes at the full copy rate, or its FLOPs at the dense bf16 peak, over fp8's measured time).
    for mi, (M, face) in enumerate(((128, None), (2048, "white"))):
        meas, best = [], []
        for i, p in enumerate(presets):
            n, f = latest.get((p, M, "nvfp4", "uniform")), latest.get((p, M, "fp8", "uniform"))
            if n and f:
                meas.append((i, n[0] / f[0]))
                bound = max(weight_bytes(p, "nvfp4") / (n[1] * 1e9), flops(p, M) / H200_BF16_DENSE) * 1e3
                best.append((i, bound / f[0]))
        off = (mi - 0.5) * 0.3
        a3.plot([i + off for i, _ in meas], [r for _, r in meas], "o", color="tab:red",
                markerfacecolor=face or "tab:red", label=f"measured, M {M}")
        a3.plot([i + off for i, _ in best], [r for _, r in best], "_", color="black", ms=14, mew=2,
                label="bound: max(bytes / copy, FLOPs / 989 TFLOP/s) / fp8 time" if mi == 0 else None)
    a3.axhline(0.60, color="gray", ls="--", lw=1)
    a3.text(0.01, 0.62, "target 0.60", transform=a3.get_yaxis_transform(), fontsize=8, color="gray")
    a3.set_xticks(list(xs), [NAMES[p] for p in presets], fontsize=8)
    a3.set_ylabel("nvfp4 time / fp8 time")
    a3.set_title("nvfp4 against fp8 (iq fp8) at decode sizes")
    a3.legend(fontsize=7)

    # 4: skewed and routed loads against uniform, M 32768 (filled) and 8192 (hollow).
    for fi, fmt in enumerate(FORMATS):
        for routing, marker in (("skew", "s"), ("router", "^")):
            for M, face in ((8192, "white"), (32768, None)):
                pts = [(i, latest[(p, M, fmt, routing)][0] / latest[(p, M, fmt, "uniform")][0])
                       for i, p in enumerate(presets)
                       if (p, M, fmt, routing) in latest and (p, M, fmt, "uniform") in latest]
                a4.plot([i + (fi - 1) * 0.2 for i, _ in pts], [r for _, r in pts], marker, color=colors[fmt],
                        markerfacecolor=face or colors[fmt], label=f"{fmt} {routing}" if M == 32768 else None)
    a4.axhline(1.10, color="gray", ls="--", lw=1)
    a4.text(0.01, 1.11, "target 1.10", transform=a4.get_yaxis_transform(), fontsize=8, color="gray")
    a4.set_xticks(list(xs), [NAMES[p] for p in presets], fontsize=8)
    a4.set_ylabel("time / uniform time")
    a4.set_title("skewed (square) and router (triangle) loads, M 32768 filled, 8192 hollow")
    a4.legend(fontsize=7, ncol=3)
    for ax in (a1, a2, a3, a4):
        ax.grid(alpha=0.3)
    files = sorted(set(source.values()))
    fig.suptitle("epmoe runner on one H200 against its targets: the latest settled sweep per point\n"
                 f"(from {', '.join(files)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    for k in sorted(latest):
        t, copy_gbs, _ = latest[k]
        print(*k, f"{t:.3f} ms", f"floor/time {floor_ms(k[0], k[2], k[1], copy_gbs) / t:.2f}", source[k])


if __name__ == "__main__":
    main()
