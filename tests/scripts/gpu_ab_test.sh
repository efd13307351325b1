#!/usr/bin/env bash
# scripts/gpu_ab.sh on two made-up trees (no GPU): both build, the first with its tests and the
# second only its `epmoe` target; the first tree's GPU tests run; every --cmd runs on each tree
# once per round, the order reversed in the second round; compute-sanitizer (a stub) over a filter;
# only table rows reach the log; --sh sees
# the first tree's binary; the script ends (it once hung in a bare `wait`); bad arguments refused.
set -uo pipefail
tool="$1/scripts/gpu_ab.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/out/ab.log" ] && cat "$dir/out/ab.log"; exit 1; }
command -v ninja > /dev/null || fail "ninja not found (the tool builds with -G Ninja)"
for name in a b; do
  t="$dir/trees/$name"
  mkdir -p "$t"
  # `epmoe` prints one table row naming its tree and a line the log must drop; the `tests` target
  # (built only where tests are asked for) leaves a marker.
  cat > "$t/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(stub NONE)
enable_testing()
configure_file(epmoe.sh \${CMAKE_BINARY_DIR}/epmoe COPYONLY)
add_custom_target(epmoe)
add_custom_target(gpu_tests ALL COMMAND \${CMAKE_COMMAND} -E touch \${CMAKE_BINARY_DIR}/tests_built)
add_test(NAME gpu_one COMMAND true)
set_tests_properties(gpu_one PROPERTIES LABELS gpu)
CM
  # A bench table as the runner prints it: a header, then rows whose time is 2.0 ms on tree a and
  # 1.0 on tree b (the summary's ratio 0.500).
  time=$([ "$name" = a ] && echo 2.0 || echo 1.0)
  printf '#!/usr/bin/env bash\necho "| tree %s | $* |"\necho "noise that is not a table row"\necho "| M | format | engine | time ms |"\necho "| 128 | bf16 | x | %s |"\necho "| 2048 | bf16 | x | %s |"\n' "$name" "$time" "$time" > "$t/epmoe.sh"
  chmod +x "$t/epmoe.sh"
done
# A stub compute-sanitizer on PATH: records its arguments, reports no error.
mkdir -p "$dir/bin"
printf '#!/usr/bin/env bash\necho "$@" > "$(dirname "$0")/sanitizer.args"\necho "========= ERROR SUMMARY: 0 errors"\n' \
  > "$dir/bin/compute-sanitizer"
chmod +x "$dir/bin/compute-sanitizer"
OUT="$dir/out" PATH="$dir/bin:$PATH" timeout 120 "$tool" --tests gpu_one --sanitize 'Stub.*' --rounds 2 \
  --cmd "bench runner --m 1" --sh 'echo "| sh sees $EPMOE |"' "$dir/trees/a" "$dir/trees/b" > "$dir/stdout" 2>&1 ||
  fail "exit $?: $(cat "$dir/stdout")"
log="$dir/out/ab.log"
[ -f "$dir/trees/a/build-gpu/tests_built" ] || fail "the first tree's tests were not built"
[ -f "$dir/trees/b/build-gpu/tests_built" ] && fail "the second tree built more than epmoe"
grep -q '^tests a: 100% tests passed, 0 tests failed out of 1' "$log" || fail "the first tree's test line"
grep -q '^compute-sanitizer memcheck (Stub\.\*): ========= ERROR SUMMARY: 0 errors' "$log" || fail "the sanitizer line"
grep -q -- '--gtest_filter=Stub\.\*' "$dir/bin/sanitizer.args" || fail "sanitizer filter: $(cat "$dir/bin/sanitizer.args")"
rows=$(grep -E '^\| tree ' "$log" | sed -E 's/^\| tree ([ab]) .*/\1/' | paste -sd' ')
[ "$rows" = "a b b a" ] || fail "run order '$rows', expected 'a b b a'"
grep -q '^| tree a | bench runner --m 1 |$' "$log" || fail "the command's arguments"
grep -q 'noise' "$log" && fail "a line that is not a table row reached the log"
grep -q "^| sh sees $dir/trees/a/build-gpu/epmoe |" "$log" || fail "the --sh run"
grep -q '^done ' "$log" || fail "no closing line"
grep -q '^| 1: 2048 / bf16 / x | 2 / 2 | 1 / 1 | 0.500 |$' "$log" || fail "the side-by-side table"
"$tool" --nope "$dir/trees/a" > "$dir/err" 2>&1 && fail "unknown option accepted"
grep -q "unknown option --nope" "$dir/err" || fail "unknown-option message: $(cat "$dir/err")"
"$tool" --sanitize 'X.*' "$dir/trees/a" > "$dir/err" 2>&1 && fail "--sanitize without --tests accepted"
grep -q "needs --tests" "$dir/err" || fail "--sanitize message: $(cat "$dir/err")"
"$tool" "$dir/trees/none" > "$dir/err" 2>&1 && fail "a missing tree accepted"
grep -q "no such tree" "$dir/err" || fail "missing-tree message: $(cat "$dir/err")"
echo "gpu_ab_test: ok"
