#!/usr/bin/env bash
# Set up, build, and run the whole test suite; extra arguments go to ctest (e.g. -L cpu). On a
# machine without a GPU the GPU tests are compiled and reported as skipped (with the reason), never
# as passed. The output shows what failed (each failure's own output) and ends with ONE summary
# line: passed, failed, skipped and why. The exit code is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
junit=$(mktemp /tmp/epmoe-ctest.XXXXXX.xml)
trap 'rm -f "$junit"' EXIT
set +e
# Per-test status lines of passed and skipped tests and ctest's closing lists are left out: the
# summary below says the same in one line. Failures keep their output (--output-on-failure).
ctest --output-on-failure --output-junit "$junit" -j "${EPMOE_JOBS:-$(nproc)}" "$@" 2>&1 |
  awk '/tests passed, .* tests failed out of/ {tail=1} tail {next}
       /^ +Start +[0-9]+: / {next} /Test +#[0-9]+: .*(Passed|Skipped) +[0-9.]+ sec/ {next}
       {print; fflush()}'
rc=${PIPESTATUS[0]}
set -e
python3 - "$junit" "$rc" <<'PY'
import collections, re, sys, xml.etree.ElementTree as ET
path, rc = sys.argv[1], int(sys.argv[2])
try:
    cases = ET.parse(path).getroot().iter("testcase")
except Exception as e:
    print(f"tests: no result file from ctest ({e}); ctest exit code {rc}")
    sys.exit(0)
passed, failed, skipped, why = 0, [], 0, collections.Counter()
for c in cases:
    status = c.get("status", "")
    if c.find("skipped") is not None or status in ("skipped", "disabled", "notrun"):
        skipped += 1
        out = "".join(x.text or "" for x in c.iter("system-out")) + (c.find("skipped").get("message", "") if c.find("skipped") is not None else "")
        # gtest prints the GTEST_SKIP message before "[  SKIPPED ]"; scripts print "skipped: why".
        m = re.search(r"skipped: (.*)", out) or re.search(r"\n([^\n\[]+)\n\[  SKIPPED \]", out)
        reason = m.group(1).strip() if m else "reason not printed"
        reason = re.split(r"[:(]", reason)[0].strip() or reason
        why[reason] += 1
    elif c.find("failure") is not None or c.find("error") is not None or status == "fail":
        failed.append(c.get("name"))
    else:
        passed += 1
line = f"tests: {passed} passed, {len(failed)} failed"
line += f", skipped {skipped}" + (": " + "; ".join(f"{n} {r}" if len(why) > 1 else r for r, n in why.most_common()) if skipped else "")
if failed:
    line += " (failed: " + ", ".join(failed[:8]) + (", ..." if len(failed) > 8 else "") + ")"
print(line)
PY
exit "$rc"
