// Operation order (must stay identical to src/route/cpu.cpp, which states it in its top comment):
// - Lane l of the token's warp owns experts e = l + 32*i (i ascending).
// - softmax_topk: m = max over E (fmaxf); each lane sums exp_f32(x_e - m) over its experts in
//   ascending i, then an xor butterfly (offsets 16, 8, 4, 2, 1) adds the 32 partial sums; p_e =
//   exp_f32(x_e - m) / sum (a NaN term adds 0 to the sum; m skips NaN). Top-K of p (ties: lower id; NaN never beats a number). Renormalize:
//   the K chosen p summed in selection order k = 0..K-1, w_k = p_k / total.
// - sigmoid_grouped_topk: s_e = sigmoid_f32(x_e); c_e = s_e + bias_e. Group score = best c +
//   second-best c of the group (selected with the same tie rule). Best topk_group groups (ties:
//   lower group id). Top-K of c among experts of kept groups. w_k = s of the chosen expert;
//   renormalized as above when asked; then w_k * routed_scaling_factor.
// All arithmetic uses _rn intrinsics so that nvcc cannot fuse it into fma.
#include "route/cuda/route.h"

#include <cfloat>
#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"

namespace epmoe::cuda {
namespace {

constexpr int kPer = kMaxRouteExperts / 32;  // experts a lane owns at most
constexpr int kWarps = 4;                    // tokens per CTA

// a (id ia) ranks before b (id ib): larger value, NaN last, ties to the lower id.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
  const bool na = a != a, nb = b != b;
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// Warp-wide best (value, id); every lane gets the result. id = INT_MAX means no candidate.
__device__ __forceinline__ void warp_best(float& v, int& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oid = __shfl_xor_sync(0xffffffffu, id, o);
    if (oid != INT_MAX && (id == INT_MAX || better(ov, oid, v, id))) {
      v = ov;
      id = oid;
    }
  }
}

template <class In>
__device__ __forceinline__ float load_logit(const In* row, int e);
template <>
__device__ __forceinline__ float load_logit<float>(const float* row, int e) { return row[e]; }
template <>
__device__ __forceinline__ float load_logit<bf16_raw>(const bf16_raw* row, int e) { return num::bf16_to_f32(row[e]); }

// Picks K experts among those with `allowed` bit set in each lane's mask by repeated warp argmax.
// Lane k ends up holding choice k in my_id.
__device__ __forceinline__ void select_topk(const float (&score)[kPer], uint32_t allowed, int E, int K, int lane,
                                            int& my_id) {
  uint32_t taken = 0;
  my_id = -1;
  for (int k = 0; k < K; ++k) {
    float bv = 0.f;
    int bid = INT_MAX;
    int bi = -1;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e < E && ((allowed >> i) & 1u) && !((taken >> i) & 1u)) {
        if (bid == INT_MAX || better(score[i], e, bv, bid)) {
          bv = score[i];
          bid = e;
          bi = i;
        }
      }
    }
    float wv = bv;
    int wid = bid;
    warp_best(wv, wid);
    if (wid != INT_MAX && (wid & 31) == lane) taken |= 1u << bi;
    if (lane == k) my_id = wid == INT_MAX ? -1 : wid;
  }
}

// Value of expert e held by its owner lane, broadcast to all lanes.
__device__ __forceinline__ float fetch(const float (&arr)[kPer], int e) {
  float mine = 0.f;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (e >= 0 && lane + 32 * i == e) mine = arr[i];
  return __shfl_sync(0xffffffffu, mine, e >= 0 ? (e & 31) : 0);
}

template <class In>
__global__ void __launch_bounds__(kWarps * 32) route_kernel(RouterConfig cfg, const In* __restrict__ logits,
                                                            int64_t T, int E, const float* __restrict__ bias,
                                                            int K, int32_t* __restrict__ ids,
                                                            float* __restrict__ w) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  const In* row = logits + t * E;
  float x[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    x[i] = e < E ? load_logit(row, e) : 0.f;
  }
  int my_id = -1;
  float my_w = 0.f;
  float my_x = 0.f;  // lane k: the logit of choice k (sigmoid_grouped_topk)
  if (cfg.kind == RouterKind::softmax_topk) {
    // NaN skipped (fmaxf ignores it): m = -inf when every logit is NaN.
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < E) m = fmaxf(m, x[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float p[kPer];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      p[i] = 0.f;
      if (lane + 32 * i < E) {
        p[i] = num::exp_f32(__fsub_rn(x[i], m));
        sum = __fadd_rn(sum, p[i] != p[i] ? 0.0f : p[i]);  // a NaN logit contributes nothing
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
#pragma unroll
    for (int i = 0; i < kPer; ++i) p[i] = __fdiv_rn(p[i], sum);
    select_topk(p, 0xffffffffu, E, K, lane, my_id);
    // fetch is collective over one id: broadcast choice k, then lane k keeps its weight.
    float v = 0.f;
    for (int k = 0; k < K; ++k) {
      const int idk = __shfl_sync(0xffffffffu, my_id, k);
      const float pk = fetch(p, idk);
      if (lane == k) v = pk;
    }
    my_w = v;
  } else {
    float s[kPer], c[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      s[i] = e < E ? num::sigmoid_f32(x[i]) : 0.f;
      c[i] = e < E ? (bias ? __fadd_rn(s[i], bias[e]) : s[i]) : 0.f;
    }
    const int gsize = E / cfg.n_group;
    // Group scores: each group's top-2 by repeated warp argmax restricted to the group.
    uint32_t allowed = 0;
    float gscore_mine = 0.f;  // lane g holds group g's score (n_group <= 32)
    for (int g = 0; g < cfg.n_group; ++g) {
      uint32_t gmask = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = lane + 32 * i;
        if (e < E && e / gsize == g) gmask |= 1u << i;
      }
      int id0, id1;
      float score;
      {
        float bv = 0.f;
        int bid = INT_MAX;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if ((gmask >> i) & 1u) {
            const int e = lane + 32 * i;
            if (bid == INT_MAX || better(c[i], e, bv, bid)) {
              bv = c[i];
              bid = e;
            }
          }
        warp_best(bv, bid);
        id0 = bid;
        score = bv;
      }
      {
        float bv = 0.f;
        int bid = INT_MAX;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if ((gmask >> i) & 1u) {
            const int e = lane + 32 * i;
            if (e != id0 && (bid == INT_MAX || better(c[i], e, bv, bid))) {
              bv = c[i];
              bid = e;
            }
          }
        warp_best(bv, bid);
        id1 = bid;
        if (id1 != INT_MAX) score = __fadd_rn(score, bv);
      }
      if (lane == g) gscore_mine = score;
    }
    // Keep the best topk_group groups.
    uint32_t gtaken = 0;  // bit g: group g kept (same on every lane)
    for (int r = 0; r < cfg.topk_group; ++r) {
      float bv = gscore_mine;
      int bid = (lane < cfg.n_group && !((gtaken >> lane) & 1u)) ? lane : INT_MAX;
      warp_best(bv, bid);
      if (bid != INT_MAX) gtaken |= 1u << bid;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e < E && ((gtaken >> (e / gsize)) & 1u)) allowed |= 1u << i;
    }
    select_topk(c, allowed, E, K, lane, my_id);
    float v = 0.f;
    for (int k = 0; k < K; ++k) {
      const int idk = __shfl_sync(0xffffffffu, my_id, k);
      const float sk = fetch(s, idk);
      const float xk = fetch(x, idk);
      if (lane == k) v = sk, my_x = xk;
    }
    my_w = v;
  }
  if (cfg.renormalize) {
    // Serial sum in selection order: lane 0 gathers the K weights one by one.
    float total = 0.f;
    for (int k = 0; k < K; ++k) total = __fadd_rn(total, __shfl_sync(0xffffffffu, my_w, k));
    if (total == 0.f && cfg.kind == RouterKind::sigmoid_grouped_topk) {
      // Every chosen sigmoid underflowed (DESIGN.md §1.5): the weights' limit, a softmax over the
      // chosen logits, in the CPU reference's order.
      float m = __shfl_sync(0xffffffffu, my_x, 0);
      for (int k = 1; k < K; ++k) {
        const float xk = __shfl_sync(0xffffffffu, my_x, k);
        if (xk > m) m = xk;
      }
      my_w = lane < K ? num::exp_f32(__fsub_rn(my_x, m)) : 0.f;
      total = 0.f;
      for (int k = 0; k < K; ++k) total = __fadd_rn(total, __shfl_sync(0xffffffffu, my_w, k));
    }
    if (lane < K) my_w = __fdiv_rn(my_w, total);
  }
  if (cfg.kind == RouterKind::sigmoid_grouped_topk) my_w = __fmul_rn(my_w, cfg.routed_scaling_factor);
  if (lane < K) {
    ids[t * K + lane] = my_id;
    w[t * K + lane] = my_w;
  }
}

}  // namespace

void route(const RouterConfig& cfg, const TensorView& logits, const float* bias_dev, int top_k, int32_t* ids,
           float* w, cudaStream_t stream) {
  if (logits.device != DeviceKind::cuda)
    throw UsageError("cuda::route: logits " + logits.describe() + " must be on a CUDA device");
  if (logits.ndim != 2 || !logits.is_contiguous())
    throw UsageError("cuda::route: logits " + logits.describe() + " must be a contiguous [T, E] tensor");
  if (logits.dtype != DType::f32 && logits.dtype != DType::bf16)
    throw UsageError("cuda::route: logits dtype " + std::string(dtype_name(logits.dtype)) +
                     " is not supported; pass f32 or bf16");
  const int64_t T = logits.size(0);
  const int E = static_cast<int>(logits.size(1));
  if (E < 1 || E > kMaxRouteExperts)
    throw UsageError("cuda::route: num_experts=" + std::to_string(E) + " is outside [1, " +
                     std::to_string(kMaxRouteExperts) + "]; the CUDA router supports up to 512 experts");
  if (top_k < 1 || top_k > kMaxRouteTopK || top_k > E)
    throw UsageError("cuda::route: top_k=" + std::to_string(top_k) + " must be in [1, min(16, E=" +
                     std::to_string(E) + ")]");
  if (cfg.kind == RouterKind::sigmoid_grouped_topk) {
    if (cfg.n_group < 1 || cfg.n_group > 32 || E % cfg.n_group != 0)
      throw UsageError("cuda::route: n_group=" + std::to_string(cfg.n_group) +
                       " must divide num_experts=" + std::to_string(E) + " and be at most 32");
    if (cfg.topk_group < 1 || cfg.topk_group > cfg.n_group)
      throw UsageError("cuda::route: topk_group=" + std::to_string(cfg.topk_group) + " must be in [1, n_group=" +
                       std::to_string(cfg.n_group) + "]");
    if (top_k > cfg.topk_group * (E / cfg.n_group))
      throw UsageError("cuda::route: top_k=" + std::to_string(top_k) + " exceeds the experts in the kept groups (" +
                       std::to_string(cfg.topk_group * (E / cfg.n_group)) + "); raise topk_group");
  }
  if (T == 0) return;
  const unsigned grid = static_cast<unsigned>((T + kWarps - 1) / kWarps);
  if (logits.dtype == DType::f32)
    route_kernel<float><<<grid, kWarps * 32, 0, stream>>>(cfg, logits.as<const float>(), T, E, bias_dev, top_k, ids, w);
  else
    route_kernel<bf16_raw><<<grid, kWarps * 32, 0, stream>>>(cfg, logits.as<const bf16_raw>(), T, E, bias_dev, top_k,
                                                             ids, w);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
