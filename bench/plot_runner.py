#!/usr/bin/env python3
"""Plots `epmoe bench runner` tables committed under bench/results/ (docs/runner_h200.png).

Every markdown table whose header starts with "| M | format" is read; for each (M, format) the
row of the most recently committed file wins, so the plot shows the latest measured engine at each
point and never a number that was not measured. Tables of runs that are not the default setup
(skewed routing, a forced engine, another library) follow a line `<!-- plot: skip -->` and are left
out up to the next `## ` heading. The third panel is the roofline ratio (floor / time, the bench's
column since it has one). Needs matplotlib (pip install matplotlib).
usage: python3 bench/plot_runner.py [results_dir] [out.png]
"""
import glob
import os
import re
import subprocess
import sys


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


def read_tables(path, want="deepseek-v3"):
    """Rows of the runner tables of preset `want`: a table belongs to the preset named by the last
    "# epmoe bench runner: <gpu>, <preset> H=..." line before it (files without one: deepseek-v3)."""
    rows = []
    header = None
    preset = "deepseek-v3"
    skip = False
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("## "):
            skip = False
        if line == "<!-- plot: skip -->":
            skip = True
        if skip:
            continue
        m = re.search(r"epmoe bench runner: .*?, (\S+) H=\d+", line)
        if m:
            preset = m.group(1)
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == ["M", "format"]:
            header = cells
        elif header and preset == want and not set(cells[0]) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "docs", "runner_h200.png")
    latest = {}
    for path in sorted(glob.glob(os.path.join(results, "*.md")), key=committed_at):
        for r in read_tables(path):
            try:
                engine = r.get("engine", "mma")
                # GEMM2 on fp8 operands means the intermediate was re-quantized (intermediate_quant fp8),
                # swapped or not (cutlass-fp8-swap64 / -swap128 / -byrows).
                g2 = engine.split("/")[-1]
                iq = g2.startswith("wgmma-fp8") or g2.startswith("cutlass-fp8")
                key = (int(r["M"]), r["format"] + (" (iq fp8)" if iq else ""))
                ratio = float(r["floor / time"]) if r.get("floor / time") else None
                latest[key] = (float(r["TFLOP/s"]), float(r["weight GB/s"]), engine,
                               os.path.basename(path), ratio)
            except (KeyError, ValueError):
                continue
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(17, 4.5))
    for fmt in sorted({k[1] for k in latest}):
        pts = sorted((m, v) for (m, f), v in latest.items() if f == fmt)
        ms = [m for m, _ in pts]
        for ax, col in ((a1, 1), (a2, 0)):
            line, = ax.plot(ms, [v[col] for _, v in pts], label=fmt)
            # Hollow: measured only with the first engine (mma.sync for everything), since replaced
            # at that point and not measured again.
            for m, v in pts:
                old = v[2] == "mma"
                ax.plot([m], [v[col]], marker="o", color=line.get_color(),
                        markerfacecolor="white" if old else line.get_color())
        rp = [(m, v[4]) for m, v in pts if v[4] is not None]
        if rp:
            a3.plot([m for m, _ in rp], [r for _, r in rp], marker="o", label=fmt)
    a1.axhline(4216, color="gray", ls="--", lw=1)
    a1.text(130, 4250, "HBM copy 4216 GB/s", fontsize=8, color="gray")
    a2.axhline(700, color="tab:blue", ls=":", lw=1)
    a2.axhline(1100, color="tab:orange", ls=":", lw=1)
    a2.text(130, 720, "bf16 target 700", fontsize=8)
    a2.text(130, 1120, "fp8 target 1100", fontsize=8)
    a3.axhline(0.91, color="gray", ls="--", lw=1)
    a3.text(130, 0.93, "target 0.91 (time <= 1.10 x floor)", fontsize=8, color="gray")
    for ax, title, yl in ((a1, "weights streamed (decode regime)", "weight GB/s"),
                          (a2, "tensor throughput (prefill regime)", "TFLOP/s"),
                          (a3, "roofline: floor / time", "max(bytes/(0.9 x copy), FLOPs/P) / time")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M = rows routed to this GPU (128 local experts)")
        ax.set_ylabel(yl)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("epmoe runner, one H200, DeepSeek-V3 experts (H 7168, I 2048): latest measurement per point;\n"
                 "hollow = measured only with the first (mma.sync) engine, not re-measured since", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    for k in sorted(latest):
        print(k, latest[k])


if __name__ == "__main__":
    main()
