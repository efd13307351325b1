// Host pieces shared by the GPU all-to-all dispatchers ("nccl" and "nvlink"): the placement on the
// device, the limits of their kernels (a DispatcherInfo::check hook, so that validate() reports
// them), the group checks of their constructors and the sync both expose.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "dispatch/a2a/types.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/error.h"

namespace epmoe::detail {

// The placement of cfg on the device.
class DevicePlacement {
 public:
  explicit DevicePlacement(const MoeConfig& cfg) {
    const ExpertPlacement p = cfg.resolved_placement();
    dev_.num_ranks = p.num_ranks();
    dev_.num_experts = p.num_experts();
    dev_.slots_per_rank = p.slots_per_rank();
    dev_.contiguous = p.is_contiguous() ? 1 : 0;
    const ExpertPlacement::Flat f = p.flatten();
    upload(offsets_, f.offsets);
    upload(ranks_, f.ranks);
    upload(slots_, f.slots);
    dev_.offsets = offsets_.get<int32_t>();
    dev_.ranks = ranks_.get<int32_t>();
    dev_.slots = slots_.get<int32_t>();
  }
  const a2a::DevPlacement& get() const { return dev_; }

 private:
  static void upload(cuda::DeviceBuffer& b, const std::vector<int32_t>& v) {
    b.reserve(std::max<size_t>(4, v.size() * 4));
    if (!v.empty()) EPMOE_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  cuda::DeviceBuffer offsets_, ranks_, slots_;
  a2a::DevPlacement dev_;
};

// The limits of the GPU all-to-all kernels (ranks in a 32-bit mask, one lane per k, 16-byte
// stores): the DispatcherInfo::check of "nccl" and "nvlink".
inline void a2a_config_issues(const MoeConfig& cfg, std::vector<ConfigIssue>& issues) {
  if (cfg.num_ranks > a2a::kMaxRanks)
    issues.push_back({"num_ranks", std::to_string(cfg.num_ranks),
                      "num_ranks=" + std::to_string(cfg.num_ranks) + " exceeds the " + std::to_string(a2a::kMaxRanks) +
                          " ranks the GPU dispatchers support; use the cpu dispatcher or fewer ranks"});
  if (cfg.top_k > a2a::kMaxTopK)
    issues.push_back({"top_k", std::to_string(cfg.top_k),
                      "top_k=" + std::to_string(cfg.top_k) + " exceeds " + std::to_string(a2a::kMaxTopK) +
                          ", the most the GPU dispatchers carry (one lane per k); use a smaller top_k"});
  if (cfg.hidden >= 1 && cfg.hidden % 8 != 0)
    issues.push_back({"hidden", std::to_string(cfg.hidden),
                      "hidden=" + std::to_string(cfg.hidden) +
                          " is not a multiple of 8, which the GPU dispatchers' 16-byte stores need; use a hidden "
                          "size that is"});
}

// What a GPU dispatcher's constructor checks: the configuration (validate(), which runs the
// backend's check hook) and that the group is the one it describes. Throws UsageError naming
// `who`, the field and the fix.
inline void check_gpu_a2a_config(const MoeConfig& cfg, int comm_size, int comm_rank, const char* who) {
  validate_or_throw(cfg);
  if (cfg.num_ranks != comm_size)
    throw UsageError(std::string(who) + ": num_ranks=" + std::to_string(cfg.num_ranks) +
                     " differs from the communicator's size " + std::to_string(comm_size) +
                     "; set num_ranks to the group size");
  if (comm_rank < 0 || comm_rank >= comm_size)
    throw UsageError(std::string(who) + ": rank=" + std::to_string(comm_rank) + " is outside the group of " +
                     std::to_string(comm_size));
}

// CTAs for the plan/pack kernels of T tokens: about 256 tokens each, at most `max_ctas`.
inline int plan_ctas(int64_t T, int max_ctas) {
  const int64_t g = (T + 255) / 256;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(g, max_ctas)));
}

// A GPU all-to-all dispatcher: its calls return before the device finishes, and errors its kernels
// or NCCL find surface later; sync waits for the last call on `stream` (bounded) and raises them.
class GpuA2aDispatcher : public Dispatcher {
 public:
  virtual void sync(void* stream) = 0;
};

// sync for "nccl" and "nvlink" dispatchers; no-op for others.
inline void gpu_dispatcher_sync(Dispatcher& d, void* stream) {
  if (auto* g = dynamic_cast<GpuA2aDispatcher*>(&d)) g->sync(stream);
}

}  // namespace epmoe::detail
