// The result exchange of launch.h over an "nccl" communicator, bounded by the communicator's own wait.
#include <algorithm>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "comm/nccl/nccl_comm_impl.h"
#include "core/cuda/check.h"
#include "epmoe/error.h"

namespace epmoe {

namespace {
// Long enough for a peer that is still computing its part of a large reference; short enough that
// a rank that never arrives is reported instead of hanging the job.
constexpr int kAllgatherTimeoutMs = 5 * 60 * 1000;
}  // namespace

std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine) {
  if (comm.size() == 1) return mine;
  detail::NcclComm& nc = detail::as_nccl(comm, "allgather");
  const auto dev = nc.activate();
  const int R = comm.size();
  const size_t n = mine.size();
  struct Buffers {
    void* send = nullptr;
    void* recv = nullptr;
    bool leak = false;
    ~Buffers() {
      if (leak) return;
      cudaFree(send);
      cudaFree(recv);
    }
  } b;
  EPMOE_CUDA_CHECK(cudaMalloc(&b.send, std::max<size_t>(n, 1) * 8));
  EPMOE_CUDA_CHECK(cudaMalloc(&b.recv, std::max<size_t>(n * R, 1) * 8));
  const cudaStream_t st = nc.stream();
  // The upload goes on the collective's stream itself: a legacy-stream cudaMemcpy from pageable
  // memory may return before its DMA lands, and a non-blocking stream does not wait for it, so NCCL
  // could read the tail of a large buffer (beyond the first ~2 MB staging chunk) before it is
  // written.
  if (n) EPMOE_CUDA_CHECK(cudaMemcpyAsync(b.send, mine.data(), n * 8, cudaMemcpyHostToDevice, st));
  EPMOE_NCCL_CHECK(ncclAllGather(b.send, b.recv, n, ncclDouble, nc.handle(), st));
  try {
    nc.wait(st, "allgather (result exchange)", kAllgatherTimeoutMs);
  } catch (...) {
    // A communicator that is not aborted (an adopted one) may still run the collective into these
    // buffers: leak them rather than free (cudaFree would wait for it, the hang this bound avoids).
    if (!nc.owned()) b.leak = true;
    throw;
  }
  std::vector<double> all(n * R);
  if (!all.empty()) {
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(all.data(), b.recv, all.size() * 8, cudaMemcpyDeviceToHost, st));
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  return all;
}

}  // namespace epmoe
