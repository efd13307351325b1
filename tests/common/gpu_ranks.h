// Multi-GPU tests run two ways: a thread per GPU in one process (plain ctest), or one process per
// GPU under `mpirun -np R` (ctest's `mpirun.multi_gpu`, scripts/mpirun_tests.sh), where each
// process holds one rank and checks only that rank's results. These helpers hide which; they are
// thin names over the launch helper (src/comm/launch.h) that the tools use too.
#pragma once
#include <memory>
#include <vector>

#include "comm/launch.h"
#include "epmoe/comm.h"

namespace epmoe::test {

inline bool tests_under_mpirun() { return under_mpirun(); }

// GPU ranks a test can have: the mpirun world (when every process sees a GPU), else the GPUs.
inline int gpu_ranks_available() { return visible_gpus() > 0 ? default_gpu_ranks() : 0; }

// R ranks: all of them on GPUs 0..R-1 (threads; use with run_ranks), or, under mpirun, this
// process's rank only (the world size must be R; every process creates its groups in the same
// order, which the tests do by running the same test list).
inline std::vector<std::unique_ptr<Communicator>> gpu_group(int R, int timeout_ms) {
  return nccl_ranks_of_this_process(R, timeout_ms);
}

// True when rank r's results are in this process (always, outside mpirun).
inline bool is_local_rank(int r) { return rank_in_this_process(r); }

}  // namespace epmoe::test
