#!/usr/bin/env bash
# On a GPU machine: build, run every GPU test and the benchmarks, and write a short summary.
#   scripts/gpu_check.sh [--tests REGEX] [--no-tests] [--no-bench] [--bench "ARGS"]... [--no-sanitize]
#                        [--no-python] [--pybench "ARGS"]... [--torch-bench "ARGS"]...
#   --torch-bench "ARGS": bench/torch_grouped_mm.py ARGS (PyTorch's grouped GEMMs on the shapes and
#   floor of `epmoe bench runner`), after the epmoe benches, in the same session; repeatable.
# Output: $OUT (or ./out) gets summary.md, ctest.log, bench logs. The GPU machine keeps nothing, so
# copy the summary into bench/results/ and commit it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(pwd)/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
tests_regex=""; run_tests=1; run_bench=1; benches=(); pybenches=(); torchbenches=(); sanitize=1; run_python=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests_regex="$2"; shift 2 ;;
    --no-tests) run_tests=0; sanitize=0; shift ;;
    --no-bench) run_bench=0; shift ;;
    --pybench) pybenches+=("$2"); shift 2 ;;
    --torch-bench) torchbenches+=("$2"); shift 2 ;;
    --no-sanitize) sanitize=0; shift ;;
    --no-python) run_python=0; shift ;;
    --bench) benches+=("$2"); shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
[ ${#benches[@]} -eq 0 ] && benches=("runner" "a2a" "layer")

summary="$out/summary.md"
{
  echo "# epmoe GPU check"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  # The device copy of the tree may come without .git: the caller can pass EPMOE_COMMIT.
  echo "- commit: ${EPMOE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "- GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"
  echo "- nvcc: $(nvcc --version | tail -1)"
} > "$summary"

# The NCCL the library links is the one whose headers it is built with (the system copy here).
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release ${EPMOE_CMAKE_ARGS:-} > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" >> "$out/build.log" 2>&1
rc=$?
echo "- build: $([ $rc -eq 0 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s" >> "$summary"
if [ $rc -ne 0 ]; then tail -40 "$out/build.log"; cat "$summary"; exit 1; fi

# GPU tests run 4 at a time; their CPU references share the cores (EPMOE_CPU_THREADS per process).
export EPMOE_CPU_THREADS=${EPMOE_CPU_THREADS:-$(( $(nproc) / ${EPMOE_TEST_JOBS:-4} > 0 ? $(nproc) / ${EPMOE_TEST_JOBS:-4} : 1 ))}
if [ $run_tests -eq 1 ]; then
(cd build-gpu && ctest -L gpu -j "${EPMOE_TEST_JOBS:-4}" --output-on-failure --timeout ${EPMOE_TEST_TIMEOUT:-300} ${tests_regex:+-R "$tests_regex"}) > "$out/ctest.log" 2>&1
echo "- GPU tests: $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)" >> "$summary"
grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)' "$out/ctest.log" | head -20 | sed 's/^/  - FAIL /' >> "$summary"
fi

# compute-sanitizer (memcheck) over the single-GPU tests that are quick under it: every kernel of
# route, quantize, local dispatch/combine, the runner's engines on small problems, graph capture.
if [ $sanitize -eq 1 ]; then
  # EPMOE_SANITIZE_FILTER replaces the list (a gtest filter), e.g. to cover one engine's tests.
  filter=${EPMOE_SANITIZE_FILTER:-'CudaQuant.*:CudaRoute.*:CudaLocalDispatch.*:CudaRunner.SkewedLoadsAndTinyBatches:CudaRunnerNvfp4Wide.EveryPartialTileWidth:CutlassEngine.GroupedGemmDirect:CutlassEngine.GraphReplayEqualsEager:CutlassEngine.WidenMatchesHostDequant:WgmmaPipeline.*:CudaLayerGraph.*:CudaLayerFaults.*'}
  echo "- $(scripts/sanitize_tests.sh build-gpu/tests/epmoe_gpu_tests "$filter" "$out/sanitizer.log" \
    "${EPMOE_SANITIZE_TIMEOUT:-600}")" >> "$summary"
  # The GPU dispatchers on 2 GPUs in one process (memory errors only: NCCL's own probing fails
  # some CUDA calls by design).
  if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
    echo "- $(scripts/sanitize_tests.sh build-gpu/tests/epmoe_gpu_tests \
      'NcclNvlink/GpuA2A.*:NvlinkDispatch.CudaGraphReplay:NvlinkDispatch.CopyEngine*:NcclNvlinkDispatch.VeryUnbalancedRanks' \
      "$out/sanitizer_multi.log" "${EPMOE_SANITIZE_TIMEOUT:-600}" --no-api-errors)" >> "$summary"
  fi
fi

# The Python package against PyTorch on the GPU: built in its own tree against the NCCL that torch
# loads (its nvidia/nccl copy, when it has the device-API headers), so that importing torch first
# loads the same NCCL the extension was compiled with.
if [ $run_python -eq 1 ] && python3 -c "import nanobind, torch" 2>/dev/null; then
  t0=$(date +%s)
  nccl_root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if hasattr(nvidia.nccl, '__file__') and nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
  [ -n "$nccl_root" ] && [ ! -f "$nccl_root/include/nccl_device.h" ] && nccl_root=""
  cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPMOE_BUILD_PYTHON=ON -DEPMOE_ENABLE_TESTS=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" ${nccl_root:+-DEPMOE_NCCL_ROOT="$nccl_root"} > "$out/build_py.log" 2>&1 &&
    cmake --build build-py -j "$(nproc)" --target epmoe_python >> "$out/build_py.log" 2>&1
  rc=$?
  echo "- Python extension build: $([ $rc -eq 0 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s (NCCL: ${nccl_root:-system})" >> "$summary"
  if [ $rc -eq 0 ] && [ $run_tests -eq 1 ]; then
    PYTHONPATH=build-py/python timeout ${EPMOE_PYTEST_TIMEOUT:-900} python3 -m pytest -q -rs python/tests \
      > "$out/pytest.log" 2>&1
    echo "- Python tests: $(tail -1 "$out/pytest.log")" >> "$summary"
    grep -E '^(FAILED|ERROR)' "$out/pytest.log" | head -20 | sed 's/^/  - /' >> "$summary"
    # One process per GPU from Python (issue 18): torchrun over every GPU, the communicator made
    # through torch.distributed, then adopted from the process group.
    ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
    if [ "$ngpu" -ge 2 ] && command -v torchrun >/dev/null 2>&1; then
      for extra in "" "--comm-ptr"; do
        PYTHONPATH=build-py/python timeout 600 torchrun --standalone --nproc-per-node "$ngpu" \
          examples/python/torchrun_ep.py $extra > "$out/torchrun${extra:+_adopt}.log" 2>&1
        echo "- torchrun_ep.py $extra on $ngpu GPUs: exit $? ($(tail -1 "$out/torchrun${extra:+_adopt}.log"))" >> "$summary"
      done
    fi
  elif [ $rc -ne 0 ]; then
    tail -30 "$out/build_py.log"
  fi
  # The Python front end's overhead against the same forward from C++ (python -m epmoe.bench).
  if [ $rc -eq 0 ]; then
    for b in "${pybenches[@]}"; do
      echo "## python -m epmoe.bench $b" >> "$summary"
      PYTHONPATH=build-py/python timeout 300 python3 -m epmoe.bench $b > "$out/pybench.log" 2>&1
      echo "(exit $?)" >> "$out/pybench.log"
      sed 's/^/    /' "$out/pybench.log" | tail -30 >> "$summary"
    done
  fi
fi

if [ $run_bench -eq 1 ]; then
  for b in "${benches[@]}"; do
    name=$(echo "$b" | tr ' /' '__' | tr -cd 'A-Za-z0-9_.-')
    echo "## bench $b" >> "$summary"
    timeout 300 ./build-gpu/epmoe bench $b > "$out/bench_$name.log" 2>&1
    echo "(exit $?)" >> "$out/bench_$name.log"
    sed 's/^/    /' "$out/bench_$name.log" | tail -60 >> "$summary"
  done
fi

# PyTorch's own grouped GEMMs on the same shapes, routing and floor (needs only python3 + torch).
for b in "${torchbenches[@]}"; do
  name=$(echo "$b" | tr ' /' '__' | tr -cd 'A-Za-z0-9_.-')
  echo "## torch bench $b" >> "$summary"
  timeout 300 python3 bench/torch_grouped_mm.py $b > "$out/torch_bench_$name.log" 2>&1
  echo "(exit $?)" >> "$out/torch_bench_$name.log"
  grep -v '^\[torch bench\]' "$out/torch_bench_$name.log" | sed 's/^/    /' | tail -200 >> "$summary"
done
cat "$summary"
