#!/usr/bin/env bash
# scripts/kernel_times.sh on a made-up ncu raw page (no GPU): launches of one kernel summed and
# divided by --calls, CUTLASS instantiations whose cut names are alike told apart by their tile
# triples, DRAM and L2 rates and DRAM GB per call (read / write where the page has them) with --bytes,
# a row per launch with --launches, unit scaling, and the errors for a missing command, an
# unknown unit and --bytes on a page without byte columns.
set -uo pipefail
tool="$1/scripts/kernel_times.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
long1='void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<7, cute::tuple<cute::C<2>, cute::C<1>, cute::C<1>>>, cute::tuple<cute::C<128>, cute::C<192>, cute::C<64>>>>>(T1)'
long2='void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<5, cute::tuple<cute::C<2>, cute::C<1>, cute::C<1>>>, cute::tuple<cute::C<128>, cute::C<256>, cute::C<64>>>>>(T1)'
# Times in usecond; DRAM bytes in Mbyte, L2 bytes in Gbyte (as ncu scales a column).
cat > "$dir/raw.csv" <<CSV
==PROF== Connected to process 1
"ID","Process ID","Kernel Name","dram__bytes.sum","gpu__time_duration.sum","lts__t_bytes.sum"
"","","","Mbyte","usecond","Gbyte"
"0","1","void epmoe::permute_vec_kernel<0>(int, int)","40","10","0.08"
"1","1","$long1","300","100","1"
"2","1","$long2","500","200","2"
"3","1","void epmoe::permute_vec_kernel<0>(int, int)","40","10","0.08"
CSV
out=$("$tool" --csv "$dir/raw.csv" --calls 2) || fail "exit $? on a valid page: $out"
echo "$out"
echo "$out" | grep -q '^| `epmoe::permute_vec_kernel<0>` | 2 | 20.0 | 10.0 | 6.2% |$' || fail "summed launches"
echo "$out" | grep -q '2x1x1 128x192x64 #[0-9a-f]\{6\}` | 1 | 100.0 | 50.0 | 31.2% |$' || fail "tile 192 row"
echo "$out" | grep -q '2x1x1 128x256x64 #[0-9a-f]\{6\}` | 1 | 200.0 | 100.0 | 62.5% |$' || fail "tile 256 row"
echo "$out" | grep -q '^| all | 4 | 320.0 | 160.0 | 100% |$' || fail "total"
out=$("$tool" --csv "$dir/raw.csv" --bytes) || fail "exit $? with --bytes: $out"
# 80 MB in 20 us: 4000 GB/s from DRAM; 0.16 GB in 20 us: 8000 GB/s from L2; 0.08 GB per call (1).
echo "$out" | grep -q '^| `epmoe::permute_vec_kernel<0>` | 2 | 20.0 | 20.0 | 6.2% | 4000 | 8000 | 0.08 |$' ||
  fail "--bytes rates: $out"
echo "$out" | grep -q '128x256x64 .* | 2500 | 10000 | 0.50 |$' || fail "--bytes CUTLASS rates: $out"
# With read and write columns (as --bytes profiles): their GB per call; --launches: a row per launch.
cat > "$dir/rw.csv" <<CSV
"ID","Process ID","Kernel Name","dram__bytes.sum","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","lts__t_bytes.sum"
"","","","Gbyte","Gbyte","Mbyte","usecond","Gbyte"
"0","1","$long2","3","2.5","500","1000","6"
"1","1","$long2","1","0.75","250","500","2"
CSV
out=$("$tool" --csv "$dir/rw.csv" --bytes --calls 2) || fail "exit $? with read/write columns: $out"
echo "$out" | grep -q '128x256x64 .* | 2 | 1500.0 | 750.0 | 100.0% | 2667 | 5333 | 2.00 | 1.62 / 0.38 |$' ||
  fail "read / write per call: $out"
out=$("$tool" --csv "$dir/rw.csv" --bytes --launches) || fail "exit $? with --launches: $out"
echo "$out" | grep -q '^| launch | kernel | us | DRAM GB/s | L2 GB/s | DRAM GB per launch | read / write GB |$' ||
  fail "--launches header: $out"
echo "$out" | grep -q '^| 1 | `cutlass.* | 500.0 | 2000 | 4000 | 1.00 | 0.75 / 0.25 |$' || fail "--launches row: $out"
"$tool" > "$dir/err" 2>&1 && fail "no command accepted"
grep -q "no command after --" "$dir/err" || fail "no-command message: $(cat "$dir/err")"
sed 's/"usecond"/"fortnight"/' "$dir/raw.csv" > "$dir/unit.csv"
"$tool" --csv "$dir/unit.csv" > "$dir/err" 2>&1 && fail "an unknown time unit accepted"
grep -q "unknown time unit 'fortnight'" "$dir/err" || fail "unit message: $(cat "$dir/err")"
cat > "$dir/nobytes.csv" <<'CSV'
"ID","Process ID","Kernel Name","gpu__time_duration.sum"
"","","","nsecond"
"0","1","void epmoe::reduce_vec_kernel(int)","72100"
CSV
"$tool" --csv "$dir/nobytes.csv" > "$dir/plain" 2>&1 || fail "a page without byte columns: $(cat "$dir/plain")"
grep -q '^| `epmoe::reduce_vec_kernel` | 1 | 72.1 | 72.1 | 100.0% |$' "$dir/plain" || fail "nsecond: $(cat "$dir/plain")"
"$tool" --csv "$dir/nobytes.csv" --bytes > "$dir/err" 2>&1 && fail "--bytes without byte columns accepted"
grep -q "no dram__bytes.sum column" "$dir/err" || fail "no-bytes message: $(cat "$dir/err")"
echo "kernel_times.sh: ok"
