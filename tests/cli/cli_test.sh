#!/usr/bin/env bash
# End-to-end checks of the `epmoe` tool: exit codes and the messages users read.
# usage: cli_test.sh <path to epmoe>
set -u
epmoe=$1
fails=0
expect() {  # expect <exit code> <regex the output must match> -- <args...>
  local code=$1 pattern=$2; shift 3
  local out rc
  out=$("$epmoe" "$@" 2>&1); rc=$?
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
expect 2 'hidden=7000 is not a multiple of 128, which dispatch format fp8 requires' -- validate --hidden 7000 --dispatch fp8
expect 2 'preset' -- validate --preset no-such-model
expect 0 'R=2 C=128' -- validate --preset deepseek-v3 --ranks 2 --capacity 128
expect 2 'legal pairs' -- validate --preset tiny --dispatcher cpu --runner nosuch
# Bench subcommands exist in CUDA builds only; their usage errors are exit 2 either way.
expect 2 "unknown format 'xx'|unknown subcommand 'layer'" -- bench layer --formats xx
expect 2 "unknown flag --bogus|unknown subcommand 'runner'" -- bench runner --bogus
expect 2 "preset=\"no-such-model\" is unknown|unknown subcommand 'runner'" -- bench runner --preset deepseek-v3,no-such-model
expect 2 "unknown weight format 'fp9'|unknown subcommand 'runner'" -- bench runner --preset all --formats fp9
expect 2 "--nvfp4-layout: 'shuffled' is not a layout|unknown subcommand 'runner'" -- bench runner --nvfp4-layout shuffled
expect 2 "is not a multi-GPU dispatcher|unknown subcommand 'a2a'" -- bench a2a --dispatchers local
expect 0 'nvfp4 +nvfp4' -- run --device cpu
expect 0 'fp8 +fp8' -- run --device cpu --preset tiny --ranks 2 --tokens 5,0 --layers 2
expect 2 'num_experts=16 is not divisible by num_ranks=3' -- run --device cpu --ranks 3 --tokens 5,0,7
[ "$fails" -eq 0 ] && echo "all CLI checks passed" || { echo "$fails CLI check(s) failed"; exit 1; }
