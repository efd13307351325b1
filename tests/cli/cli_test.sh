#!/usr/bin/env bash
# End-to-end checks of the `epmoe` tool: exit codes and the messages users read.
# usage: cli_test.sh <path to epmoe>
set -u
epmoe=$1
fails=0
envs=""  # VAR=value pairs for the next expect calls
expect() {  # expect <exit code> <regex the output must match> -- <args...>
  local code=$1 pattern=$2; shift 3
  local out rc
  out=$(env $envs "$epmoe" "$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: epmoe $* -> exit $rc (want $code), output must match /$pattern/:"; echo "$out" | head -20
    fails=$((fails + 1))
  else
    echo "ok:   epmoe $*"
  fi
}
expect 0 'usage: epmoe <command>' -- --help
expect 0 'usage: epmoe <command>' -- help
for c in run validate bench; do expect 0 'usage: epmoe '"$c" -- "$c" --help; done
expect 2 'unknown flag --bogus' -- run --bogus
expect 2 'unknown command' -- frobnicate
expect 2 'hidden=7000 is not a multiple of 16, which dispatch format fp8 requires' -- validate --hidden 7000 --dispatch fp8
expect 2 'preset' -- validate --preset no-such-model
expect 0 'R=2 C=128' -- validate --preset deepseek-v3 --experts 16 --ranks 2 --capacity 128 --device cpu --tokens 8
expect 2 'legal pairs' -- validate --preset tiny --dispatcher cpu --runner nosuch
# Bench subcommands exist in CUDA builds only; their usage errors are exit 2 either way.
expect 2 "unknown format 'xx'|unknown subcommand 'layer'" -- bench layer --formats xx
expect 2 "unknown flag --bogus|unknown subcommand 'runner'" -- bench runner --bogus
expect 2 "preset=\"no-such-model\" is unknown|unknown subcommand 'runner'" -- bench runner --preset deepseek-v3,no-such-model
expect 2 "unknown weight format 'fp9'|unknown subcommand 'runner'" -- bench runner --preset all --formats fp9
expect 2 "--nvfp4-layout: 'shuffled' is not a layout|unknown subcommand 'runner'" -- bench runner --nvfp4-layout shuffled
expect 2 "--routing=bogus is not a routing|unknown subcommand 'runner'" -- bench runner --routing bogus
expect 2 "--settle-ms: -5 must be 0..60000|unknown subcommand 'runner'" -- bench runner --settle-ms -5
expect 2 "is not a multi-GPU dispatcher|unknown subcommand 'a2a'" -- bench a2a --dispatchers local
expect 0 'nvfp4 +nvfp4' -- run --device cpu
expect 0 'fp8 +fp8' -- run --device cpu --preset tiny --ranks 2 --tokens 5,0 --layers 2
expect 2 'num_experts=16 is not divisible by num_ranks=3' -- run --device cpu --ranks 3 --tokens 5,0,7

# The run's table: max_err/max_ref (not "max_rel_err"), a status per row, the plan up front.
expect 0 'max_err/max_ref.*status' -- run --device cpu --dispatch bf16 --tokens 4 --layers 1
expect 0 'plan: 1 row x 1 layer; float64 check on tokens 4,4,4,4' -- run --device cpu --dispatch bf16 --tokens 4 --layers 1
# Non-finite outputs fail the row (said on the row) and the run (exit 1), never print 0 errors.
expect 1 'FAIL: [0-9]+ of [0-9]+ checked values are NaN/Inf' -- run --device cpu --router sigmoid --n-group 4 --topk-group 2 --scaling 1e38 --dispatch bf16
# One rank on the CPU: dispatcher local, as the help says.
expect 0 'fp8 +fp8 +bf16 +37 +37 .* ok' -- run --device cpu --ranks 1 --dispatch fp8 --layers 1
expect 0 'dispatcher=local runner=reference' -- validate --device cpu --ranks 1
# A model preset on the CPU: one layer, a token subset, what will run said first.
expect 0 'qwen3-30b-a3b.*1 layer' -- validate --device cpu --preset qwen3-30b-a3b --ranks 2 --tokens 16
expect 2 'needs about [0-9.]+ GiB of host memory; this machine has [0-9.]+ GiB available.*(What fits: --experts [0-9]+|Lower)' -- run --device cpu --preset deepseek-v3 --experts 100000 --ranks 4
expect 2 'needs about [0-9.]+ GiB of host memory' -- validate --device cpu --preset deepseek-v3 --experts 100000 --ranks 4

# validate refuses what run refuses, with the same words, before any table.
for cmd in run validate; do
  expect 2 'every rank has -5 tokens; give 0 or more' -- $cmd --device cpu --tokens -5
  expect 2 'a rank has 100 tokens, more than --capacity=10' -- $cmd --device cpu --tokens 100 --capacity 10
  expect 2 'every rank has 3000000000 tokens, more than one call can take' -- $cmd --device cpu --tokens 3000000000
  expect 2 '--layers=-3 must be at least 1' -- $cmd --device cpu --layers -3
  expect 2 '--dispatcher local does not run with --ranks 4' -- $cmd --device cpu --ranks 4 --dispatcher local
  expect 2 '--dispatcher nvlink needs --device cuda|dispatcher.*nvlink' -- $cmd --device cpu --dispatcher nvlink
  expect 2 '--n-group applies to the sigmoid router only' -- $cmd --device cpu --n-group 4
  expect 2 '--slots-per-rank applies to an explicit --placement only' -- $cmd --device cpu --slots-per-rank 5
  expect 2 'timeout_ms' -- $cmd --device cpu --timeout-ms 0
done
expect 2 '--capacity=99999999999 is out of range' -- validate --device cpu --capacity 99999999999
# A problem of the whole configuration is said once, before the table (not once per row).
out=$("$epmoe" run --device cpu --tokens -5 2>&1)
n=$(grep -c 'has -5 tokens' <<<"$out"); if [ "$n" -ne 1 ] || grep -q 'dispatch ' <<<"$out"; then
  echo "FAIL: a whole-configuration error must be said once, before any table:"; echo "$out" | head; fails=$((fails + 1)); else echo "ok:   whole-configuration error said once"; fi
# No GPU: said in those words, not as a CUDA driver error.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect 2 'no CUDA GPU' -- run --device cuda
  expect 2 'no CUDA GPU' -- validate --device cuda
  expect 2 'no CUDA GPU' -- validate --device cpu --dispatcher nccl --ranks 2
fi

# Tuning flags reach the configuration (describe), with their source; bad values are refused.
expect 0 'engine +mma .*set' -- validate --device cpu --engine mma
expect 0 'comm_sms +48 .*set' -- validate --device cpu --comm-sms 48
expect 0 'combine +ce .*\[agree\] set' -- validate --device cpu --combine-mode ce
expect 0 'ce_rows +64 ' -- validate --device cpu --ce-rows 64 --push-warps 8 --wgmma-defer 0 --fused-swiglu 1 --widen-scratch-mb 64 --nvfp4-prepare 0
expect 2 'tuning.push_warps=99 is outside' -- validate --device cpu --push-warps 99
expect 2 '--engine=fast is not an engine' -- validate --device cpu --engine fast
expect 2 '--combine-mode=dma is not a combine mode' -- run --device cpu --combine-mode dma
expect 0 'interm. q: +fp8' -- validate --device cpu --iq fp8
expect 2 '--iq is short for --intermediate-quant' -- validate --device cpu --iq fp8 --intermediate-quant none
# --iq defaults to auto: fp8 for fp8 weights, none otherwise; describe says the resolved value.
expect 0 'interm. q: +fp8 \(auto' -- validate --device cpu --dispatch fp8 --weights fp8
expect 0 'interm. q: +fp8 \(auto' -- validate --device cpu --dispatch fp8 --weights fp8 --iq auto
expect 0 'interm. q: +none \(auto' -- validate --device cpu --dispatch bf16 --weights bf16
expect 0 'interm. q: +none \(auto' -- validate --device cpu --dispatch fp8 --weights nvfp4
expect 0 'interm. q: +none$' -- validate --device cpu --dispatch fp8 --weights fp8 --iq none
expect 2 '--iq=bf16 is not known; use auto, none or fp8' -- validate --device cpu --iq bf16
expect 0 'auto\|none\|fp8' -- validate --help
# A malformed EPMOE_* variable is reported by validate, naming the variable.
envs="EPMOE_RUNNER_ENGINE=fast"
expect 2 'EPMOE_RUNNER_ENGINE' -- validate --device cpu
envs=""
# The benches take the same flags (CPU builds: the subcommand is missing, still exit 2).
expect 2 "--engine=fast is not an engine|unknown subcommand 'runner'" -- bench runner --engine fast
expect 2 "--combine-mode=dma is not a combine mode|needs at least 2 GPUs|unknown subcommand 'a2a'" -- bench a2a --combine-mode dma
# bench runner --dry-run (CUDA builds): the plan of rows and tiles, without a GPU. Uniform rows fill
# the tiles exactly, and of the split's launches (one per tile: 4, or 2 at a mean of up to 64 rows)
# only one has rows; the router's spread pads the tiles. Few experts (Mixtral's 4) run one launch.
# The last two columns: the mixed-input GEMM's MMA rows / M and token tiles per expert; skewed,
# DeepSeek-V3's cold experts (128 rows) take one 128-wide mid tile each and its 12 hot experts (1493
# or 1494 rows) six 256-wide tiles: 33280 / 32768 rows, 188 / 128 tiles.
if "$epmoe" bench runner --help >/dev/null 2>&1; then
  expect 0 '^\| 32768 \| 256\.0 \| 128 \| 256\.\.256 \| 1\.00 \| 1\.00 \| 1\.00 \| 1 of 4 / 1 of 4 \| 1\.00 \| 1\.00 \|$' -- bench runner --dry-run --preset deepseek-v3 --m 32768
  expect 0 '^\| 4096 \| 32\.0 \| 128 \| [0-9]+\.\.[0-9]+ \| 1\.[0-9][0-9] \| [0-9.]+ \| [0-9.]+ \| [1-2] of 2 / [1-2] of 2 \| [0-9.]+ \| [0-9.]+ \|$' -- bench runner --dry-run --preset deepseek-v3 --m 4096 --routing router
  expect 0 '^\| 2048 \| 512\.0 \| 4 \| 512\.\.512 \| 1\.00 \| 1\.00 \| 1\.00 \| 1 of 1 / 1 of 1 \| 1\.00 \| 2\.00 \|$' -- bench runner --dry-run --preset mixtral-8x7b --m 2048
  expect 0 '^\| 32768 \| 256\.0 \| 128 \| 128\.\.1494 \| .* \| 1\.02 \| 1\.47 \|$' -- bench runner --dry-run --preset deepseek-v3 --m 32768 --skew
  expect 0 'routing skewed' -- bench runner --dry-run --preset mixtral-8x7b --skew --m 128
fi
# --dump: a prefix in a missing folder is refused before any work.
expect 2 '--dump=/nonexistent-epmoe/x: the folder /nonexistent-epmoe does not exist' -- run --device cpu --dump /nonexistent-epmoe/x
[ "$fails" -eq 0 ] && echo "all CLI checks passed" || { echo "$fails CLI check(s) failed"; exit 1; }
