// The "local" dispatcher on a CUDA device (R = 1): no communication, but the same DispatchOutput
// layout as every other dispatcher, built entirely on the device without host synchronization so
// that a whole layer step can be captured in a CUDA graph.
//
// Out-of-range ids cannot be checked on the host without a synchronization. They are caught on
// the device instead: such an id is treated as -1 (nothing out of bounds is ever read or written)
// and the first one is recorded in pinned host memory; the next dispatch() call, or
// check_errors(), throws the UsageError naming token, k and id.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/cuda/check.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"

namespace epmoe::cuda {

// The limits of this dispatcher beyond validate() (one rank, 16-byte bf16 rows): its
// DispatcherInfo::check.
void local_dispatcher_issues(const MoeConfig& cfg, std::vector<ConfigIssue>& issues);

class LocalCudaDispatcher final : public Dispatcher {
 public:
  // Throws UsageError listing every issue of validate(cfg).
  LocalCudaDispatcher(const MoeConfig& cfg, int device_index);
  ~LocalCudaDispatcher() override;
  const char* name() const override { return "local"; }
  DispatchOutput dispatch(const DispatchInput& in) override;
  void combine(const CombineInput& in, bf16_raw* out) override;

  // Throws the UsageError for a bad id seen by an earlier dispatch (sync: wait for the device
  // first, so that every launched dispatch has been checked).
  void check_errors(bool sync);

 private:
  struct ErrorRecord {
    int32_t flag, token, k, id;
  };
  MoeConfig cfg_;
  int device_ = 0;
  int E_loc_ = 0;
  int64_t last_T_ = -1;
  DeviceBuffer payload_, scales_, ids_, weights_, counts_, expert_counts_, prev_n_;
  DeviceBuffer slot_of_token_, token_of_slot_;
  DeviceBuffer place_offsets_, place_ranks_, place_slots_;
  ErrorRecord* err_host_ = nullptr;  // pinned, mapped
  ErrorRecord* err_dev_ = nullptr;
};

// Combine for one rank's own tokens (R = 1), exposed for tests: out[t] = bf16(0.f + v) where v is
// row slot_of_token[t] of y (through the fp8 round trip when f is fp8), or +0 for slot -1. f is a
// combine format validate() accepts.
void combine_local(ActFormat f, const QuantParams& p, const bf16_raw* y, const int32_t* slot_of_token, int64_t T,
                   int H, bf16_raw* out, cudaStream_t stream);

}  // namespace epmoe::cuda
