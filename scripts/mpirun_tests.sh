#!/usr/bin/env bash
# The multi-GPU tests with one process per GPU: mpirun -np N epmoe_gpu_tests on the multi-GPU
# suites (each process holds one rank and checks its own results; tests/common/gpu_ranks.h).
#   scripts/mpirun_tests.sh <epmoe_gpu_tests binary> [N]
# Exit 77 (CTest: skipped) when there is no Open MPI mpirun or fewer than N GPUs, with the reason.
set -uo pipefail
bin=$1
np=${2:-2}
command -v mpirun >/dev/null 2>&1 || { echo "skipped: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
mpirun --version 2>&1 | grep -q "Open MPI" || { echo "skipped: mpirun is not Open MPI"; exit 77; }
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge "$np" ] || { echo "skipped: needs $np GPUs, this machine has $ngpu"; exit 77; }
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export EPMOE_JOB_ID="mpirun-tests-$$"
exec mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE -x EPMOE_JOB_ID \
  "$bin" --gtest_filter='NcclNvlink*:NvlinkDispatch*:LayerMultiGpu*'
