// Starting the ranks of a multi-GPU job, for the tools and the GPU tests: one process with a thread
// per GPU, or one process per GPU under Open MPI's mpirun, behind one call; where this process
// stands in the job (env::mpi_launch is the one MPI detection); and the small result exchange the
// drivers need to report from rank 0. Not part of the public API: a library user brings their own
// ranks (make_nccl_comm, adopt_nccl_comm).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "epmoe/comm.h"

namespace epmoe {

// True under Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE set).
bool under_mpirun();
// CUDA devices this process sees; 0 without a usable GPU or in a build without CUDA.
int visible_gpus();
// Ranks a GPU job gets by default: the mpirun world size, else the number of visible GPUs (0 when
// no GPU is usable).
int default_gpu_ranks();
// Ranks that live in this process: 1 under mpirun, else `num_ranks`.
int ranks_in_this_process(int num_ranks);
// True when rank `rank`'s results are in this process: always outside mpirun.
bool rank_in_this_process(int rank);
// True in the process that holds rank 0 (the one that prints).
inline bool rank0_process() { return rank_in_this_process(0); }
// Host threads one rank may use for its CPU work when `ranks_in_process` ranks share the machine
// (under mpirun the other ranks of this node are processes of their own and count too).
int host_threads_per_rank(int ranks_in_process);

// This process's communicators of a `num_ranks`-rank "nccl" group: under mpirun its one rank
// (make_nccl_comm_from_env; every process must create its groups in the same order), else one per
// GPU 0..num_ranks-1 (make_nccl_group; use with run_ranks). Throws UsageError when the mpirun world
// size is not num_ranks, or when this build has no NCCL.
std::vector<std::unique_ptr<Communicator>> nccl_ranks_of_this_process(int num_ranks, int timeout_ms);

// Starts `num_ranks` GPU ranks and calls fn(comm) once per rank, with that rank's device current:
//   - under mpirun: this process is one rank (make_nccl_comm_from_env); the world size must be
//     num_ranks;
//   - else num_ranks == 1: a "local" CUDA communicator on GPU 0;
//   - else a thread per GPU 0..num_ranks-1 (make_nccl_group + run_ranks).
// Throws UsageError when there are fewer GPUs than ranks, or when this build has no NCCL and
// num_ranks > 1.
void launch_gpu_ranks(int num_ranks, int timeout_ms, const std::function<void(Communicator&)>& fn);

// Collective: every rank passes `mine` (the same length on every rank); returns all ranks' vectors
// concatenated in rank order. Over NCCL for "nccl" communicators, waiting at most 5 minutes (a
// rank that never arrives is reported as a TimeoutError instead of hanging the job); size-1 groups
// return `mine`.
std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine);

}  // namespace epmoe
