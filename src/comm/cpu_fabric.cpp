#include "comm/cpu_fabric.h"

#include <chrono>
#include <cstring>

#include "epmoe/error.h"

namespace epmoe::detail {

CpuFabric::CpuFabric(int num_ranks, int timeout_ms)
    : num_ranks_(num_ranks), timeout_ms_(timeout_ms), arrived_(num_ranks, 0), gathers_(num_ranks, 0) {
  mail_[0].resize(num_ranks);
  mail_[1].resize(num_ranks);
}

void CpuFabric::throw_broken(const char* where) const {
  throw Error("cpu group unusable at " + std::string(where) + ": an earlier collective failed (" +
              broken_ + "); create a new group");
}

void CpuFabric::barrier(int rank, const char* where) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!broken_.empty()) throw_broken(where);
  const uint64_t n = ++arrived_[rank];
  cv_.notify_all();
  auto first_missing = [&]() -> int {
    for (int q = 0; q < num_ranks_; ++q)
      if (arrived_[q] < n) return q;
    return -1;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  while (first_missing() >= 0) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      const int q = first_missing();
      if (q < 0) break;
      std::string msg = "rank " + std::to_string(q) + " did not arrive within " + std::to_string(timeout_ms_) +
                        " ms at " + where;
      // Ranks that arrive after this cannot complete the barrier anymore; they must not wait.
      if (broken_.empty()) broken_ = msg;
      throw TimeoutError(msg + " (seen by rank " + std::to_string(rank) +
                             "; every rank must make the same collective calls in the same order)",
                         q);
    }
  }
}

std::vector<std::string> CpuFabric::all_gather(int rank, std::string msg, const char* where) {
  uint64_t g;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) throw_broken(where);
    g = gathers_[rank]++;
    mail_[g % 2][rank] = std::move(msg);
  }
  barrier(rank, where);
  std::lock_guard<std::mutex> lk(mu_);
  return mail_[g % 2];
}

std::vector<uint64_t> CpuFabric::all_gather_u64(int rank, uint64_t value, const char* where) {
  std::string msg(sizeof value, '\0');
  std::memcpy(msg.data(), &value, sizeof value);
  const std::vector<std::string> all = all_gather(rank, std::move(msg), where);
  std::vector<uint64_t> out(all.size());
  for (size_t i = 0; i < all.size(); ++i) std::memcpy(&out[i], all[i].data(), sizeof(uint64_t));
  return out;
}

void CpuComm::check_same(uint64_t value, const char* what) {
  const std::string where = std::string("check_same/") + what;
  const std::vector<uint64_t> all = fabric_->all_gather_u64(rank_, value, where.c_str());
  std::string differing;
  int n_diff = 0;
  for (size_t q = 1; q < all.size(); ++q) {
    if (all[q] == all[0]) continue;
    differing += (n_diff++ ? ", " : "") + std::to_string(q);
  }
  if (n_diff == 0) return;
  throw UsageError(std::string(what) + " differs between ranks: rank" + (n_diff > 1 ? "s " : " ") + differing +
                   (n_diff > 1 ? " differ" : " differs") + " from rank 0; create every rank with the same " +
                   what);
}

}  // namespace epmoe::detail
