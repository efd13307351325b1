// MoeLayer: one rank's share of an expert-parallel MoE layer. Owns its dispatcher, runner and
// workspaces; the caller owns weights and activations.
#pragma once
#include <memory>

#include "epmoe/comm.h"
#include "epmoe/config.h"
#include "epmoe/runner.h"
#include "epmoe/tensor.h"

namespace epmoe {

// Data faults one rank's forwards met since the layer was built or the counts were reset
// (DESIGN.md §7). Each is a token (or an id entry) whose output follows the documented rule; no
// other token and no other rank is affected.
struct FaultCounts {
  int64_t nonfinite_hidden = 0;   // tokens with a NaN or +-inf value in hidden
  int64_t nonfinite_logits = 0;   // tokens with a NaN or +-inf router logit (forward)
  int64_t nonfinite_weights = 0;  // tokens with a NaN or +-inf routing weight: given (forward_routed)
                                  //   or computed by the router (e.g. from a +inf logit)
  int64_t bad_ids = 0;            // topk_ids entries outside [-1, E) (forward_routed; treated as -1)
  int64_t total() const { return nonfinite_hidden + nonfinite_logits + nonfinite_weights + bad_ids; }
};

class MoeLayer {
 public:
  // Validates cfg (UsageError listing every issue), resolves the (dispatcher, runner) pair through
  // the registry, and checks with the other ranks that they were built with the same
  // configuration (collective). `weights` are this rank's experts on the runner's device;
  // `router_bias` is [E] fp32 on the same device, or null. The runner's prepare step
  // (Runner::prepare) runs here, once: e.g. runner "cuda" copies nvfp4 weights into its decode
  // engine's prepared layout (the same bytes again; the same results, ~20% faster decode;
  // docs/RUNNER.md; tuning.nvfp4_prepare = false turns it off). Weights changed after
  // construction need a new layer.
  MoeLayer(const MoeConfig& cfg, Communicator& comm, const ExpertWeights& weights,
           const float* router_bias = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeConfig& config() const;
  int rank() const;
  DeviceKind device() const;  // where the runner works (hidden, logits and out live there)
  int device_index() const;   // the communicator's device on cuda

  // Collective. hidden bf16 [T, H]; router_logits f32 or bf16 [T, E]; out bf16 [T, H].
  void forward(const TensorView& hidden, const TensorView& router_logits, const TensorView& out,
               Stream stream = nullptr);
  // Collective. The routed entry point: topk_ids int32 [T, K] (-1 = none), topk_weights f32 [T, K].
  void forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                      const TensorView& topk_weights, const TensorView& out, Stream stream = nullptr);

  // The faults counted so far (tuning.fault_check = count or raise; all zero with off). Counting
  // costs no host synchronization: forwards add to counters on the device, and this call waits
  // for `stream` (the forwards' stream) to read them. With fault_check = raise, forward itself
  // waits for its stream and raises UsageError naming the faults it met (not while the stream is
  // capturing a CUDA graph).
  FaultCounts fault_counts(Stream stream = nullptr) const;
  // Zeroes the counters, ordered on `stream`.
  void reset_fault_counts(Stream stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe
