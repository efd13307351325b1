// Dispatch and combine (DESIGN.md §3, §5): the dispatcher interface and the layout the runner
// receives.
#pragma once
#include <cstdint>

#include "epmoe/format.h"
#include "epmoe/tensor.h"

namespace epmoe {

using Stream = void*;  // a cudaStream_t for GPU backends; ignored by CPU backends

// What one rank dispatches. All pointers live on the dispatcher's device.
struct DispatchInput {
  int64_t num_tokens = 0;                // T (may be 0)
  const bf16_raw* hidden = nullptr;      // [T, H]
  const int32_t* topk_ids = nullptr;     // [T, K] global expert ids, -1 = none
  const float* topk_weights = nullptr;   // [T, K]
  Stream stream = nullptr;
};

// What the runner receives. Layout: [R source regions][C slots]; slot j of source s is valid for
// j < counts[s]; invalid slots have all local ids -1. Pointers are on `device`.
struct DispatchOutput {
  int num_ranks = 0, capacity = 0, hidden = 0, top_k = 0, num_local_experts = 0;
  ActFormat format = ActFormat::bf16;
  QuantParams quant;
  DeviceKind device = DeviceKind::cpu;
  const uint8_t* payload = nullptr;   // [R][C][payload_bytes(format, H)]
  const uint8_t* scales = nullptr;    // [R][C][scale_bytes(format, H)] (null for bf16)
  const int32_t* local_ids = nullptr; // [R][C][K] local expert slot on this rank, or -1
  const float* weights = nullptr;     // [R][C][K] all K routing weights of the token
  const int32_t* counts = nullptr;    // [R] valid slots per source region
  const int32_t* expert_counts = nullptr;  // [E_loc] (token, k) pairs per local expert, or null

  int64_t slots() const { return int64_t(num_ranks) * capacity; }
  size_t payload_stride() const { return payload_bytes(format, hidden); }
  size_t scale_stride() const { return scale_bytes(format, hidden); }
};

// The runner's result, slot-aligned with the DispatchOutput it came from.
struct CombineInput {
  const bf16_raw* y = nullptr;  // [R][C][H] on the dispatcher's device; only valid slots are read
  Stream stream = nullptr;
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual const char* name() const = 0;
  // Collective: every rank of the group calls it once per step. Raises UsageError before any
  // payload moves when T > C or an id is out of range on any rank. The returned views stay valid
  // until the next dispatch().
  virtual DispatchOutput dispatch(const DispatchInput& in) = 0;
  // Collective: returns every y to its home rank and writes out [T, H] bf16 for the T of the last
  // dispatch: out[t] = sum over ranks d (ascending) of y_d(t) in fp32. All -1 tokens get zeros.
  virtual void combine(const CombineInput& in, bf16_raw* out) = 0;
};

}  // namespace epmoe
