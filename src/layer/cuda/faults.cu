// Device scan for data faults (faults.h). One warp per token (grid-stride): lanes read the
// token's hidden row (16-byte loads when aligned), logits, ids and weights, a ballot decides, and
// lane 0 counts.
#include "layer/cuda/faults.h"

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.h"

namespace epmoe::cuda {

namespace {

constexpr int kWarps = 8;

using detail::bf16_nonfinite;
using detail::f32_nonfinite;
__device__ bool bf16x2_bad(uint32_t w) { return bf16_nonfinite(w & 0xffffu) || bf16_nonfinite(w >> 16); }

__global__ void __launch_bounds__(kWarps * 32) scan_kernel(detail::FaultScan s, bool vec_x,
                                                          unsigned long long* counters) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t t = warp; t < s.tokens; t += warps) {
    bool x_bad = false, l_bad = false, w_bad = false;
    int ids_bad = 0;
    if (s.x) {
      const uint16_t* row = s.x + t * s.hidden;
      if (vec_x) {
        const uint4* v = reinterpret_cast<const uint4*>(row);
        for (int i = lane; i < s.hidden / 8; i += 32) {
          const uint4 q = __ldg(v + i);
          x_bad |= bf16x2_bad(q.x) || bf16x2_bad(q.y) || bf16x2_bad(q.z) || bf16x2_bad(q.w);
        }
      } else {
        for (int i = lane; i < s.hidden; i += 32) x_bad |= bf16_nonfinite(row[i]);
      }
    }
    if (s.logits) {
      for (int e = lane; e < s.num_experts; e += 32) {
        l_bad |= s.logits_bf16 ? bf16_nonfinite(static_cast<const uint16_t*>(s.logits)[t * s.num_experts + e])
                               : f32_nonfinite(static_cast<const uint32_t*>(s.logits)[t * s.num_experts + e]);
      }
    }
    for (int k = lane; k < s.top_k; k += 32) {
      if (s.weights) w_bad |= f32_nonfinite(reinterpret_cast<const uint32_t*>(s.weights)[t * s.top_k + k]);
      if (s.ids) {
        const int32_t id = s.ids[t * s.top_k + k];
        ids_bad += (id < -1 || id >= s.num_experts);
      }
    }
    const bool any_x = __any_sync(0xffffffffu, x_bad), any_l = __any_sync(0xffffffffu, l_bad),
               any_w = __any_sync(0xffffffffu, w_bad);
    for (int off = 16; off > 0; off /= 2) ids_bad += __shfl_xor_sync(0xffffffffu, ids_bad, off);
    if (lane == 0) {
      if (any_x) atomicAdd(counters + detail::kNonfiniteHidden, 1ull);
      if (any_l) atomicAdd(counters + detail::kNonfiniteLogits, 1ull);
      if (any_w) atomicAdd(counters + detail::kNonfiniteWeights, 1ull);
      if (ids_bad) atomicAdd(counters + detail::kBadIds, static_cast<unsigned long long>(ids_bad));
    }
  }
}

}  // namespace

void scan_faults(const detail::FaultScan& s, unsigned long long* counters, cudaStream_t stream) {
  if (s.tokens <= 0) return;
  const bool vec_x = s.hidden % 8 == 0 && reinterpret_cast<uintptr_t>(s.x) % 16 == 0;
  // Enough warps to keep HBM busy on long inputs; one token per warp on short ones.
  const int64_t blocks = std::min<int64_t>((s.tokens + kWarps - 1) / kWarps, 132 * 8);
  scan_kernel<<<int(blocks), kWarps * 32, 0, stream>>>(s, vec_x, counters);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
