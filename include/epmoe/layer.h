// MoeLayer: one rank's share of an expert-parallel MoE layer. Owns its dispatcher, runner and
// workspaces; the caller owns weights and activations.
#pragma once
#include <memory>

#include "epmoe/comm.h"
#include "epmoe/config.h"
#include "epmoe/runner.h"
#include "epmoe/tensor.h"

namespace epmoe {

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

  // Collective. hidden bf16 [T, H]; router_logits f32 or bf16 [T, E]; out bf16 [T, H].
  void forward(const TensorView& hidden, const TensorView& router_logits, const TensorView& out,
               Stream stream = nullptr);
  // Collective. The routed entry point: topk_ids int32 [T, K] (-1 = none), topk_weights f32 [T, K].
  void forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                      const TensorView& topk_weights, const TensorView& out, Stream stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe
