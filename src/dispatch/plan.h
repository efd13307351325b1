// The dispatch plan of one source rank (DESIGN.md §3): which ranks each token goes to, its slot
// there, and its routing row translated per destination. Every dispatcher (cpu, nccl, nvlink) either
// computes it on the host or reproduces it on the device; this CPU version is their oracle.
//
// Rules:
//  - the copy of expert e used by token t of source s is placement.choose(e, s, t);
//  - token t goes to rank d iff one of its K chosen copies lives on d (ids of -1 are skipped);
//  - its slot on d is the number of tokens t' < t of this source that also go to d;
//  - the row translated for d has, at k, the chosen copy's local slot if that copy is on d, else -1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "combine/reduce.h"
#include "dispatch/output.h"
#include "epmoe/dispatch.h"
#include "epmoe/format.h"
#include "epmoe/placement.h"

namespace epmoe::detail {

struct DispatchPlan {
  int num_ranks = 0, top_k = 0;
  int64_t num_tokens = 0;
  std::vector<int32_t> send_counts;  // [R] tokens going to each rank
  std::vector<int32_t> slot;         // [T][R] slot of token t on rank d, -1 if t does not go to d
  std::vector<int32_t> copy_rank;    // [T][K] rank of the chosen copy of expert k, -1 for id -1
  std::vector<int32_t> copy_slot;    // [T][K] local slot of that copy on copy_rank, -1 for id -1

  int32_t slot_of(int64_t t, int d) const { return slot[size_t(t) * num_ranks + d]; }
  // Writes the K local ids of token t as seen by rank d (-1 where the copy is not on d).
  void translated_row(int64_t t, int d, int32_t* out) const;
};

// Builds the plan of source `src_rank`. `ids` is [T][K] with values already checked to lie in
// [-1, E) (dispatch/check.h, check_input).
DispatchPlan make_dispatch_plan(const ExpertPlacement& placement, int src_rank, const int32_t* ids,
                                int64_t num_tokens, int top_k);

// Host-owned receive buffers of one rank in the DispatchOutput layout ([R][C] slots), shared by the
// CPU dispatchers and usable as the expected result in GPU backend tests.
struct HostRecvBuffers {
  int num_ranks = 0, capacity = 0, hidden = 0, top_k = 0, num_local_experts = 0;
  ActFormat format = ActFormat::bf16;
  std::vector<uint8_t> payload, scales;  // [R][C][payload_bytes], [R][C][scale_bytes]
  std::vector<int32_t> local_ids;        // [R][C][K]
  std::vector<float> weights;            // [R][C][K]
  std::vector<int32_t> counts;           // [R]
  std::vector<int32_t> expert_counts;    // [E_loc]

  // Sizes everything; ids start at -1 and counts at 0 (nothing received yet).
  void allocate(int R, int C, int H, int K, int E_loc, ActFormat f);
  RecvBuffers buffers() const;
  DispatchOutput view(const QuantParams& quant) const;  // make_dispatch_output of this layout (cpu)
};

// A source's rows in the dispatch format, quantized once before they go to any destination:
// [T][payload_bytes] and [T][scale_bytes] (scales null for bf16, whose rows pass through as they
// are). `buf` keeps the encoded bytes alive between calls.
struct EncodedRows {
  const uint8_t* payload = nullptr;
  const uint8_t* scales = nullptr;
};
struct EncodeBuffers {
  std::vector<uint8_t> payload, scales;
};
EncodedRows encode_source_rows(ActFormat f, const QuantParams& q, const bf16_raw* hidden, int64_t num_tokens, int H,
                               EncodeBuffers& buf);

// Writes the tokens of `plan` (source `src`) that go to rank `d` into region `src` of `dst`:
// payload and scale rows from the source's encoded rows ([T][payload_bytes], [T][scale_bytes]; scales
// null for bf16), the row translated for d and all K weights ([T][K]).
void write_region(const DispatchPlan& plan, int src, int d, const uint8_t* enc_payload, const uint8_t* enc_scales,
                  const float* weights, HostRecvBuffers& dst);

// Run by the destination once counts[] holds what each source sent and every region is written:
// slots j >= counts[s] get ids -1 and weights 0, expert_counts is recounted from the valid slots.
void finalize_receive(HostRecvBuffers& buf);

// combine/reduce.h's sum for the tokens of `plan` (their slots on every rank).
inline void combine_sum(ActFormat f, const QuantParams& p, int H, int C, const DispatchPlan& plan,
                        const uint8_t* recv_payload, const uint8_t* recv_scales, bf16_raw* out) {
  combine_sum(f, p, H, C, plan.num_tokens, plan.num_ranks, plan.slot.data(), recv_payload, recv_scales, out);
}

}  // namespace epmoe::detail
