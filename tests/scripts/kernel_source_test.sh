#!/usr/bin/env bash
# scripts/kernel_source.sh on a made-up ncu source page (no GPU): the split at the last HGMMA, the
# shares of samples and executed instructions per region, the stall and opcode tallies, a --mark
# cut, and the errors for a missing command and a file without a SASS table.
set -uo pipefail
tool="$1/scripts/kernel_source.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Columns as ncu 2025.3 writes them (a subset; the tool looks them up by name). Samples: 30 before
# the last HGMMA, 70 after it; executed: 600 before, 400 after.
cat > "$dir/page.csv" <<'CSV'
"Kernel Name","void k(int)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_wait","stall_no_inst","stall_wait (Not Issued)"
"0x0","      LOP3.LUT R1, R2, 0x1, RZ, 0xc0, !PT","10","10","300","10","0","10"
"0x10","      HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8], R88","20","20","300","5","15","5"
"0x20","      ISETP.GE.AND P0, PT, R3, R4, PT","40","40","200","40","0","40"
"0x30","  @P0 STG.E.U16 desc[UR4][R14.64], R17","30","30","200","0","30","0"
CSV
out=$("$tool" --csv "$dir/page.csv") || fail "exit $? on a valid page: $out"
echo "$out"
echo "$out" | grep -q '^| prologue and main loop | 0-1 | 30.0% | 60.0% |' || fail "before the last HGMMA"
echo "$out" | grep -q '^| after the last HGMMA | 2-3 | 70.0% | 40.0% | wait 57%, no_inst 43% | ISETP 50%, STG 50% |' ||
  fail "after the last HGMMA"
echo "$out" | grep -q '^4 SASS lines, 100 warp samples, 1000 warp-level instructions executed.' || fail "totals"
out=$("$tool" --csv "$dir/page.csv" --mark '^LOP3' --mark '^ISETP') || fail "exit $? with --mark"
echo "$out" | grep -q '^| region 1 | 1-2 | 60.0% |' || fail "--mark cuts: $out"
"$tool" > "$dir/err" 2>&1 && fail "no command accepted"
grep -q "no command after --" "$dir/err" || fail "no-command message: $(cat "$dir/err")"
echo '"Kernel Name","x"' > "$dir/bad.csv"
"$tool" --csv "$dir/bad.csv" > "$dir/err" 2>&1 && fail "a page without SASS accepted"
grep -q "no SASS table" "$dir/err" || fail "no-table message: $(cat "$dir/err")"
echo "kernel_source.sh: ok"
