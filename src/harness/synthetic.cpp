// Counter-hash weights (see synthetic.h; the hash is harness/counter_hash.h, shared with the
// device generator harness/cuda/synthetic.h).
#include "harness/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/parallel.h"
#include "harness/counter_hash.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"
#include "epmoe/tensor.h"

namespace epmoe::harness {

namespace {

using hash::Which;

// Element i (= row * cols + col) of matrix `which` of expert `e` in layer `l`.
void gen_matrix(uint64_t seed, int l, int e, Which which, double stddev, float* out, size_t n) {
  const uint64_t base = hash::matrix_base(seed, l, e, which);
  const float a = hash::stddev_step(stddev);
  for (size_t i = 0; i < n; ++i) out[i] = hash::element(base, a, i);
}

}  // namespace

ExpertMasters expert_masters(const MoeConfig& c, uint64_t seed, int l, int e) {
  const int H = c.hidden, I = c.intermediate;
  ExpertMasters m;
  m.w13.resize(size_t(2) * I * H);
  m.w2.resize(size_t(H) * I);
  gen_matrix(seed, l, e, hash::kW13, hash::row_stddev(H), m.w13.data(), m.w13.size());
  gen_matrix(seed, l, e, hash::kW2, hash::row_stddev(I), m.w2.data(), m.w2.size());
  return m;
}

RouterWeights router_weights(const MoeConfig& c, uint64_t seed, int l) {
  RouterWeights r;
  r.w.resize(size_t(c.num_experts) * c.hidden);
  gen_matrix(seed, l, 0, hash::kRouter, hash::row_stddev(c.hidden), r.w.data(), r.w.size());
  r.bias.assign(c.num_experts, 0.f);
  if (c.router.kind == RouterKind::sigmoid_grouped_topk) gen_matrix(seed, l, 0, hash::kBias, 0.05, r.bias.data(), r.bias.size());
  return r;
}

void router_logits(const RouterWeights& rt, int H, int E, const bf16_raw* h, int64_t T, float* logits) {
  constexpr int64_t kBlock = 64;
  detail::parallel_for((T + kBlock - 1) / kBlock, [&](int64_t b) {
    std::vector<float> x(H);
    for (int64_t t = b * kBlock; t < std::min(T, (b + 1) * kBlock); ++t) {
      for (int i = 0; i < H; ++i) x[i] = num::bf16_to_f32(h[t * H + i]);
      for (int e = 0; e < E; ++e) {
        const float* w = rt.w.data() + size_t(e) * H;
        float s = 0.f;
        for (int i = 0; i < H; ++i) s += w[i] * x[i];
        logits[t * E + e] = s;
      }
    }
  });
}

std::vector<int> slot_experts(const MoeConfig& c, int rank) {
  const ExpertPlacement pl = c.resolved_placement();
  std::vector<int> slot_expert(pl.slots_per_rank(), -1);
  for (int e = 0; e < pl.num_experts(); ++e)
    for (const ExpertCopy& cp : pl.copies(e))
      if (cp.rank == rank) slot_expert[cp.slot] = e;
  return slot_expert;
}

RankWeights rank_weights(const MoeConfig& c, uint64_t seed, int l, int rank) {
  const int H = c.hidden, I = c.intermediate;
  const std::vector<int> slot_expert = slot_experts(c, rank);
  const int El = int(slot_expert.size());
  std::vector<HostMatrix> q13(El), q2(El);
  detail::parallel_for(El, [&](int64_t s) {
    ExpertMasters m;
    if (slot_expert[s] >= 0) {
      m = expert_masters(c, seed, l, slot_expert[s]);
    } else {
      m.w13.assign(size_t(2) * I * H, 0.f);
      m.w2.assign(size_t(H) * I, 0.f);
    }
    q13[s] = quantize_matrix(m.w13.data(), 1, 2 * I, H, c.weight_format, I);  // fp8: gate and up tiled apart
    q2[s] = quantize_matrix(m.w2.data(), 1, H, I, c.weight_format);
  });
  auto join = [&](std::vector<HostMatrix>& q, int rows, int cols, int row_split) {
    HostMatrix out;
    out.format = c.weight_format;
    out.experts = El;
    out.rows = rows;
    out.cols = cols;
    out.row_split = c.weight_format == WeightFormat::fp8 ? row_split : 0;
    for (HostMatrix& m : q) {
      out.data.insert(out.data.end(), m.data.begin(), m.data.end());
      out.scales.insert(out.scales.end(), m.scales.begin(), m.scales.end());
      out.global_scale.insert(out.global_scale.end(), m.global_scale.begin(), m.global_scale.end());
      m = HostMatrix{};
    }
    return out;
  };
  RankWeights w;
  w.w13 = join(q13, 2 * I, H, I);
  w.w2 = join(q2, H, I, 0);
  return w;
}

std::vector<bf16_raw> random_hidden(int64_t T, int H, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<bf16_raw> out(size_t(T) * H);
  for (bf16_raw& v : out) v = num::f32_to_bf16(d(rng));
  return out;
}

std::vector<bf16_raw> uniform_bf16(size_t n, float amplitude, uint64_t seed) {
  const uint64_t base = hash::mix64(seed);
  const float a = hash::amplitude_step(amplitude);
  std::vector<bf16_raw> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = num::f32_to_bf16(hash::element(base, a, i));
  return out;
}

std::vector<int32_t> router_rows(const MoeConfig& model, int local, int64_t rows, uint64_t seed) {
  const int E = model.num_experts, K = model.top_k;
  if (local < 1 || local > E)
    throw UsageError("router_rows: local=" + std::to_string(local) + " experts, but the model has " +
                     std::to_string(E) + "; give 1..num_experts");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<int32_t> out;
  out.reserve(size_t(std::max<int64_t>(rows, 0)));
  const int64_t T = 4096;
  std::vector<float> logits(size_t(T) * E), w(size_t(T) * K);
  std::vector<int32_t> ids(size_t(T) * K);
  while (int64_t(out.size()) < rows) {
    for (auto& l : logits) l = nd(rng);
    route_cpu(model.router, TensorView::of(logits.data(), DType::f32, {T, E}), nullptr, K, ids.data(), w.data());
    for (size_t i = 0; i < ids.size() && int64_t(out.size()) < rows; ++i)
      if (ids[i] >= 0 && ids[i] < local) out.push_back(ids[i]);
  }
  return out;
}

}  // namespace epmoe::harness
