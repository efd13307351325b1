#!/usr/bin/env bash
# On a GPU machine: compare source trees (branches exported with `git archive`) in one call. All
# trees build at once, the first with its tests and the others only `epmoe` (the CUTLASS
# instantiations dominate the build, so two trees take about as long as one); the GPU tests that
# match --tests run on the first tree; then every --cmd runs on each tree in turn, for --rounds
# rounds, the tree order reversed every other round so that neither side always runs first. Only
# the bench tables' rows and HBM-copy lines are kept; one log, $OUT/ab.log (or ./out/ab.log), which
# ends with a table per command: each row's time (the header's first "time"/"ms"/"us" column) on
# every tree, one value per round, and its mean over the first tree's.
#   scripts/gpu_ab.sh [--tests REGEX] [--sanitize FILTER] [--cmd "ARGS"]... [--rounds N]
#                     [--sh "COMMAND"]... [--budget SECONDS] TREE...
#     --tests   ctest -R regex of GPU tests, run on the first tree (default: none)
#     --sanitize  then compute-sanitizer memcheck over the first tree's GPU tests of this gtest
#               filter (scripts/sanitize_tests.sh; needs --tests, which builds them)
#     --cmd     arguments of an epmoe run (repeatable), e.g. "bench runner --m 32768 --formats bf16"
#     --rounds  times every --cmd runs on every tree (default 2)
#     --sh      a shell command run once at the end with $EPMOE the FIRST tree's binary (repeatable),
#               e.g. 'scripts/kernel_times.sh --bytes -- $EPMOE bench runner ...'
#     --budget  start no further run after this many seconds (default 500)
# Use gpu_trees.sh to check trees (every test, sanitizer) and this one to time them against each other.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
tests=""; sanitize=""; cmds=(); shs=(); rounds=2; budget=500; trees=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests="$2"; shift 2 ;;
    --sanitize) sanitize="$2"; shift 2 ;;
    --cmd) cmds+=("$2"); shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --sh) shs+=("$2"); shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    -*) echo "gpu_ab: unknown option $1" >&2; exit 2 ;;
    *) trees+=("$1"); shift ;;
  esac
done
[ ${#trees[@]} -gt 0 ] || { echo "gpu_ab: no tree given (see --help)" >&2; exit 2; }
[ -z "$sanitize" ] || [ -n "$tests" ] || { echo "gpu_ab: --sanitize needs --tests (the test binary is built with them)" >&2; exit 2; }
for t in "${trees[@]}"; do [ -d "$t" ] || { echo "gpu_ab: no such tree: $t" >&2; exit 2; }; done
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
log="$out/ab.log"
: > "$log"
say() { echo "$@" | tee -a "$log"; }
say "# gpu_ab $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

# Builds side by side. Wait for their pids, never a bare `wait`: that would also wait for any
# process substitution of the caller and hang.
jobs_per=$(( $(nproc) / ${#trees[@]} > 0 ? $(nproc) / ${#trees[@]} : 1 ))
pids=()
for i in "${!trees[@]}"; do
  t=${trees[$i]}
  [ -e "$t/.deps" ] || ln -s "$here/.deps" "$t/.deps"  # exported trees have no .deps
  target="--target epmoe"
  [ "$i" -eq 0 ] && [ -n "$tests" ] && target=""
  ( cmake -S "$t" -B "$t/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$t/build.log" 2>&1 &&
      cmake --build "$t/build-gpu" -j "$jobs_per" $target >> "$t/build.log" 2>&1 ) &
  pids+=($!)
done
ok=()
for i in "${!trees[@]}"; do
  if wait "${pids[$i]}"; then ok+=("${trees[$i]}"); say "build $(basename "${trees[$i]}"): ok $(el)"
  else say "build $(basename "${trees[$i]}"): FAILED $(el)"; tail -20 "${trees[$i]}/build.log" >> "$log"; fi
done

first=${trees[0]}
if [ -n "$tests" ] && [ -x "$first/build-gpu/epmoe" ]; then
  (cd "$first/build-gpu" && ctest -L gpu -j 4 --timeout 300 -R "$tests" --output-on-failure > ../ctest.log 2>&1)
  say "tests $(basename "$first"): $(grep -E 'tests passed|tests failed' "$first/ctest.log" | tail -1) $(el)"
  grep -E '\((Failed|Timeout|SEGFAULT|Subprocess)' "$first/ctest.log" >> "$log"
  [ -z "$sanitize" ] ||
    say "$("$here/scripts/sanitize_tests.sh" "$first/build-gpu/tests/epmoe_gpu_tests" "$sanitize" "$first/sanitizer.log" 300) $(el)"
fi

for c in "${cmds[@]+"${cmds[@]}"}"; do
  for r in $(seq "$rounds"); do
    order=("${ok[@]}")
    if [ $(( r % 2 )) -eq 0 ]; then order=(); for ((k=${#ok[@]}-1; k>=0; k--)); do order+=("${ok[$k]}"); done; fi
    for t in "${order[@]}"; do
      if [ $(( $(date +%s) - start )) -ge "$budget" ]; then say "skipped (budget): $(basename "$t") round $r: $c"; continue; fi
      say "== $(basename "$t") round $r: epmoe $c $(el)"
      (cd "$t" && timeout 240 ./build-gpu/epmoe $c) 2>&1 | grep --line-buffered -E '^\||HBM copy' |
        grep --line-buffered -v -e '---' | tee -a "$log"
      say "(exit ${PIPESTATUS[0]})"
    done
  done
done
for s in "${shs[@]+"${shs[@]}"}"; do
  [ $(( $(date +%s) - start )) -lt "$budget" ] || { say "skipped (budget): $s"; continue; }
  say "== sh $s $(el)"
  EPMOE="$first/build-gpu/epmoe" timeout 240 bash -c "$s" 2>&1 | tee -a "$log"
done
# Side by side: a row is the i-th data row of a command's output on each tree (the benches print
# their rows in a fixed order); its label is its first three cells.
python3 - "$log" <<'PY' | tee -a "$log"
import re, sys, collections
def num(c):
    try:
        float(c)
        return True
    except ValueError:
        return False
vals = collections.OrderedDict()  # cmd -> tree -> round -> [(label, value)]
cur, col = None, None
for line in open(sys.argv[1]):
    m = re.match(r"^== (\S+) round (\d+): epmoe (.*) \[\d+ s\]$", line.rstrip())
    if m:
        cur, col = m.groups(), None
        vals.setdefault(cur[2], collections.OrderedDict()).setdefault(cur[0], {})[cur[1]] = []
        continue
    if not cur or not line.startswith("|"):
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not any(num(c) for c in cells):  # a header
        col = next((i for i, c in enumerate(cells) if "time" in c or c.endswith(" ms") or c.endswith(" us")), None)
        continue
    if col is not None and col < len(cells) and num(cells[col]):
        vals[cur[2]][cur[0]][cur[1]].append((" / ".join(cells[:3]), float(cells[col])))
for cmd, trees in vals.items():
    names = list(trees)
    rows = [list(zip(*[r for _, r in sorted(trees[t].items())])) for t in names]  # tree -> row -> rounds
    n = min(len(r) for r in rows)
    if n == 0:
        continue
    print(f"\n`epmoe {cmd}`\n\n| row | " + " | ".join(names) + " | " + " | ".join(f"{t} / {names[0]}" for t in names[1:]) + " |")
    print("|---|" + "---|" * (2 * len(names) - 1))
    for i in range(n):
        means = [sum(v for _, v in rows[k][i]) / len(rows[k][i]) for k in range(len(names))]
        cells = [" / ".join(f"{v:g}" for _, v in rows[k][i]) for k in range(len(names))]
        ratios = [f"{m / means[0]:.3f}" if means[0] else "-" for m in means[1:]]
        print(f"| {i}: {rows[0][i][0][0]} | " + " | ".join(cells + ratios) + " |")
PY
say "done $(el)"
