#!/usr/bin/env bash
# On a GPU machine: check several source trees (e.g. branches exported with `git archive` into
# subdirectories of one carried folder) in one call, one after the other: build, the GPU tests that
# match a regex, then the `epmoe` commands. One log per tree in $OUT (or ./out), plus summary.md,
# so that a device call that returns few files still brings every tree's result back.
#   scripts/gpu_trees.sh [--tests REGEX] [--sanitize FILTER] [--cmd "ARGS"] [--sh "COMMAND"]
#                        [--budget SECONDS] TREE...
#     --tests   ctest -R regex of GPU tests (default: all GPU tests)
#     --sanitize  after the tests, compute-sanitizer memcheck over the GPU tests of this gtest
#               filter (e.g. 'CudaRunnerNvfp4Wide.*'); its error summary goes into summary.md
#     --cmd     arguments of an epmoe run on every tree; repeatable, run in the order given
#               (default: bench a2a --quick --phases); "" alone skips
#     --sh      a shell command run in every tree after the --cmd runs, with $EPMOE the tree's
#               epmoe binary (e.g. scripts/kernel_source.sh -- $EPMOE bench runner ...); repeatable
#     --budget  stop starting new trees after this many seconds (default 540)
# Example (here, before the call):
#   for b in next/a next/b; do d=.trees/${b//\//_}; mkdir -p $d; git archive $b | tar -x -C $d; done
# then on the device: scripts/gpu_trees.sh --tests 'NcclNvlink|Layer' .trees/*
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
tests=""; sanitize=""; cmds=(); shs=(); budget=540; trees=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests="$2"; shift 2 ;;
    --sanitize) sanitize="$2"; shift 2 ;;
    --cmd) cmds+=("$2"); shift 2 ;;
    --sh) shs+=("$2"); shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    -*) echo "gpu_trees: unknown option $1" >&2; exit 2 ;;
    *) trees+=("$1"); shift ;;
  esac
done
[ ${#trees[@]} -gt 0 ] || { echo "gpu_trees: no tree given (see --help)" >&2; exit 2; }
[ ${#cmds[@]} -gt 0 ] || cmds=("bench a2a --quick --phases")
start=$(date +%s)
summary="$out/summary.md"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)
echo "# gpu_trees $(date -u +%Y-%m-%dT%H:%MZ), ${gpus:-no GPU found}" > "$summary"
for t in "${trees[@]}"; do
  name=$(basename "$t")
  log="$out/$name.log"
  if [ $(( $(date +%s) - start )) -ge "$budget" ]; then
    echo "- $name: not started (budget of $budget s spent)" >> "$summary"
    continue
  fi
  [ -d "$t" ] || { echo "- $name: no such directory" >> "$summary"; continue; }
  # A tree exported by git archive has no .deps: use the CUTLASS headers of this checkout.
  [ -e "$t/.deps" ] || ln -s "$here/.deps" "$t/.deps"
  t0=$(date +%s)
  {
    echo "== build"
    cmake -S "$t" -B "$t/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$t/build.log" 2>&1 &&
      cmake --build "$t/build-gpu" -j "$(nproc)" >> "$t/build.log" 2>&1
  } > "$log" 2>&1
  if [ $? -ne 0 ]; then
    tail -30 "$t/build.log" >> "$log"
    echo "- $name: build FAILED (log: $name.log)" >> "$summary"
    continue
  fi
  (cd "$t/build-gpu" && EPMOE_CPU_THREADS=$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 )) \
    ctest -L gpu -j 4 --output-on-failure --timeout 300 ${tests:+-R "$tests"}) > "$t/ctest.log" 2>&1
  res=$(grep -E 'tests passed|tests failed' "$t/ctest.log" | tail -1)
  { echo "== tests: $res"; grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)' "$t/ctest.log";
    grep -B3 -A20 'Failure' "$t/ctest.log" | head -80; } >> "$log"
  if [ -n "$sanitize" ]; then
    san=$("$here/scripts/sanitize_tests.sh" "$t/build-gpu/tests/epmoe_gpu_tests" "$sanitize" "$t/sanitizer.log" 300)
    res="$res; $san"
    { echo "== $san"; grep -E 'PASSED|FAILED' "$t/sanitizer.log";
      grep -m 20 -E '^=+ (Invalid|Program hit|Error)' "$t/sanitizer.log"; } >> "$log"
  fi
  for cmd in "${cmds[@]}"; do
    [ -n "$cmd" ] || continue
    echo "== epmoe $cmd" >> "$log"
    (cd "$t" && timeout 240 ./build-gpu/epmoe $cmd) >> "$log" 2>&1
    echo "(exit $?)" >> "$log"
  done
  for sh in ${shs[@]+"${shs[@]}"}; do
    echo "== sh $sh" >> "$log"
    (cd "$t" && EPMOE=./build-gpu/epmoe timeout 240 bash -c "$sh") >> "$log" 2>&1
    echo "(exit $?)" >> "$log"
  done
  echo "- $name: $res; $(( $(date +%s) - t0 )) s (log: $name.log)" >> "$summary"
done
cat "$summary"
