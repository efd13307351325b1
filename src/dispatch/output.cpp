#include "dispatch/output.h"

namespace epmoe::detail {

RecvShape recv_shape(const MoeConfig& cfg) {
  RecvShape s;
  s.num_ranks = cfg.num_ranks;
  s.capacity = cfg.capacity;
  s.hidden = cfg.hidden;
  s.top_k = cfg.top_k;
  s.num_local_experts = cfg.experts_per_rank();
  s.format = cfg.dispatch_format;
  s.quant = cfg.quant_params();
  return s;
}

DispatchOutput make_dispatch_output(const RecvShape& shape, DeviceKind device, const RecvBuffers& bufs) {
  DispatchOutput o;
  o.num_ranks = shape.num_ranks;
  o.capacity = shape.capacity;
  o.hidden = shape.hidden;
  o.top_k = shape.top_k;
  o.num_local_experts = shape.num_local_experts;
  o.format = shape.format;
  o.quant = shape.quant;
  o.device = device;
  o.payload = bufs.payload;
  o.scales = scale_bytes(shape.format, shape.hidden) > 0 ? bufs.scales : nullptr;
  o.local_ids = bufs.local_ids;
  o.weights = bufs.weights;
  o.counts = bufs.counts;
  o.expert_counts = bufs.expert_counts;
  return o;
}

}  // namespace epmoe::detail
