#!/usr/bin/env bash
# Per-kernel GPU time of one `epmoe bench` point, from Nsight Compute (nsys is not on the GPU
# machines; ncu is). ncu serializes the kernels, so the sum is the time without overlap or launch
# gaps: compare it with the bench's own median to see what the gaps cost.
#   scripts/kernel_times.sh [--calls N] [--match REGEX] [--bytes] [--launches] -- EPMOE_BIN bench runner --m 8192 ...
#   scripts/kernel_times.sh [--calls N] [--bytes] [--launches] --csv FILE
# --calls N: divide each kernel's total by N (the bench's warm-up + repetitions + 5 host-time
#            calls, e.g. 10 for --reps 3; default 1).
# --match REGEX: only kernels whose demangled name matches (ncu --kernel-name-base demangled -k regex:...;
#            ncu's default base, the function name, is `gemm_kernel`, the runner's entry in
#            src/run/cuda/engine_cutlass.h, for every CUTLASS kernel).
# --bytes: also DRAM and L2 bytes per kernel (dram__bytes.sum, lts__t_bytes.sum; ncu replays each
#          kernel for them) and their rates over its time, to tell a kernel bound by HBM from one
#          bound by L2 or by neither; the DRAM bytes per call, split into read and write where the
#          page has dram__bytes_read.sum / dram__bytes_write.sum (profiling asks for them).
# --launches: one row per launch in launch order instead of one per kernel, e.g. to tell a GEMM1
#          launch from the GEMM2 launch of the same instantiation (with --match to keep it short).
# --csv FILE: read an existing `ncu --csv --page raw` file instead of profiling.
# Prints one row per kernel: launches, total us, us per call, share of the total. Kernels whose
# names ncu prints alike when cut short (CUTLASS instantiations) are told apart by the first two
# cute::C triples of their full names (e.g. cluster 2x1x1, tile 128x192x64) and a short hash.
set -uo pipefail
calls=1; match=""; bytes=0; csv_in=""; launches=0
while [ $# -gt 0 ]; do
  case "$1" in
    --calls) calls="$2"; shift 2 ;;
    --match) match="$2"; shift 2 ;;
    --bytes) bytes=1; shift ;;
    --launches) launches=1; shift ;;
    --csv) csv_in="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "kernel_times.sh: unknown argument $1 (put the command after --)"; exit 2 ;;
  esac
done
rc=0
if [ -n "$csv_in" ]; then
  csv="$csv_in"
else
  [ $# -eq 0 ] && { echo "kernel_times.sh: no command after -- (or give --csv)"; exit 2; }
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  [ -z "$ncu_bin" ] && { echo "kernel_times.sh: ncu not found"; exit 3; }
  csv=$(mktemp)
  trap 'rm -f "$csv" "$csv.err"' EXIT
  metrics=gpu__time_duration.sum
  [ $bytes -eq 1 ] && metrics=$metrics,dram__bytes.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
  # --clock-control none: the clocks the bench itself runs at (ncu locks them to base otherwise).
  "$ncu_bin" --clock-control none --metrics "$metrics" --csv --page raw ${match:+--kernel-name-base demangled -k "regex:$match"} \
    "$@" > "$csv" 2> "$csv.err"
  rc=$?
fi
python3 - "$csv" "$calls" "$bytes" "$launches" <<'EOF'
import csv, sys, re, collections, hashlib
path, calls, want_bytes, per_launch = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
lines = [l for l in open(path, errors="replace") if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    print("kernel_times.sh: ncu produced no kernel rows"); sys.exit(0)
head, units = rows[0], rows[1]
ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
def scale_of(col, table, what):
    s = table.get(units[col])
    if s is None:
        print(f"kernel_times.sh: unknown {what} unit {units[col]!r}"); sys.exit(3)
    return s
tscale = scale_of(ti, {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}, "time")
bcols = []
if want_bytes:
    btable = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    need, rw = ["dram__bytes.sum", "lts__t_bytes.sum"], ["dram__bytes_read.sum", "dram__bytes_write.sum"]
    for m in need:
        if m not in head:
            print(f"kernel_times.sh: no {m} column (profile with --bytes)"); sys.exit(3)
    for m in need + (rw if all(m in head for m in rw) else []):  # read / write: where the page has both
        c = head.index(m)
        bcols.append((c, scale_of(c, btable, "byte")))
def label(full):
    name = re.sub(r"^void ", "", re.sub(r"\(.*", "", full).strip())  # drop the argument list
    if len(name) < 90:
        return name
    c = r"cute::C<(?:\([^)]*\))?(\d+)\w*>"  # the demangler may write C<128>, C<(int)128> or C<128l>
    triples = re.findall(", ".join([c] * 3), full)[:2]
    tag = " ".join("x".join(t) for t in triples)
    return f"{name[:60]}... {tag} #{hashlib.md5(full.encode()).hexdigest()[:6]}".replace("  ", " ")
def num(s):
    return float(s.replace(",", ""))
def cells(t, b, per):
    """The byte columns of a row of time t (us) and byte sums b: DRAM and L2 rates, DRAM GB per `per`."""
    if not want_bytes:
        return ""
    rate = lambda x: x / (t * 1e3) if t > 0 else 0  # bytes / (us * 1e3) = GB/s
    out = f" {rate(b[0]):.0f} | {rate(b[1]):.0f} | {b[0] / 1e9 / per:.2f} |"
    if len(b) == 4:
        out += f" {b[2] / 1e9 / per:.2f} / {b[3] / 1e9 / per:.2f} |"
    return out
extra = ""
if want_bytes:
    extra = " DRAM GB/s | L2 GB/s | DRAM GB per " + ("launch" if per_launch else "call") + " |"
    if len(bcols) == 4:
        extra += " read / write GB |"
dashes = "---|" * (extra.count("|"))
if per_launch:
    print(f"| launch | kernel | us |{extra}")
    print("|---|---|---|" + dashes)
    for r in rows[2:]:
        t = num(r[ti]) * tscale
        b = [num(r[c]) * s for c, s in bcols]
        print(f"| {r[0]} | `{label(r[ki])}` | {t:.1f} |{cells(t, b, 1.0)}")
    sys.exit(0)
agg = collections.OrderedDict()
for r in rows[2:]:
    name = label(r[ki])
    n, t, b = agg.get(name, (0, 0.0, [0.0] * len(bcols)))
    agg[name] = (n + 1, t + num(r[ti]) * tscale, [x + num(r[c]) * s for x, (c, s) in zip(b, bcols)])
total = sum(t for _, t, _ in agg.values())
print(f"| kernel | launches | total us | us per call (/{calls:g}) | share |{extra}")
print("|---|---|---|---|---|" + dashes)
for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| `{name}` | {n} | {t:.1f} | {t / calls:.1f} | {100 * t / total:.1f}% |{cells(t, b, calls)}")
print(f"| all | {sum(n for n, _, _ in agg.values())} | {total:.1f} | {total / calls:.1f} | 100% |" + " |" * extra.count("|"))
EOF
prc=$?
[ $rc -ne 0 ] && { echo "ncu exit $rc:"; tail -5 "$csv.err"; exit $rc; }
exit $prc
