// The one constructor of DispatchOutput: every dispatcher describes its receive buffers with it, so
// that the shape fields always come from the configuration the same way and `scales` is null exactly
// when the format has none.
#pragma once
#include "epmoe/config.h"
#include "epmoe/dispatch.h"

namespace epmoe::detail {

// Where one rank's receive buffers are ([R][C] slots, see DispatchOutput).
struct RecvBuffers {
  const uint8_t* payload = nullptr;
  const uint8_t* scales = nullptr;  // ignored (null in the output) for formats without scales
  const int32_t* local_ids = nullptr;
  const float* weights = nullptr;
  const int32_t* counts = nullptr;
  const int32_t* expert_counts = nullptr;
};

// The shape of a receive layout: R, C, H, K, E_loc, dispatch format and its quantization.
struct RecvShape {
  int num_ranks = 0, capacity = 0, hidden = 0, top_k = 0, num_local_experts = 0;
  ActFormat format = ActFormat::bf16;
  QuantParams quant;
};
RecvShape recv_shape(const MoeConfig& cfg);  // num_ranks = cfg.num_ranks, E_loc = experts_per_rank()

DispatchOutput make_dispatch_output(const RecvShape& shape, DeviceKind device, const RecvBuffers& bufs);
inline DispatchOutput make_dispatch_output(const MoeConfig& cfg, DeviceKind device, const RecvBuffers& bufs) {
  return make_dispatch_output(recv_shape(cfg), device, bufs);
}

}  // namespace epmoe::detail
