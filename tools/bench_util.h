// Helpers shared by the GPU drivers of the `epmoe` tool (run on several GPUs, bench layer): list
// parsing, medians, a host thread pool for the float64 references, and the two ways of starting
// the ranks of a multi-GPU job (one process with a thread per GPU, or one process per GPU under
// mpirun) behind one call, plus the small collectives the drivers need to report from rank 0.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/format.h"
#include "epmoe/presets.h"

namespace epmoe::cli {

// Median (upper middle for even sizes); 0 for an empty list.
double median(std::vector<double> v);

// "a,b,c" -> {"a", "b", "c"}; throws UsageError naming --flag for an empty item.
std::vector<std::string> split_list(const std::string& text, const std::string& flag);
// Presets named by --preset: one name, a comma list, or "all" (every model preset; "tiny" is the
// test shape and only runs when named). Throws UsageError for an unknown name.
std::vector<const ModelPreset*> parse_presets(const std::string& list);
// "bf16,fp8" -> formats; throws UsageError naming --flag and the unknown item.
std::vector<ActFormat> parse_act_formats(const std::string& text, const std::string& flag);

// The weight format of the same family as a dispatch format (bf16 -> bf16, fp8 -> fp8, ...).
WeightFormat weight_family(ActFormat f);

// Runs fn(i) for i in [0, n) on up to `threads` host threads (the calling one included); the
// first exception is rethrown after every worker has stopped.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

// Host threads one rank may use for its CPU work when `ranks_in_process` ranks share the machine.
int host_threads_per_rank(int ranks_in_process);

// ---- multi-GPU launch (CUDA + NCCL builds) -------------------------------------------------------
// True under Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE set).
bool under_mpirun();
// Ranks a GPU job gets by default: the mpirun world size, else the number of visible GPUs (0 when
// no GPU is usable).
int default_gpu_ranks();
// Ranks that live in this process: 1 under mpirun, else `num_ranks`.
int ranks_in_this_process(int num_ranks);
// True in the process that holds rank 0 (the one that prints): always outside mpirun.
bool rank0_process();

// Starts `num_ranks` GPU ranks and calls fn(comm) once per rank, with that rank's device current:
//   - under mpirun: this process is one rank (make_nccl_comm_from_env); the world size must be
//     num_ranks;
//   - else num_ranks == 1: a "local" CUDA communicator on GPU 0;
//   - else a thread per GPU 0..num_ranks-1 (make_nccl_group + run_ranks).
// Throws UsageError when there are fewer GPUs than ranks, or when this build has no NCCL and
// num_ranks > 1.
void launch_gpu_ranks(int num_ranks, int timeout_ms, const std::function<void(Communicator&)>& fn);

// Collective: every rank passes `mine` (the same length on every rank); returns all ranks' vectors
// concatenated in rank order. Over NCCL for "nccl" communicators; size-1 groups return `mine`.
std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine);

}  // namespace epmoe::cli
