// Random model weights and the stacked-layer driver (see model.h for the comparison rule).
#include "layer/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"

namespace epmoe {

namespace {

// More than this and the CPU path would take minutes or swap; a GPU runner is the tool then.
constexpr double kMaxHostBytes = 8.0 * (1ull << 30);

void fill_normal(std::mt19937_64& rng, std::vector<float>& v, double stddev) {
  std::normal_distribution<float> d(0.f, float(stddev));
  for (float& x : v) x = d(rng);
}

}  // namespace

double model_host_bytes(const MoeConfig& cfg, int num_layers) {
  const double per_expert = 3.0 * cfg.hidden * cfg.intermediate;
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
  const double bytes = model_host_bytes(cfg, num_layers);
  if (bytes > kMaxHostBytes)
    throw UsageError("the CPU model needs about " + std::to_string(int64_t(bytes / (1 << 20))) +
                     " MiB of host memory for hidden=" + std::to_string(cfg.hidden) + " intermediate=" +
                     std::to_string(cfg.intermediate) + " experts=" + std::to_string(cfg.num_experts) + " layers=" +
                     std::to_string(num_layers) + "; use --preset tiny, fewer --layers/--experts, or the GPU path");
  const int H = cfg.hidden, I = cfg.intermediate, E = cfg.num_experts, R = cfg.num_ranks;
  const ExpertPlacement placement = cfg.resolved_placement();
  const int El = placement.slots_per_rank();
  std::mt19937_64 rng(seed);
  layers_.resize(num_layers);
  for (ModelLayer& L : layers_) {
    // Scales keep every stage near unit variance: gate/up ~ N(0,1) for unit-variance inputs,
    // logits with a spread of about 1, so routing is neither uniform nor one-hot.
    L.w13.resize(size_t(E) * 2 * I * H);
    L.w2.resize(size_t(E) * H * I);
    L.router.resize(size_t(E) * H);
    fill_normal(rng, L.w13, 1.0 / std::sqrt(double(H)));
    fill_normal(rng, L.w2, 1.0 / std::sqrt(double(I)));
    fill_normal(rng, L.router, 1.0 / std::sqrt(double(H)));
    L.bias.assign(E, 0.f);
    if (cfg.router.kind == RouterKind::sigmoid_grouped_topk) fill_normal(rng, L.bias, 0.05);

    std::vector<float> r13, r2;
    for (int r = 0; r < R; ++r) {
      // Slots that no expert occupies (possible with an explicit map) hold zeros.
      r13.assign(size_t(El) * 2 * I * H, 0.f);
      r2.assign(size_t(El) * H * I, 0.f);
      for (int e = 0; e < E; ++e) {
        for (const ExpertCopy& c : placement.copies(e)) {
          if (c.rank != r) continue;
          std::copy_n(L.w13.data() + size_t(e) * 2 * I * H, size_t(2) * I * H, r13.data() + size_t(c.slot) * 2 * I * H);
          std::copy_n(L.w2.data() + size_t(e) * H * I, size_t(H) * I, r2.data() + size_t(c.slot) * H * I);
        }
      }
      L.rank_w13.push_back(quantize_matrix(r13.data(), El, 2 * I, H, cfg.weight_format));
      L.rank_w2.push_back(quantize_matrix(r2.data(), El, H, I, cfg.weight_format));
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
  const int H = cfg_.hidden, E = cfg_.num_experts;
  std::vector<float> x(H);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < H; ++i) x[i] = num::bf16_to_f32(h[t * H + i]);
    for (int e = 0; e < E; ++e) {
      const float* w = L.router.data() + size_t(e) * H;
      float s = 0.f;
      for (int i = 0; i < H; ++i) s += w[i] * x[i];
      logits[t * E + e] = s;
    }
  }
}

std::vector<bf16_raw> random_hidden(int64_t T, int H, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<bf16_raw> out(size_t(T) * H);
  for (bf16_raw& v : out) v = num::f32_to_bf16(d(rng));
  return out;
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
