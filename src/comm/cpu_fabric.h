// The shared-memory fabric behind the "cpu" communicator: R ranks are threads of one process and
// reach each other through this object. It offers what the CPU dispatcher needs and nothing more:
//   - a barrier whose every wait is bounded by the group's timeout (a TimeoutError names the first
//     rank that did not arrive and where: "rank 2 did not arrive within 10000 ms at dispatch/counts"),
//   - all_gather of small byte messages (mailboxes, one per rank),
//   - nothing else: bulk data moves one-sided, by writing straight into a peer's buffer whose address
//     was exchanged with all_gather (threads share one address space).
// Every collective must be entered by all ranks in the same order; that is what makes one monotone
// arrival counter per rank a correct barrier even for back-to-back calls.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "epmoe/comm.h"

namespace epmoe::detail {

class CpuFabric {
 public:
  CpuFabric(int num_ranks, int timeout_ms);

  int size() const { return num_ranks_; }
  int timeout_ms() const { return timeout_ms_; }

  // Returns once every rank has entered its n-th barrier, n being this rank's own count. Throws
  // TimeoutError naming the lowest missing rank after timeout_ms; after a timeout the group is
  // broken and every later collective throws at once (a peer could otherwise wait forever).
  void barrier(int rank, const char* where);

  // Every rank contributes `msg`; returns all ranks' messages, indexed by rank. One barrier.
  std::vector<std::string> all_gather(int rank, std::string msg, const char* where);
  // Convenience: all_gather of one 64-bit value per rank.
  std::vector<uint64_t> all_gather_u64(int rank, uint64_t value, const char* where);

 private:
  [[noreturn]] void throw_broken(const char* where) const;

  const int num_ranks_;
  const int timeout_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> arrived_;  // barriers entered per rank (monotone)
  // Two mailbox generations: a rank writes generation g % 2 of its all_gather number g. The
  // barrier of call g+1 proves every rank finished reading generation g before g+2 reuses it.
  std::vector<std::string> mail_[2];
  std::vector<uint64_t> gathers_;  // all_gather calls per rank
  std::string broken_;             // set after a timeout: what happened
};

// The communicator of one rank of a cpu group (make_cpu_group). Dispatchers of kind "cpu" reach
// the fabric through it.
class CpuComm final : public Communicator {
 public:
  CpuComm(std::shared_ptr<CpuFabric> fabric, int rank) : fabric_(std::move(fabric)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  const char* kind() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::cpu; }
  void check_same(uint64_t value, const char* what) override;

  CpuFabric& fabric() { return *fabric_; }

 private:
  std::shared_ptr<CpuFabric> fabric_;
  int rank_;
};

}  // namespace epmoe::detail
