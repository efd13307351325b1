#!/usr/bin/env bash
# scripts/gpu_trees.sh (and scripts/sanitize_tests.sh, which it shares with gpu_check.sh) on two
# made-up trees (no GPU): each is built (a stub project whose `epmoe` echoes its arguments), its GPU
# tests run, compute-sanitizer (a stub on PATH) over a filter, an `epmoe` command and a --sh
# command; summary.md names every tree with its results, a tree whose build fails is reported as
# such, the helper says why it skips without compute-sanitizer, and an unknown option is refused.
set -uo pipefail
tool="$1/scripts/gpu_trees.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/out/summary.md" ] && cat "$dir/out/summary.md"; exit 1; }
mkdir -p "$dir/bin" "$dir/trees/good/tests" "$dir/trees/broken" "$dir/out"
# A stub compute-sanitizer: records its arguments, reports no error.
cat > "$dir/bin/compute-sanitizer" <<'SH'
#!/usr/bin/env bash
echo "$@" > "$(dirname "$0")/sanitizer.args"
echo "[  PASSED  ] 1 test."
echo "========= ERROR SUMMARY: 0 errors"
SH
chmod +x "$dir/bin/compute-sanitizer"
# The good tree: `epmoe` and tests/epmoe_gpu_tests are scripts copied into the build, one GPU test.
cat > "$dir/trees/good/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(stub NONE)
enable_testing()
configure_file(epmoe.sh ${CMAKE_BINARY_DIR}/epmoe COPYONLY)
configure_file(epmoe.sh ${CMAKE_BINARY_DIR}/tests/epmoe_gpu_tests COPYONLY)
add_test(NAME gpu_one COMMAND true)
set_tests_properties(gpu_one PROPERTIES LABELS gpu)
CM
printf '#!/usr/bin/env bash\necho "stub epmoe: $*"\n' > "$dir/trees/good/epmoe.sh"
chmod +x "$dir/trees/good/epmoe.sh"
echo 'this is not cmake(' > "$dir/trees/broken/CMakeLists.txt"
command -v ninja > /dev/null || fail "ninja not found (the tool builds with -G Ninja)"
OUT="$dir/out" PATH="$dir/bin:$PATH" "$tool" --tests gpu_one --sanitize 'Stub.*' --cmd "bench runner --quick" \
  --sh 'echo "sh sees $EPMOE"' "$dir/trees/good" "$dir/trees/broken" > "$dir/stdout" 2>&1 ||
  fail "exit $?: $(cat "$dir/stdout")"
s="$dir/out/summary.md"
grep -q '^- good: 100% tests passed, 0 tests failed out of 1; compute-sanitizer memcheck (Stub\.\*): ========= ERROR SUMMARY: 0 errors (exit 0); ' "$s" ||
  fail "good tree's summary line"
grep -q '^- broken: build FAILED' "$s" || fail "broken tree's summary line"
grep -q -- '--gtest_filter=Stub\.\*' "$dir/bin/sanitizer.args" || fail "sanitizer filter: $(cat "$dir/bin/sanitizer.args")"
grep -q '^stub epmoe: bench runner --quick' "$dir/out/good.log" || fail "the --cmd run"
grep -q '^sh sees ./build-gpu/epmoe' "$dir/out/good.log" || fail "the --sh run"
# The shared sanitizer helper says why it skipped where compute-sanitizer is missing.
mkdir -p "$dir/empty"
out=$(PATH="$dir/empty" /bin/bash "$1/scripts/sanitize_tests.sh" /bin/true 'X.*' "$dir/san.log") || fail "exit $? without a sanitizer"
[ "$out" = "compute-sanitizer memcheck (X.*): skipped, compute-sanitizer not found" ] || fail "no-sanitizer line: $out"
"$tool" --nope "$dir/trees/good" > "$dir/err" 2>&1 && fail "unknown option accepted"
grep -q "unknown option --nope" "$dir/err" || fail "unknown-option message: $(cat "$dir/err")"
cat "$s"; echo "gpu_trees_test: ok"
