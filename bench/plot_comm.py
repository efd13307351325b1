#!/usr/bin/env python3
"""Plots the nvlink dispatcher's latency against tokens per rank and grid size (docs/comm_2xh200.png).

Reads, from one results file (default: the newest bench/results/*2xh200.md that has them):
  - the grid table, header "| comm_sms | 128 tokens | ...", cells "fp8 dispatch us / bf16 combine us";
  - the baselines of the same machine, rows "| ... | nvlink | fmt | T | disp | comb | CE us | NCCL a2a us |"
    of the table whose header starts "| preset | disp | format | T" (DeepSeek-V3 rows: the first preset).
Draws two panels, fp8 dispatch and bf16 combine, one line per comm_sms, with NCCL's all-to-all and the
copy engine's copy of the same bytes (the fp8 dispatch's; for the combine the bf16 rows', which are
the bytes a bf16 combine sends back) dashed and dotted. Only measured numbers are drawn.
Needs matplotlib (pip install matplotlib).
usage: python3 bench/plot_comm.py [results.md] [out.png]
"""
import glob
import os
import sys


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read(path):
    """(grid, base): grid[comm_sms] = [(T, dispatch_us, combine_us)], base[fmt] = [(T, ce_us, nccl_us)]."""
    grid, base = {}, {"fp8": [], "bf16": []}
    tokens, mode, preset = None, None, None
    for line in open(path, encoding="utf-8"):
        if not line.startswith("|"):
            mode = None
            continue
        c = cells(line)
        if c[0] == "comm_sms" and len(c) > 1 and c[1].endswith("tokens"):
            tokens = [int(x.split()[0]) for x in c[1:]]
            mode = "grid"
        elif c[:4] == ["preset", "disp", "format", "T"]:
            mode, preset = "base", None
        elif set(c[0]) <= set("-") and c[0]:
            continue
        elif mode == "grid" and c[0].isdigit():
            grid[int(c[0])] = [(t, *map(float, v.split("/"))) for t, v in zip(tokens, c[1:])]
        elif mode == "base":
            preset = c[0] or preset
            if preset == c[0] and any(base.values()):  # a second preset: DeepSeek-V3's rows are done
                mode = None
            elif c[1] == "nvlink" and c[2] in base:
                base[c[2]].append((int(c[3]), float(c[6]), float(c[7])))
    return grid, base


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else None
    if src is None:
        for path in sorted(glob.glob(os.path.join(here, "results", "*2xh200.md")), reverse=True):
            if read(path)[0]:
                src = path
                break
    if src is None:
        sys.exit("plot_comm: no results file with a '| comm_sms | 128 tokens |' table")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "docs", "comm_2xh200.png")
    grid, base = read(src)
    if not grid:
        sys.exit(f"plot_comm: {src} has no comm_sms table")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, col, title, fmt in ((axes[0], 1, "fp8 dispatch", "fp8"), (axes[1], 2, "bf16 combine", "bf16")):
        for sms in sorted(grid):
            pts = grid[sms]
            ax.plot([p[0] for p in pts], [p[col] for p in pts], marker="o", ms=3,
                    lw=2.2 if sms == 66 or sms == 64 else 1.2, label=f"{sms} SMs")
        b = sorted(base[fmt])
        if b:
            ax.plot([x[0] for x in b], [x[2] for x in b], "k--", lw=1, label="NCCL all-to-all, same bytes")
            ax.plot([x[0] for x in b], [x[1] for x in b], "k:", lw=1, label="copy engine, same bytes")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per rank")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("us (median)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"nvlink dispatcher, 2xH200, DeepSeek-V3 shapes, by grid size ({os.path.basename(src)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot_comm: wrote {out} from {src}")


if __name__ == "__main__":
    main()
