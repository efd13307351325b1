// The whole synthetic model in host memory (harness/synthetic.h) and the stacked-layer driver (see model.h for the comparison rule).
#include "layer/stack_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"
#include "harness/machine.h"
#include "harness/synthetic.h"

namespace epmoe {

double model_host_bytes(const MoeConfig& cfg, int num_layers) {
  const double per_expert = harness::expert_elements(cfg);
  // fp32 masters + at most fp32-sized dequantized caches in the runners + quantized copies
  // (<= 2 bytes per element per copy) + the float64 dense copy used by the comparison.
  const double masters = per_expert * cfg.num_experts * 4.0;
  const double slots = per_expert * double(cfg.num_ranks) * cfg.experts_per_rank();
  return num_layers * (masters + slots * 2.0) + slots * 4.0 + per_expert * cfg.num_experts * 8.0;
}

Model::Model(const MoeConfig& cfg, int num_layers, uint64_t seed) : cfg_(cfg) {
  validate_or_throw(cfg);
  if (num_layers < 1)
    throw UsageError("layers=" + std::to_string(num_layers) + " must be at least 1");
  // Half of what is free now: the runners and the comparison allocate on top of the model.
  const double bytes = model_host_bytes(cfg, num_layers), budget = harness::available_memory_bytes() / 2;
  if (bytes > budget)
    throw UsageError("the whole-model CPU copy needs about " + std::to_string(int64_t(bytes / (1 << 20))) +
                     " MiB of host memory for hidden=" + std::to_string(cfg.hidden) + " intermediate=" +
                     std::to_string(cfg.intermediate) + " experts=" + std::to_string(cfg.num_experts) + " layers=" +
                     std::to_string(num_layers) + ", more than half of the " +
                     std::to_string(int64_t(budget * 2 / (1 << 20))) + " MiB available; use fewer layers or experts");
  const int H = cfg.hidden, I = cfg.intermediate, E = cfg.num_experts, R = cfg.num_ranks;
  layers_.resize(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    ModelLayer& L = layers_[l];
    L.w13.resize(size_t(E) * 2 * I * H);
    L.w2.resize(size_t(E) * H * I);
    for (int e = 0; e < E; ++e) {
      const harness::ExpertMasters m = harness::expert_masters(cfg, seed, l, e);
      std::copy(m.w13.begin(), m.w13.end(), L.w13.begin() + size_t(e) * 2 * I * H);
      std::copy(m.w2.begin(), m.w2.end(), L.w2.begin() + size_t(e) * H * I);
    }
    harness::RouterWeights rt = harness::router_weights(cfg, seed, l);
    L.router = std::move(rt.w);
    L.bias = std::move(rt.bias);
    for (int r = 0; r < R; ++r) {
      harness::RankWeights w = harness::rank_weights(cfg, seed, l, r);
      L.rank_w13.push_back(std::move(w.w13));
      L.rank_w2.push_back(std::move(w.w2));
    }
  }
}

ExpertWeights Model::rank_weights(int l, int rank) const {
  const ModelLayer& L = layers_.at(l);
  ExpertWeights w;
  w.num_local_experts = L.rank_w13.at(rank).experts;
  w.hidden = cfg_.hidden;
  w.intermediate = cfg_.intermediate;
  w.w13 = L.rank_w13[rank].view();
  w.w2 = L.rank_w2[rank].view();
  return w;
}

void Model::router_logits(int l, const bf16_raw* h, int64_t T, float* logits) const {
  const ModelLayer& L = layers_.at(l);
  harness::router_logits(harness::RouterWeights{L.router, L.bias}, cfg_.hidden, cfg_.num_experts, h, T, logits);
}

StackResult run_stack_cpu(const Model& model, const std::vector<int64_t>& tokens_per_rank, uint64_t seed,
                          const std::function<void(int)>& progress) {
  const MoeConfig& cfg = model.config();
  const int R = cfg.num_ranks, H = cfg.hidden, E = cfg.num_experts, K = cfg.top_k;
  if (int(tokens_per_rank.size()) != R)
    throw UsageError("tokens: " + std::to_string(tokens_per_rank.size()) + " values given for " + std::to_string(R) +
                     " ranks; give one token count per rank");
  StackResult res;
  res.out.resize(R);
  res.ref.resize(R);
  for (int r = 0; r < R; ++r) {
    if (tokens_per_rank[r] < 0)
      throw UsageError("tokens[" + std::to_string(r) + "]=" + std::to_string(tokens_per_rank[r]) + " is negative");
    res.out[r] = random_hidden(tokens_per_rank[r], H, seed + uint64_t(r));
    res.ref[r] = oracle::widen_bf16(res.out[r].data(), res.out[r].size());
  }
  auto comms = make_cpu_group(R, cfg.timeout_ms);
  std::vector<std::vector<int32_t>> ids(R);
  std::vector<std::vector<float>> wts(R);
  std::vector<double> secs(R);

  for (int l = 0; l < model.num_layers(); ++l) {
    const ModelLayer& L = model.layer(l);
    MoeConfig cl = cfg;
    if (cfg.dispatch_format == ActFormat::nvfp4) {
      // gs = 448*6/amax is decreasing in amax: the group's scale is the smallest rank scale.
      float gs = 0.f;
      for (int r = 0; r < R; ++r)
        if (!res.out[r].empty()) {
          const float g = nvfp4_global_scale_bf16(res.out[r].data(), res.out[r].size());
          gs = gs == 0.f ? g : std::min(gs, g);
        }
      cl.nvfp4_global_scale = gs > 0.f ? gs : 1.f;
    }
    run_ranks(comms, [&](Communicator& comm) {
      const int r = comm.rank();
      const int64_t T = tokens_per_rank[r];
      MoeLayer layer(cl, comm, model.rank_weights(l, r), L.bias.data());
      std::vector<float> logits(size_t(T) * E);
      model.router_logits(l, res.out[r].data(), T, logits.data());
      ids[r].resize(size_t(T) * K);
      wts[r].resize(size_t(T) * K);
      route_cpu(cl.router, TensorView::of(logits.data(), DType::f32, {T, E}), L.bias.data(), K, ids[r].data(),
                wts[r].data());
      std::vector<bf16_raw> out(size_t(T) * H);
      const auto t0 = std::chrono::steady_clock::now();
      layer.forward_routed(TensorView::of(res.out[r].data(), DType::bf16, {T, H}),
                           TensorView::of(ids[r].data(), DType::i32, {T, K}),
                           TensorView::of(wts[r].data(), DType::f32, {T, K}),
                           TensorView::of(out.data(), DType::bf16, {T, H}));
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (size_t i = 0; i < out.size(); ++i)
        res.out[r][i] = num::f32_to_bf16(num::bf16_to_f32(res.out[r][i]) + num::bf16_to_f32(out[i]));
    });
    res.forward_seconds += *std::max_element(secs.begin(), secs.end());

    const oracle::DenseExperts dense = oracle::DenseExperts::from_fp32(L.w13.data(), L.w2.data(), E, H, cfg.intermediate);
    for (int r = 0; r < R; ++r) {
      const int64_t T = tokens_per_rank[r];
      std::vector<double> moe(size_t(T) * H);
      oracle::moe_forward(dense, res.ref[r].data(), T, ids[r].data(), wts[r].data(), K, moe.data());
      for (size_t i = 0; i < moe.size(); ++i) res.ref[r][i] += moe[i];
    }
    if (progress) progress(l);
  }

  std::vector<double> got, ref;
  for (int r = 0; r < R; ++r) {
    for (bf16_raw v : res.out[r]) got.push_back(num::bf16_to_f32(v));
    ref.insert(ref.end(), res.ref[r].begin(), res.ref[r].end());
  }
  res.error = oracle::compare(got.data(), ref.data(), got.size());
  return res;
}

}  // namespace epmoe
