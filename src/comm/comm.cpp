// Communicators that need no device: the single-rank one and the cpu group (ranks as threads over
// the shared-memory fabric of cpu_fabric.h).
#include <exception>
#include <string>
#include <thread>

#include "comm/cpu_fabric.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"

namespace epmoe {
namespace {

class LocalComm final : public Communicator {
 public:
  LocalComm(DeviceKind device, int device_index) : device_(device), device_index_(device_index) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "local"; }
  DeviceKind device() const override { return device_; }
  int device_index() const override { return device_index_; }
  // One rank always agrees with itself.
  void check_same(uint64_t, const char*) override {}

 private:
  DeviceKind device_;
  int device_index_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_comm(DeviceKind device, int device_index) {
  if (device_index < 0)
    throw UsageError("make_local_comm: device_index=" + std::to_string(device_index) +
                     " is negative; pass the index of a device (0 for the first)");
  return std::make_unique<LocalComm>(device, device_index);
}

std::vector<std::unique_ptr<Communicator>> make_cpu_group(int num_ranks, int timeout_ms) {
  if (num_ranks < 1)
    throw UsageError("make_cpu_group: num_ranks=" + std::to_string(num_ranks) + " must be at least 1");
  if (timeout_ms <= 0)
    throw UsageError("make_cpu_group: timeout_ms=" + std::to_string(timeout_ms) +
                     " must be positive (MoeConfig::timeout_ms, --timeout-ms)");
  auto fabric = std::make_shared<detail::CpuFabric>(num_ranks, timeout_ms);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(num_ranks);
  for (int r = 0; r < num_ranks; ++r) comms.push_back(std::make_unique<detail::CpuComm>(fabric, r));
  return comms;
}

void run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
               const std::function<void(Communicator&)>& fn) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // A rank that fails leaves its peers waiting, and they time out; the timeout is a consequence, so
  // the lowest rank's other error is the one worth reporting.
  std::exception_ptr first, first_cause;
  for (auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    if (!first_cause) {
      try {
        std::rethrow_exception(e);
      } catch (const TimeoutError&) {
      } catch (...) {
        first_cause = e;
      }
    }
  }
  if (first_cause) std::rethrow_exception(first_cause);
  if (first) std::rethrow_exception(first);
}

}  // namespace epmoe
