// The "nccl" communicator (internal view): the dispatchers reach the NCCL handle, the device and a
// bounded wait through it.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "epmoe/comm.h"

namespace epmoe::detail {

// Throws BackendError naming the call and NCCL's message.
void nccl_check(ncclResult_t r, const char* expr, const char* file, int line);
#define EPMOE_NCCL_CHECK(expr) ::epmoe::detail::nccl_check((expr), #expr, __FILE__, __LINE__)

// setenv NCCL_NVLS_ENABLE=0 and the run-time/compile-time version check; called before any NCCL
// initialisation.
void nccl_preflight();

// `owned`: epmoe created the NCCL communicator and destroys it (or aborts it after a timeout). An
// adopted one (adopt_nccl_comm) is never destroyed or aborted here: it stays the caller's.
class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int device, int timeout_ms, bool owned = true);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }
  DeviceKind device() const override { return DeviceKind::cuda; }
  int device_index() const override { return device_; }
  void check_same(uint64_t value, const char* what) override;

  ncclComm_t handle() const { return comm_; }
  int timeout_ms() const { return timeout_ms_; }
  // Makes this rank's device current on the calling thread until the guard's scope ends (every entry
  // point holds one: the caller's own current device is restored on return).
  cuda::DeviceGuard activate() const { return cuda::DeviceGuard(device_); }
  // The communicator's own stream for small host-side collectives.
  cudaStream_t stream() const { return stream_; }

  // Waits for `stream` to drain, polling NCCL for asynchronous errors. After `timeout_ms` the
  // communicator is marked broken (a later call fails at once), aborted when it is owned, and
  // TimeoutError is thrown; NCCL does not say which peer is missing, so the error names rank -1.
  void wait(cudaStream_t stream, const char* where, int timeout_ms = -1);
  // all_gather of one u64 per rank (a collective on stream()).
  std::vector<uint64_t> all_gather_u64(uint64_t value, const char* where);
  // all_gather of `n` int32 per rank: returns [size][n] on the host.
  std::vector<int32_t> all_gather_i32(const int32_t* host_values, int n, const char* where) {
    return all_gather_i32(host_values, n, where, stream_);
  }
  // The same on `stream` (which may be the legacy default stream, null); waits for it, bounded.
  std::vector<int32_t> all_gather_i32(const int32_t* host_values, int n, const char* where, cudaStream_t stream);
  bool broken() const { return broken_; }
  bool owned() const { return owned_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_, size_, device_, timeout_ms_;
  cudaStream_t stream_ = nullptr;
  void* dev_scratch_ = nullptr;  // small device buffer for all_gather
  size_t dev_scratch_bytes_ = 0;
  bool owned_;
  bool broken_ = false;
};

// The NcclComm behind `c`, or a UsageError naming `who` when c is of another kind.
NcclComm& as_nccl(Communicator& c, const char* who);

}  // namespace epmoe::detail
