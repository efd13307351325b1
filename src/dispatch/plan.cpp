#include "dispatch/plan.h"

#include <algorithm>
#include <cstring>

#include "epmoe/quant.h"

namespace epmoe::detail {

void DispatchPlan::translated_row(int64_t t, int d, int32_t* out) const {
  const size_t base = size_t(t) * top_k;
  for (int k = 0; k < top_k; ++k) out[k] = copy_rank[base + k] == d ? copy_slot[base + k] : -1;
}

DispatchPlan make_dispatch_plan(const ExpertPlacement& placement, int src_rank, const int32_t* ids,
                                int64_t num_tokens, int top_k) {
  DispatchPlan p;
  const int R = placement.num_ranks();
  p.num_ranks = R;
  p.top_k = top_k;
  p.num_tokens = num_tokens;
  p.send_counts.assign(R, 0);
  p.slot.assign(size_t(num_tokens) * R, -1);
  p.copy_rank.assign(size_t(num_tokens) * top_k, -1);
  p.copy_slot.assign(size_t(num_tokens) * top_k, -1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < top_k; ++k) {
      const size_t i = size_t(t) * top_k + k;
      const int32_t e = ids[i];
      if (e < 0) continue;
      const ExpertCopy c = placement.choose(e, src_rank, t);
      p.copy_rank[i] = c.rank;
      p.copy_slot[i] = c.slot;
      int32_t& s = p.slot[size_t(t) * R + c.rank];
      // Several of t's experts on one rank still make one copy there.
      if (s < 0) s = p.send_counts[c.rank]++;
    }
  }
  return p;
}

void HostRecvBuffers::allocate(int R, int C, int H, int K, int E_loc, ActFormat f) {
  num_ranks = R;
  capacity = C;
  hidden = H;
  top_k = K;
  num_local_experts = E_loc;
  format = f;
  const size_t slots = size_t(R) * C;
  payload.assign(slots * payload_bytes(f, H), 0);
  scales.assign(slots * scale_bytes(f, H), 0);
  local_ids.assign(slots * K, -1);
  weights.assign(slots * K, 0.0f);
  counts.assign(R, 0);
  expert_counts.assign(E_loc, 0);
}

RecvBuffers HostRecvBuffers::buffers() const {
  return RecvBuffers{payload.data(), scales.data(), local_ids.data(), weights.data(), counts.data(),
                     expert_counts.data()};
}

DispatchOutput HostRecvBuffers::view(const QuantParams& quant) const {
  return make_dispatch_output(RecvShape{num_ranks, capacity, hidden, top_k, num_local_experts, format, quant},
                              DeviceKind::cpu, buffers());
}

void write_region(const DispatchPlan& plan, int src, int d, const uint8_t* enc_payload, const uint8_t* enc_scales,
                  const float* weights, HostRecvBuffers& dst) {
  const size_t pb = payload_bytes(dst.format, dst.hidden), sb = scale_bytes(dst.format, dst.hidden);
  const int K = plan.top_k;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const int32_t j = plan.slot_of(t, d);
    if (j < 0) continue;
    const size_t slot = size_t(src) * dst.capacity + j;
    std::memcpy(dst.payload.data() + slot * pb, enc_payload + size_t(t) * pb, pb);
    if (sb) std::memcpy(dst.scales.data() + slot * sb, enc_scales + size_t(t) * sb, sb);
    plan.translated_row(t, d, dst.local_ids.data() + slot * K);
    std::memcpy(dst.weights.data() + slot * K, weights + size_t(t) * K, sizeof(float) * K);
  }
}

void finalize_receive(HostRecvBuffers& buf) {
  const int K = buf.top_k;
  std::fill(buf.expert_counts.begin(), buf.expert_counts.end(), 0);
  for (int s = 0; s < buf.num_ranks; ++s) {
    for (int j = 0; j < buf.capacity; ++j) {
      const size_t slot = size_t(s) * buf.capacity + j;
      int32_t* ids = buf.local_ids.data() + slot * K;
      if (j >= buf.counts[s]) {
        std::fill(ids, ids + K, -1);
        std::fill(buf.weights.data() + slot * K, buf.weights.data() + (slot + 1) * K, 0.0f);
        continue;
      }
      for (int k = 0; k < K; ++k)
        if (ids[k] >= 0) ++buf.expert_counts[ids[k]];
    }
  }
}

EncodedRows encode_source_rows(ActFormat f, const QuantParams& q, const bf16_raw* hidden, int64_t num_tokens, int H,
                               EncodeBuffers& buf) {
  if (f == ActFormat::bf16 || num_tokens == 0) return {reinterpret_cast<const uint8_t*>(hidden), nullptr};
  buf.payload.resize(size_t(num_tokens) * payload_bytes(f, H));
  buf.scales.resize(size_t(num_tokens) * scale_bytes(f, H));
  quantize_rows(f, q, hidden, num_tokens, H, buf.payload.data(), buf.scales.data());
  return {buf.payload.data(), buf.scales.data()};
}

}  // namespace epmoe::detail
