// Multi-GPU tests run two ways: a thread per GPU in one process (plain ctest), or one process per
// GPU under `mpirun -np R` (ctest's `mpirun.multi_gpu`, scripts/mpirun_tests.sh), where each
// process holds one rank and checks only that rank's results. These helpers hide which.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/nccl_comm.h"

namespace epmoe::test {

inline bool tests_under_mpirun() { return launched_under_mpi(); }

inline int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// GPU ranks a test can have: the mpirun world (when every process sees a GPU), else the GPUs.
inline int gpu_ranks_available() {
  if (!tests_under_mpirun()) return visible_gpus();
  return visible_gpus() > 0 ? std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) : 0;
}

// R ranks: all of them on GPUs 0..R-1 (threads; use with run_ranks), or, under mpirun, this
// process's rank only (the world size must be R; every process creates its groups in the same
// order, which the tests do by running the same test list).
inline std::vector<std::unique_ptr<Communicator>> gpu_group(int R, int timeout_ms) {
  if (tests_under_mpirun()) {
    std::vector<std::unique_ptr<Communicator>> one;
    one.push_back(make_nccl_comm_from_env(timeout_ms));
    return one;
  }
  std::vector<int> devs(R);
  for (int r = 0; r < R; ++r) devs[r] = r;
  return make_nccl_group(devs, timeout_ms);
}

// True when rank r's results are in this process (always, outside mpirun).
inline bool is_local_rank(int r) {
  if (!tests_under_mpirun()) return true;
  return std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) == r;
}

}  // namespace epmoe::test
