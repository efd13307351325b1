// A random model and a stacked-layer loop for the end-to-end tests of tests/layer (the tool's one
// driver of `epmoe run` lives in tools/cli/run_driver.*; this loop is the tests' own, kept apart so
// that it checks the layer independently of the driver).
//
// Every layer has fp32 master weights, a router projection [E, H] so that logits depend on the
// input, and per-rank quantized expert weights laid out by the config's placement, all from the
// one synthetic generator (harness/synthetic.h): the same values any rank of `epmoe run` builds.
// The stack is h_{l+1} = bf16(h_l + MoE_l(h_l)) on the cpu fabric (R ranks as threads).
//
// The float64 comparison path keeps h in double and uses the unquantized master weights, but it
// reuses the routing decisions (ids and weights) that the quantized path made at each layer: the
// error it reports is the arithmetic of the formats, not the router flipping a near-tie, which
// would otherwise dominate the table with a few tokens sent to entirely different experts.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "epmoe/config.h"
#include "epmoe/quant.h"
#include "epmoe/runner.h"
#include "harness/synthetic.h"
#include "run/oracle.h"

namespace epmoe {

struct ModelLayer {
  std::vector<float> w13, w2;  // fp32 masters [E][2I][H], [E][H][I]
  std::vector<float> router;   // [E][H]
  std::vector<float> bias;     // [E]: zeros for softmax routing, small random values for sigmoid
  std::vector<HostMatrix> rank_w13, rank_w2;  // per rank, [E_loc] experts in cfg.weight_format
};

class Model {
 public:
  // Holds every expert of every layer: meant for test shapes. Throws UsageError when that would
  // take more than half of the memory available now.
  Model(const MoeConfig& cfg, int num_layers, uint64_t seed);

  const MoeConfig& config() const { return cfg_; }
  int num_layers() const { return int(layers_.size()); }
  const ModelLayer& layer(int l) const { return layers_[l]; }
  // Rank r's experts of layer l as the runner consumes them (host views into this model).
  ExpertWeights rank_weights(int l, int rank) const;
  // logits [T][E] fp32 = router_l * h for bf16 h [T][H], fp32 accumulation.
  void router_logits(int l, const bf16_raw* h, int64_t T, float* logits) const;

 private:
  MoeConfig cfg_;
  std::vector<ModelLayer> layers_;
};

// Bytes of host memory Model(cfg, num_layers) needs (masters + quantized copies), an estimate.
double model_host_bytes(const MoeConfig& cfg, int num_layers);

using harness::random_hidden;  // bf16 [T][H], entries ~ N(0, 1), from `seed`

struct StackResult {
  std::vector<std::vector<bf16_raw>> out;  // per rank, final hidden [T_r][H]
  std::vector<std::vector<double>> ref;    // per rank, the float64 path's final hidden
  oracle::ErrorStats error;                // out vs ref over all ranks' tokens
  double forward_seconds = 0;              // sum over layers of the slowest rank's forward
};

// Runs the stack on the cpu fabric with tokens_per_rank[r] tokens on rank r (cfg.num_ranks ranks,
// 0 allowed), inputs random_hidden(T_r, H, seed + r). With nvfp4 dispatch each layer's activation
// global scale is calibrated from that layer's actual input (amax over all ranks). `progress`,
// if set, is called after each layer with its index.
StackResult run_stack_cpu(const Model& model, const std::vector<int64_t>& tokens_per_rank, uint64_t seed,
                          const std::function<void(int)>& progress = {});

}  // namespace epmoe
