// Host helpers shared by the "nccl" and "nvlink" dispatchers.
#pragma once
#include <cstdint>
#include <memory>
#include <algorithm>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "dispatch/nccl/a2a_types.h"
#include "epmoe/comm.h"
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

// What the GPU all-to-all kernels need beyond validate(): throws UsageError naming the field.
inline void check_gpu_a2a_config(const MoeConfig& cfg, int comm_size, int comm_rank, const char* who) {
  validate_or_throw(cfg);
  auto fail = [&](const std::string& field, const std::string& value, const std::string& why) {
    throw UsageError(std::string(who) + ": " + field + "=" + value + " " + why);
  };
  if (cfg.num_ranks != comm_size)
    fail("num_ranks", std::to_string(cfg.num_ranks),
         "differs from the communicator's size " + std::to_string(comm_size) + "; set num_ranks to the group size");
  if (comm_rank < 0 || comm_rank >= comm_size) fail("rank", std::to_string(comm_rank), "is outside the group");
  if (cfg.num_ranks > a2a::kMaxRanks)
    fail("num_ranks", std::to_string(cfg.num_ranks),
         "exceeds the " + std::to_string(a2a::kMaxRanks) + " ranks the GPU dispatchers support; use the cpu dispatcher or fewer ranks");
  if (cfg.top_k > a2a::kMaxTopK)
    fail("top_k", std::to_string(cfg.top_k), "exceeds " + std::to_string(a2a::kMaxTopK) + " (one lane per k)");
  if (cfg.hidden % 8 != 0)
    fail("hidden", std::to_string(cfg.hidden), "is not a multiple of 8, which the GPU dispatchers' 16-byte stores need");
  if (cfg.combine_format != ActFormat::bf16 && cfg.combine_format != ActFormat::fp8)
    fail("combine_format", format_name(cfg.combine_format), "is not supported; use bf16 or fp8");
}

inline std::string bad_id_problem(int64_t t, int k, int id, int E) {
  return "topk_ids[token " + std::to_string(t) + ", k " + std::to_string(k) + "] = " + std::to_string(id) +
         " is outside [-1, E=" + std::to_string(E) + "); pass expert ids in [0, " + std::to_string(E) + ") or -1 for none";
}

inline std::string capacity_problem(int64_t T, int C) {
  return "T=" + std::to_string(T) + " tokens exceeds capacity C=" + std::to_string(C) +
         "; raise MoeConfig::capacity (--capacity)";
}

// CTAs for the plan/pack kernels of T tokens: about 256 tokens each, at most `max_ctas`.
inline int plan_ctas(int64_t T, int max_ctas) {
  const int64_t g = (T + 255) / 256;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(g, max_ctas)));
}

// Factories (register.cpp).
std::unique_ptr<Dispatcher> make_nccl_dispatcher(const MoeConfig& cfg, Communicator& comm);
std::unique_ptr<Dispatcher> make_nvlink_dispatcher(const MoeConfig& cfg, Communicator& comm);

// Waits for the last call of a GPU dispatcher ("nccl" or "nvlink") on `stream` and raises any error
// its kernels recorded (nvlink reports bad ids and missing peers asynchronously). No-op for others.
void gpu_dispatcher_sync(Dispatcher& d, void* stream);
void nccl_dispatcher_sync(Dispatcher& d, void* stream);   // nccl_dispatcher.cu
void nvlink_dispatcher_sync(Dispatcher& d, void* stream); // nvlink/nvlink_dispatcher.cu


}  // namespace epmoe::detail
