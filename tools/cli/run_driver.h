// The one driver of `epmoe run`: the same stack of layers, float64 check and table on the CPU
// (ranks as threads of this process), on one GPU (R = 1) and on many (a thread per GPU, or one
// process per GPU under mpirun). Every rank builds only its own experts (harness/synthetic.h).
#pragma once
#include "setup.h"

namespace epmoe::cli {

// Runs every row of `s` that `k` (check_setup) leaves runnable and prints the table (rank 0).
// Returns the exit code: 0 all rows ran with finite outputs, 1 a row's outputs were NaN/Inf,
// 2 a row was refused by the check.
int run_driver(const RunSetup& s, const SetupCheck& k);

}  // namespace epmoe::cli
