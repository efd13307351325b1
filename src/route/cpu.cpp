// CPU reference router (DESIGN.md §1). The CUDA router reproduces it bitwise, so the arithmetic
// below is written in one fixed order, and that order is part of the contract:
//
// Inputs: x_e = logit widened to fp32 (bf16 -> fp32 is exact). No fused multiply-add anywhere
// except inside num::exp_f32; never std::exp.
//
// softmax_topk, per token:
//   m     = max over e of x_e, NaN skipped (m = -inf when every x_e is NaN)
//   e_i   = num::exp_f32(x_i - m)
//   denominator, the order one 32-lane warp reproduces:
//     partial[l] = 0.0f; for i = l, l+32, l+64, ... (ascending): partial[l] += z_i,
//       z_i = e_i, or 0.0f where e_i is NaN (a NaN logit contributes nothing)
//     for off in 16, 8, 4, 2, 1: partial[l] = partial[l] + partial[l ^ off] for all l at once
//       (every lane reads the previous stage's values)
//     sum = partial[0]
//   p_i   = e_i / sum
//   choice: the K largest p_i (see "top-K" below); w_k = p_{id_k}
//
// sigmoid_grouped_topk, per token:
//   s_e   = num::sigmoid_f32(x_e) = 1 / (1 + exp_f32(-x_e))
//   c_e   = s_e + bias[e]                      (bias null: c_e = s_e)
//   groups of G = E / n_group consecutive experts; group score = top1 + top2 of c in the group
//     (top1 the larger; with G == 1 the score is top1 alone)
//   keep the topk_group best groups (top-K rule below over group scores; ties: lower group)
//   choice: the K largest c_e among experts of kept groups; w_k = s_{id_k}
//
// Renormalization (both kinds, if cfg.renormalize): sum = 0.0f; for k = 0..K-1: sum = sum + w_k;
// then w_k = w_k / sum. sigmoid_grouped_topk with sum == 0 (every chosen s underflowed): first
// w_k = exp_f32(x_{id_k} - max_k x_{id_k}) (max in k order), the limit of s_k / sum s. Then, for
// sigmoid_grouped_topk only: w_k = w_k * routed_scaling_factor.
//
// top-K: K rounds; each round takes the best element not yet taken, where a beats b if
// score(a) > score(b), or if they are equal (or both NaN) and a has the lower index. A NaN never
// beats a number, so a row of all NaN picks the lowest ids (with NaN weights). Documented outcomes
// of non-finite logits: +Inf gives x - m = NaN (weights NaN); a row of all -Inf likewise.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"

namespace epmoe {
namespace {

// a beats b (see the top-K rule above).
inline bool beats(float sa, int a, float sb, int b) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

// The K best indices of score[0..n) restricted to allowed[i] (null = all), in rank order.
void top_k(const float* score, int n, const unsigned char* allowed, int k, int32_t* out) {
  std::vector<unsigned char> taken(n, 0);
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (taken[i] || (allowed && !allowed[i])) continue;
      if (best < 0 || beats(score[i], i, score[best], best)) best = i;
    }
    out[r] = best;
    if (best >= 0) taken[best] = 1;
  }
}

// The warp-order sum described at the top of this file.
float warp_order_sum(const float* e, int n) {
  float partial[32];
  for (int l = 0; l < 32; ++l) {
    float acc = 0.0f;
    for (int i = l; i < n; i += 32) acc = acc + (std::isnan(e[i]) ? 0.0f : e[i]);
    partial[l] = acc;
  }
  for (int off = 16; off >= 1; off /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = partial[l] + partial[l ^ off];
    for (int l = 0; l < 32; ++l) partial[l] = next[l];
  }
  return partial[0];
}

void renormalize(float* w, int k) {
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) sum = sum + w[i];
  for (int i = 0; i < k; ++i) w[i] = w[i] / sum;
}

void route_softmax(const RouterConfig& cfg, const float* x, int E, int K, int32_t* ids, float* w,
                   std::vector<float>& p) {
  float m = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < E; ++i)
    if (x[i] > m) m = x[i];
  for (int i = 0; i < E; ++i) p[i] = num::exp_f32(x[i] - m);
  const float sum = warp_order_sum(p.data(), E);
  for (int i = 0; i < E; ++i) p[i] = p[i] / sum;
  top_k(p.data(), E, nullptr, K, ids);
  for (int k = 0; k < K; ++k) w[k] = p[ids[k]];
  if (cfg.renormalize) renormalize(w, K);
}

void route_grouped(const RouterConfig& cfg, const float* x, const float* bias, int E, int K, int32_t* ids,
                   float* w, std::vector<float>& s, std::vector<float>& c) {
  for (int e = 0; e < E; ++e) {
    s[e] = num::sigmoid_f32(x[e]);
    c[e] = bias ? s[e] + bias[e] : s[e];
  }
  const int G = E / cfg.n_group;
  std::vector<float> group_score(cfg.n_group);
  int32_t top2[2];
  for (int g = 0; g < cfg.n_group; ++g) {
    const float* cg = c.data() + size_t(g) * G;
    if (G == 1) {
      group_score[g] = cg[0];
    } else {
      top_k(cg, G, nullptr, 2, top2);
      group_score[g] = cg[top2[0]] + cg[top2[1]];
    }
  }
  std::vector<int32_t> kept(cfg.topk_group);
  top_k(group_score.data(), cfg.n_group, nullptr, cfg.topk_group, kept.data());
  std::vector<unsigned char> allowed(E, 0);
  for (int32_t g : kept)
    for (int i = 0; i < G; ++i) allowed[size_t(g) * G + i] = 1;
  top_k(c.data(), E, allowed.data(), K, ids);
  for (int k = 0; k < K; ++k) w[k] = s[ids[k]];
  if (cfg.renormalize) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum = sum + w[k];
    if (sum == 0.0f) {
      // Every chosen sigmoid underflowed to 0 (logits below about -88.7): 0/0 would make NaN. The
      // renormalized weights' limit there is a softmax over the chosen logits; take that.
      float m = x[ids[0]];
      for (int k = 1; k < K; ++k)
        if (x[ids[k]] > m) m = x[ids[k]];
      for (int k = 0; k < K; ++k) w[k] = num::exp_f32(x[ids[k]] - m);
    }
    renormalize(w, K);
  }
  for (int k = 0; k < K; ++k) w[k] = w[k] * cfg.routed_scaling_factor;
}

}  // namespace

void route_cpu(const RouterConfig& cfg, const TensorView& logits, const float* bias, int top_k_,
               int32_t* topk_ids, float* topk_weights) {
  if (logits.dtype != DType::f32 && logits.dtype != DType::bf16)
    throw UsageError("route_cpu: logits " + logits.describe() + " must be f32 or bf16");
  if (logits.ndim != 2)
    throw UsageError("route_cpu: logits " + logits.describe() + " must be 2-D [T, E]");
  check_tensor(logits, "router logits", logits.dtype, {-1, -1}, DeviceKind::cpu);
  const int64_t T = logits.size(0);
  const int E = static_cast<int>(logits.size(1));
  const int K = top_k_;
  if (E < 1) throw UsageError("route_cpu: logits have E=" + std::to_string(E) + " experts; need at least 1");
  if (K < 1 || K > E)
    throw UsageError("route_cpu: top_k=" + std::to_string(K) + " must be in [1, E=" + std::to_string(E) +
                     "]; set MoeConfig::top_k (--top-k) accordingly");
  if (T > 0 && (!topk_ids || !topk_weights))
    throw UsageError("route_cpu: topk_ids and topk_weights must be non-null when T=" + std::to_string(T) + " > 0");
  if (cfg.kind == RouterKind::sigmoid_grouped_topk) {
    if (cfg.n_group < 1 || E % cfg.n_group != 0)
      throw UsageError("route_cpu: router.n_group=" + std::to_string(cfg.n_group) + " must divide E=" +
                       std::to_string(E) + "; pick a divisor of the expert count (--n-group)");
    if (cfg.topk_group < 1 || cfg.topk_group > cfg.n_group)
      throw UsageError("route_cpu: router.topk_group=" + std::to_string(cfg.topk_group) + " must be in [1, n_group=" +
                       std::to_string(cfg.n_group) + "] (--topk-group)");
    const int64_t reachable = int64_t(cfg.topk_group) * (E / cfg.n_group);
    if (K > reachable)
      throw UsageError("route_cpu: top_k=" + std::to_string(K) + " exceeds the " + std::to_string(reachable) +
                       " experts of the kept groups (topk_group * E / n_group); raise router.topk_group "
                       "(--topk-group)");
  } else if (cfg.kind != RouterKind::softmax_topk) {
    throw UsageError("route_cpu: unknown router kind " + std::to_string(int(cfg.kind)));
  }

  std::vector<float> x(E), a(E), b(E);
  for (int64_t t = 0; t < T; ++t) {
    if (logits.dtype == DType::f32) {
      const float* row = logits.as<const float>() + t * E;
      for (int e = 0; e < E; ++e) x[e] = row[e];
    } else {
      const bf16_raw* row = logits.as<const bf16_raw>() + t * E;
      for (int e = 0; e < E; ++e) x[e] = num::bf16_to_f32(row[e]);
    }
    int32_t* ids = topk_ids + t * K;
    float* w = topk_weights + t * K;
    if (cfg.kind == RouterKind::softmax_topk)
      route_softmax(cfg, x.data(), E, K, ids, w, a);
    else
      route_grouped(cfg, x.data(), bias, E, K, ids, w, a, b);
  }
}

void check_topk_ids(const int32_t* topk_ids, int64_t num_tokens, int top_k, int num_experts) {
  if (num_tokens > 0 && !topk_ids)
    throw UsageError("topk_ids is null but num_tokens=" + std::to_string(num_tokens) + "; pass a [T, K] int32 array");
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k) {
      const int32_t id = topk_ids[t * top_k + k];
      if (id < -1 || id >= num_experts)
        throw UsageError("topk_ids[token " + std::to_string(t) + ", k " + std::to_string(k) + "] = " +
                         std::to_string(id) + " is outside [-1, E=" + std::to_string(num_experts) +
                         "); pass expert ids in [0, " + std::to_string(num_experts) + ") or -1 for none");
    }
}

}  // namespace epmoe
