#!/usr/bin/env bash
# Where one kernel's time goes, from Nsight Compute's source counters (warp stall sampling per SASS
# instruction): the share of the warp samples, executed instructions and stall reasons of each
# region of the kernel, the regions being cut at instructions that match marker regexes. By
# default a decode-GEMM kernel is cut after its last HGMMA: the prologue and the main loop (whose
# loads and decode the compiler places before the HGMMAs) against what follows (the epilogue and
# the tile change). One launch is profiled.
#   scripts/kernel_source.sh [--kernel REGEX] [--skip N] [--mark REGEX]... [--csv FILE] -- CMD ...
# --kernel REGEX  the kernel (ncu -k regex:...; default nvfp4_wide)
# --skip N        launches of it to skip first (ncu -s; default 2: past a bench's warm-up call)
# --mark REGEX    a SASS regex; a region boundary after its last match (repeatable; default
#                 \bHGMMA\b)
# --csv FILE      read an existing `ncu -i REP --page source --csv --print-source sass` file
#                 instead of profiling (CMD is then not run)
# Example (on a GPU machine):
#   scripts/kernel_source.sh --skip 3 -- build/epmoe bench runner --preset qwen3-30b-a3b \
#     --formats nvfp4 --m 8192 --routing uniform --nvfp4-wide-rows 128 --reps 1
# Build with -DCMAKE_CUDA_FLAGS=-lineinfo to have ncu name the source lines too (not needed here).
set -uo pipefail
kernel=nvfp4_wide; skip=2; marks=(); csv=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) kernel="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    --mark) marks+=("$2"); shift 2 ;;
    --csv) csv="$2"; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "kernel_source.sh: unknown argument $1 (put the command after --)" >&2; exit 2 ;;
  esac
done
if [ -z "$csv" ]; then
  [ $# -eq 0 ] && { echo "kernel_source.sh: no command after -- (or give --csv)" >&2; exit 2; }
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)
  [ -z "$ncu_bin" ] && { echo "kernel_source.sh: ncu not found" >&2; exit 3; }
  rep=$(mktemp -u /tmp/kernel_source.XXXXXX)
  trap 'rm -f "$rep".log "$rep".ncu-rep "$rep".csv "$rep".err' EXIT
  # --clock-control none: the clocks the command itself runs at.
  "$ncu_bin" --clock-control none -k "regex:$kernel" -s "$skip" -c 1 --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight -o "$rep" "$@" > "$rep.log" 2>&1 ||
    { echo "kernel_source.sh: ncu failed:"; tail -5 "$rep.log"; exit 1; }
  grep -E "Duration|Compute \(SM\) Throughput" "$rep.log" | sed 's/^ */# /'
  csv="$rep.csv"
  "$ncu_bin" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$csv" 2> "$rep.err" ||
    { echo "kernel_source.sh: ncu --page source failed:"; tail -5 "$rep.err"; exit 1; }
fi
python3 - "$csv" "${marks[@]}" <<'EOF'
import collections, csv, re, sys
path, marks = sys.argv[1], sys.argv[2:]
rows = [r for r in csv.reader(open(path, errors="replace"))]
head_i = next((i for i, r in enumerate(rows) if "Source" in r and "Address" in r), None)
if head_i is None:
    sys.exit("kernel_source.sh: no SASS table in " + path)
head = rows[head_i]
src, smp, exe = head.index("Source"), head.index("Warp Stall Sampling (All Samples)"), head.index("Instructions Executed")
stall = [(i, h[len("stall_"):]) for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
ins = []
for r in rows[head_i + 1:]:
    if len(r) < len(head):
        continue
    try:
        ins.append((r[src].strip(), int(r[smp] or 0), int(r[exe] or 0), {n: int(r[i]) for i, n in stall if r[i] not in ("", "0")}))
    except ValueError:
        continue
if not ins:
    sys.exit("kernel_source.sh: no instruction rows in " + path)
# Region boundaries: after the last match of each marker (default: the last HGMMA).
cuts = []
for m in marks or [r"\bHGMMA\b"]:
    hits = [i for i, x in enumerate(ins) if re.search(m, x[0])]
    if hits:
        cuts.append(hits[-1] + 1)
bounds = [0] + sorted(set(c for c in cuts if 0 < c < len(ins))) + [len(ins)]
names = ["prologue and main loop", "after the last HGMMA"] if not marks and len(bounds) == 3 else \
        [f"region {k}" for k in range(len(bounds) - 1)]
tot_s = sum(x[1] for x in ins) or 1
tot_e = sum(x[2] for x in ins) or 1
def opcode(s):
    t = s.split()
    t = t[1:] if t and t[0].startswith("@") else t
    return t[0].split(".")[0] if t else "?"
print(f"| region | SASS lines | warp samples | executed instructions | top stalls | top opcodes (executed) |")
print("|---|---|---|---|---|---|")
for name, a, b in zip(names, bounds, bounds[1:]):
    part = ins[a:b]
    s = sum(x[1] for x in part); e = sum(x[2] for x in part)
    st = collections.Counter(); op = collections.Counter()
    for x in part:
        st.update(x[3]); op[opcode(x[0])] += x[2]
    top_st = ", ".join(f"{k} {100 * v / max(s, 1):.0f}%" for k, v in st.most_common(4))
    top_op = ", ".join(f"{k} {100 * v / max(e, 1):.0f}%" for k, v in op.most_common(5))
    print(f"| {name} | {a}-{b - 1} | {100 * s / tot_s:.1f}% | {100 * e / tot_e:.1f}% | {top_st} | {top_op} |")
print(f"\n{len(ins)} SASS lines, {tot_s} warp samples, {tot_e} warp-level instructions executed.")
EOF
