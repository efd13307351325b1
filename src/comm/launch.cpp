// Rank launching and where this process stands in the job (launch.h). The result exchange needs the
// NCCL communicator's internals and lives in nccl/allgather.cpp; a build without NCCL gets the stub
// at the end of this file.
#include "comm/launch.h"

#include <algorithm>
#include <string>
#include <thread>

#include "core/env.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUDA)
#include "core/cuda/check.h"
#endif
#if defined(EPMOE_WITH_NCCL)
#include "epmoe/nccl_comm.h"
#endif

namespace epmoe {

bool under_mpirun() { return env::mpi_launch().has_value(); }

int visible_gpus() {
#if defined(EPMOE_WITH_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

int default_gpu_ranks() {
  if (const auto mpi = env::mpi_launch()) return std::max(1, mpi->size);
  return visible_gpus();
}

int ranks_in_this_process(int num_ranks) { return under_mpirun() ? 1 : num_ranks; }

bool rank_in_this_process(int rank) {
  const auto mpi = env::mpi_launch();
  return !mpi || mpi->rank == rank;
}

int host_threads_per_rank(int ranks_in_process) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  int sharing = std::max(1, ranks_in_process);
  if (const auto mpi = env::mpi_launch()) sharing = std::max(sharing, mpi->local_size);
  return std::max(1, hw / sharing);
}

namespace {

void check_world_size(int num_ranks) {
  const auto mpi = env::mpi_launch();
  if (mpi && mpi->size != num_ranks)
    throw UsageError("ranks=" + std::to_string(num_ranks) + " but mpirun started " + std::to_string(mpi->size) +
                     " processes; leave --ranks out or pass mpirun -np " + std::to_string(num_ranks));
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> nccl_ranks_of_this_process(int num_ranks, int timeout_ms) {
#if defined(EPMOE_WITH_NCCL)
  if (num_ranks < 1) throw UsageError("ranks=" + std::to_string(num_ranks) + " must be at least 1");
  check_world_size(num_ranks);
  if (under_mpirun()) {
    std::vector<std::unique_ptr<Communicator>> one;
    one.push_back(make_nccl_comm_from_env(timeout_ms));
    return one;
  }
  std::vector<int> devs(num_ranks);
  for (int r = 0; r < num_ranks; ++r) devs[r] = r;
  return make_nccl_group(devs, timeout_ms);
#else
  (void)timeout_ms;
  throw UsageError("ranks=" + std::to_string(num_ranks) + " need NCCL, which this build does not have");
#endif
}

void launch_gpu_ranks(int num_ranks, int timeout_ms, const std::function<void(Communicator&)>& fn) {
#if defined(EPMOE_WITH_CUDA)
  if (num_ranks < 1) throw UsageError("ranks=" + std::to_string(num_ranks) + " must be at least 1");
  const int ngpu = visible_gpus();
  if (under_mpirun()) {
#if defined(EPMOE_WITH_NCCL)
    check_world_size(num_ranks);
    if (ngpu < 1) throw UsageError("this process sees no GPU; each mpirun rank needs one");
    auto comms = nccl_ranks_of_this_process(num_ranks, timeout_ms);
    EPMOE_CUDA_CHECK(cudaSetDevice(comms[0]->device_index()));
    fn(*comms[0]);
    return;
#else
    throw UsageError("this build has no NCCL, so it cannot run one process per GPU under mpirun");
#endif
  }
  if (ngpu < num_ranks)
    throw UsageError("ranks=" + std::to_string(num_ranks) + " needs " + std::to_string(num_ranks) +
                     " GPUs but this machine shows " + std::to_string(ngpu) + "; use --ranks " +
                     std::to_string(std::max(1, ngpu)) + " or a larger machine");
  if (num_ranks == 1) {
    EPMOE_CUDA_CHECK(cudaSetDevice(0));
    auto comm = make_local_comm(DeviceKind::cuda, 0);
    fn(*comm);
    return;
  }
#if defined(EPMOE_WITH_NCCL)
  auto comms = nccl_ranks_of_this_process(num_ranks, timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    EPMOE_CUDA_CHECK(cudaSetDevice(comm.device_index()));
    fn(comm);
  });
#else
  throw UsageError("ranks=" + std::to_string(num_ranks) + " needs NCCL, which this build does not have; use --ranks 1");
#endif
#else
  (void)num_ranks;
  (void)timeout_ms;
  (void)fn;
  throw UsageError("this build has no CUDA; GPU ranks are not available");
#endif
}

#if !defined(EPMOE_WITH_NCCL)

std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine) {
  if (comm.size() == 1) return mine;
  throw UsageError(std::string("allgather: communicator kind '") + comm.kind() + "' needs NCCL");
}

#endif

}  // namespace epmoe
