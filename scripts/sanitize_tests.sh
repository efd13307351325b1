#!/usr/bin/env bash
# compute-sanitizer memcheck over the GPU tests of one gtest filter, for gpu_check.sh and
# gpu_trees.sh: the full output to LOG, one summary line on stdout, the sanitizer's exit status.
#   scripts/sanitize_tests.sh TESTS_BINARY FILTER LOG [TIMEOUT_SECONDS (default 600)] [--no-api-errors]
# --no-api-errors: memory errors only. For the multi-GPU tests: libnccl.so.2 probes with calls that
# fail by design (cudaErrorPeerAccessAlreadyEnabled, cudaErrorNoKernelImageForDevice; 2112 of them
# in 12 tests, session 36), and epmoe checks the return of every CUDA call it makes itself.
set -uo pipefail
[ $# -ge 3 ] || { echo "sanitize_tests: usage: TESTS_BINARY FILTER LOG [TIMEOUT]" >&2; exit 2; }
bin="$1"; filter="$2"; log="$3"; limit="${4:-600}"
api=()
[ "${5:-}" = "--no-api-errors" ] && api=(--report-api-errors no)
if ! command -v compute-sanitizer > /dev/null 2>&1; then
  echo "compute-sanitizer memcheck ($filter): skipped, compute-sanitizer not found"
  exit 0
fi
timeout "$limit" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 "${api[@]}" \
  "$bin" --gtest_filter="$filter" > "$log" 2>&1
rc=$?
summary=$(grep -E 'ERROR SUMMARY' "$log" | tail -1)
echo "compute-sanitizer memcheck ($filter): ${summary:-no summary} (exit $rc)"
exit $rc
