#!/usr/bin/env bash
# On a machine with 2 (or N) GPUs: the one-process-per-GPU launch mode of the epmoe tool.
# Runs, under Open MPI's mpirun,
#   epmoe run                   (qwen3-30b-a3b stack, nvlink + cuda, accuracy table + tokens/s per GPU)
#   epmoe bench layer --quick   (DeepSeek-V3 shapes, 128 and 4096 tokens per rank)
#   epmoe bench layer --quick --dispatcher nccl --formats fp8   (the host-driven dispatcher)
#   epmoe bench a2a --quick --formats fp8   (both dispatchers; the copy-engine ceiling through CUDA IPC)
# and prints their output. Exits non-zero when mpirun is missing, when it is not Open MPI (the
# ranks find each other through OMPI_COMM_WORLD_*), when there are too few GPUs, or when a run fails.
#   scripts/mpirun_check.sh [NP]      (default 2; builds build-gpu/epmoe when it is missing)
set -uo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}

die() { echo "mpirun_check: FAILED: $*" >&2; exit 1; }

command -v mpirun >/dev/null 2>&1 ||
  die "mpirun not found in PATH; install Open MPI (e.g. apt-get install openmpi-bin) and retry"
mpirun --version 2>&1 | grep -q "Open MPI" ||
  die "mpirun is not Open MPI ($(mpirun --version 2>&1 | head -1)); epmoe reads OMPI_COMM_WORLD_RANK/SIZE"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver on this machine"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge "$np" ] || die "needs $np GPUs, this machine has $ngpu"

# NVLink multicast stays off in every process.
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ ! -x build-gpu/epmoe ]; then
  echo "== building build-gpu/epmoe"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release ${EPMOE_CMAKE_ARGS:-} > /tmp/mpirun_check_build.log 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target epmoe_cli >> /tmp/mpirun_check_build.log 2>&1 ||
    { tail -30 /tmp/mpirun_check_build.log; die "build failed (log: /tmp/mpirun_check_build.log)"; }
fi

# --bind-to none: each rank uses several host threads for its float64 reference.
mpi=(mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE -x EPMOE_JOB_ID)
failed=0
run() {  # run <name> <epmoe args...>
  local name=$1; shift
  export EPMOE_JOB_ID="mpirun-check-$$-$name"  # the NCCL id file of this job, unique per run
  echo
  echo "== mpirun -np $np build-gpu/epmoe $*"
  local t0=$(date +%s)
  timeout 900 "${mpi[@]}" build-gpu/epmoe "$@"
  local rc=$?
  echo "== exit $rc after $(( $(date +%s) - t0 )) s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
run run run
run bench bench layer --quick
# The host-driven dispatcher across processes (the path that also runs across nodes).
run nccl bench layer --quick --dispatcher nccl --formats fp8
run a2a bench a2a --quick --formats fp8

echo
if [ "$failed" -ne 0 ]; then die "$failed of 4 mpirun runs failed (see above)"; fi
echo "mpirun_check: all 4 runs passed under mpirun -np $np"
