#include "harness/check.h"

#include <algorithm>

#include "core/parallel.h"
#include "harness/synthetic.h"
#include "run/oracle.h"

namespace epmoe::harness {

void moe_f64(const MoeConfig& c, uint64_t seed, int l, const std::vector<double>& x, int64_t S,
             const std::vector<int32_t>& ids, const std::vector<float>& w, std::vector<double>& moe) {
  const int H = c.hidden, I = c.intermediate, E = c.num_experts, K = c.top_k;
  std::vector<std::vector<int64_t>> pairs(E);  // (t * K + k) per expert
  for (int64_t p = 0; p < S * K; ++p)
    if (ids[p] >= 0) pairs.at(ids[p]).push_back(p);
  std::vector<int> used;
  for (int e = 0; e < E; ++e)
    if (!pairs[e].empty()) used.push_back(e);
  std::vector<double> contrib(size_t(S) * K * H, 0.0);
  detail::parallel_for(int64_t(used.size()), [&](int64_t i) {
    const int e = used[i];
    const ExpertMasters m = expert_masters(c, seed, l, e);
    const oracle::DenseExperts dense = oracle::DenseExperts::from_fp32(m.w13.data(), m.w2.data(), 1, H, I);
    const auto& ps = pairs[e];
    const int64_t n = int64_t(ps.size());
    std::vector<double> xg(size_t(n) * H), og(size_t(n) * H);
    std::vector<int32_t> id0(n, 0);
    std::vector<float> wg(n);
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(x.data() + size_t(ps[j] / K) * H, H, xg.data() + size_t(j) * H);
      wg[j] = w[ps[j]];
    }
    oracle::moe_forward(dense, xg.data(), n, id0.data(), wg.data(), 1, og.data());
    for (int64_t j = 0; j < n; ++j) std::copy_n(og.data() + size_t(j) * H, H, contrib.data() + size_t(ps[j]) * H);
  });
  // Summed in k order per token, whatever order the experts were computed in.
  moe.assign(size_t(S) * H, 0.0);
  for (int64_t t = 0; t < S; ++t)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < H; ++i) moe[size_t(t) * H + i] += contrib[(size_t(t) * K + k) * H + i];
}

CheckCost check_cost(const MoeConfig& c, int64_t S, int threads) {
  const double per_expert = expert_elements(c);
  const double used = std::min<double>(c.num_experts, double(S) * c.top_k);
  CheckCost k;
  // Per worker: fp32 masters + their float64 copy; plus the per-pair contributions.
  k.bytes = double(std::max(1, threads)) * per_expert * 12.0 + double(S) * c.top_k * c.hidden * 8.0 * 3;
  k.flops = used * per_expert * 10.0 + double(S) * c.top_k * per_expert * 2.0;
  return k;
}

}  // namespace epmoe::harness
