// Communicators: who the ranks of an expert-parallel group are and how they reach each other.
// Backends: "local" (one rank), "cpu" (R ranks as threads of one process, the reference fabric),
// "nccl" (one GPU per rank, see nccl_comm.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "epmoe/tensor.h"

namespace epmoe {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "local", "cpu", "nccl"
  virtual DeviceKind device() const = 0;
  virtual int device_index() const { return 0; }
  // Collective: every rank passes its value; throws UsageError naming the ranks that disagree
  // with rank 0 (`what` says what was compared), or TimeoutError naming a rank that never came.
  virtual void check_same(uint64_t value, const char* what) = 0;
};

// The single-rank communicator (dispatcher "local"). `device` says where that rank's data lives.
std::unique_ptr<Communicator> make_local_comm(DeviceKind device = DeviceKind::cpu, int device_index = 0);

// R ranks as threads in one process: returns one communicator per rank, all sharing one fabric of
// shared-memory mailboxes. `timeout_ms` bounds every wait for a peer.
std::vector<std::unique_ptr<Communicator>> make_cpu_group(int num_ranks, int timeout_ms = 10000);

// Runs fn(comm) on one thread per communicator and joins them. If any rank throws, the lowest
// rank's exception is rethrown after all threads have finished, preferring one that is not a
// TimeoutError: a rank that fails leaves its peers to time out, and the cause is what matters.
void run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
               const std::function<void(Communicator&)>& fn);

}  // namespace epmoe
