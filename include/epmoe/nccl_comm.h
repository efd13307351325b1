// Communicators over NCCL (kind "nccl", device cuda): one GPU per rank. Three ways to get a group:
//   - make_nccl_group: one process drives all local GPUs, one thread per GPU (use with run_ranks);
//   - make_nccl_comm: one process per GPU, the caller hands in an ncclUniqueId (from rank 0, sent by
//     whatever the caller already has: torch.distributed, MPI, a file); make_nccl_comm_from_env does
//     this by itself under mpirun (see docs/COMM.md for the file-based id exchange);
//   - adopt_nccl_comm: wrap an ncclComm_t the caller already owns (PyTorch's process group, a
//     serving framework); epmoe uses it but never destroys it.
// Every constructor sets NCCL_NVLS_ENABLE=0 before NCCL initialises (NVLink multicast stays off) and
// checks that the NCCL library found at run time is the one the library was compiled against (the
// device API is header-inlined, so a mismatch would corrupt memory rather than fail).
// Only available in builds with NCCL (EPMOE_WITH_NCCL).
#pragma once
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "epmoe/comm.h"

namespace epmoe {

// One communicator per entry of `devices` (CUDA device indices, all different); rank r drives
// devices[r]. `timeout_ms` bounds every host-side wait on a collective (check_same, dispatch
// exchanges); a dispatcher may use MoeConfig::timeout_ms instead for its own waits.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::vector<int> devices, int timeout_ms = 10000);

// A fresh id (call on one rank and hand it to all others).
ncclUniqueId make_nccl_unique_id();

// Rank `rank` of `nranks`, on CUDA device `device`. Collective: blocks until every rank has called it.
std::unique_ptr<Communicator> make_nccl_comm(const ncclUniqueId& id, int rank, int nranks, int device,
                                             int timeout_ms = 10000);

// Adopts `comm`, a communicator the caller created (ncclCommInitRank/InitAll/Split) and keeps
// owning, as an epmoe Communicator of kind "nccl". Rank and size are NCCL's (ncclCommUserRank,
// ncclCommCount), the CUDA device is the one the communicator was created on (ncclCommCuDevice).
// Everything that works on a group made by epmoe works on it: check_same, MoeLayer, the "nccl" and
// "nvlink" dispatchers, nccl_handle. Ownership:
//   - destroying the returned Communicator never calls ncclCommDestroy or ncclCommAbort on `comm`;
//     the caller destroys `comm`, after every epmoe object using it (dispatchers, layers, this
//     Communicator) is gone;
//   - the caller must not run its own collectives on `comm` concurrently with epmoe's (NCCL
//     requires one order of collectives per communicator across ranks);
//   - after a TimeoutError epmoe leaves `comm` as it is (broken for epmoe: later calls fail at
//     once); a collective of epmoe's may still be pending on it, so the caller should
//     ncclCommAbort it rather than destroy it.
// NCCL_NVLS_ENABLE=0 is set here too, but only takes effect for communicators created afterwards:
// create `comm` with NCCL_NVLS_ENABLE=0 in the environment to keep NVLink multicast off.
// The version check is the same as for the other constructors. Throws UsageError for a null
// `comm`, one still initialising (non-blocking init), or a device this process cannot see;
// BackendError when NCCL reports `comm` in error. Every rank calls it for its own communicator
// (not collective).
std::unique_ptr<Communicator> adopt_nccl_comm(ncclComm_t comm, int timeout_ms = 10000);

// True when the process was started by Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE are set).
bool launched_under_mpi();

// Under mpirun: rank and size from OMPI_COMM_WORLD_RANK/SIZE, the GPU from
// OMPI_COMM_WORLD_LOCAL_RANK, the id exchanged through a file in EPMOE_BOOTSTRAP_DIR (default
// /tmp, must be shared by the ranks of a node) named after the job (EPMOE_JOB_ID, else the PMIx
// namespace or Open MPI job id). No MPI library is linked. Multi-node jobs need a shared
// EPMOE_BOOTSTRAP_DIR. Every rank must create its communicators in the same order (the n-th call
// of each rank meets the n-th of the others). Throws UsageError when not under mpirun or when no
// job id is found.
std::unique_ptr<Communicator> make_nccl_comm_from_env(int timeout_ms = 60000);

// The NCCL communicator behind `comm`, or null when `comm` is not of kind "nccl".
ncclComm_t nccl_handle(Communicator& comm);

// "2.28.9": the NCCL version this build was compiled against and the one loaded at run time.
std::string nccl_compiled_version();
std::string nccl_runtime_version();

}  // namespace epmoe
