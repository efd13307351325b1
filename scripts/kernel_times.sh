#!/usr/bin/env bash
# Per-kernel GPU time of one `epmoe bench` point, from Nsight Compute (nsys is not on the GPU
# machines; ncu is). ncu serializes the kernels, so the sum is the time without overlap or launch
# gaps: compare it with the bench's own median to see what the gaps cost.
#   scripts/kernel_times.sh [--calls N] [--match REGEX] -- EPMOE_BIN bench runner --m 8192 --formats bf16 ...
# --calls N: divide each kernel's total by N (the bench's warm-up + repetitions; default 1).
# --match REGEX: only kernels whose name matches (ncu -k regex:...).
# Prints one row per kernel name: launches, total us, us per call, share of the total.
set -uo pipefail
calls=1; match=""
while [ $# -gt 0 ]; do
  case "$1" in
    --calls) calls="$2"; shift 2 ;;
    --match) match="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "kernel_times.sh: unknown argument $1 (put the command after --)"; exit 2 ;;
  esac
done
[ $# -eq 0 ] && { echo "kernel_times.sh: no command after --"; exit 2; }
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[ -z "$ncu_bin" ] && { echo "kernel_times.sh: ncu not found"; exit 3; }
csv=$(mktemp)
# --clock-control none: the clocks the bench itself runs at (ncu locks them to base otherwise).
"$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv --page raw ${match:+-k "regex:$match"} \
  "$@" > "$csv" 2> "$csv.err"
rc=$?
python3 - "$csv" "$calls" <<'EOF'
import csv, sys, re, collections
path, calls = sys.argv[1], float(sys.argv[2])
lines = [l for l in open(path, errors="replace") if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    print("kernel_times.sh: ncu produced no kernel rows"); sys.exit(0)
head = rows[0]
ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
unit = rows[1][ti]
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit)
if scale is None:
    print(f"kernel_times.sh: unknown time unit {unit!r}"); sys.exit(3)
agg = collections.OrderedDict()
for r in rows[2:]:
    name = re.sub(r"\(.*", "", r[ki]).strip()           # drop the argument list
    name = re.sub(r"^void ", "", name)
    name = name if len(name) < 90 else name[:87] + "..."
    t = float(r[ti].replace(",", "")) * scale
    n, s = agg.get(name, (0, 0.0))
    agg[name] = (n + 1, s + t)
total = sum(s for _, s in agg.values())
print(f"| kernel | launches | total us | us per call (/{calls:g}) | share |")
print("|---|---|---|---|---|")
for name, (n, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| `{name}` | {n} | {s:.1f} | {s / calls:.1f} | {100 * s / total:.1f}% |")
print(f"| all | {sum(n for n, _ in agg.values())} | {total:.1f} | {total / calls:.1f} | 100% |")
EOF
[ $rc -ne 0 ] && { echo "ncu exit $rc:"; tail -5 "$csv.err"; }
rm -f "$csv" "$csv.err"
exit $rc
