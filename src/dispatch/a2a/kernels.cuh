// Kernels shared by the "nccl" dispatcher (and reused by "nvlink" where it is not fused): the
// per-chunk count, the pack into per-destination regions, expert counts, combine encode and the
// home-rank sum. Header-only templates so each dispatcher's .cu instantiates what it uses.
#pragma once
#include "dispatch/a2a/device.cuh"

namespace epmoe::a2a {

constexpr int kPackThreads = 512;
constexpr int kPushThreads = 256;
constexpr int kCountThreads = 256;

struct DestTable {
  DestRegion d[kMaxRanks];
};

static __global__ void count_kernel(DevPlacement p, const int32_t* ids, int K, int src, int64_t T, int64_t chunk,
                             int32_t* chunk_counts, int* bad) {
  __shared__ int sm[kMaxRanks];
  const int64_t t0 = blockIdx.x * chunk, t1 = min(T, t0 + chunk);
  count_chunk(p, ids, K, src, t0, t1, chunk_counts + size_t(blockIdx.x) * p.num_ranks, bad, sm);
}

// Slots of chunk blockIdx.x (chunk_counts [gridDim.x][R] from count_kernel) into slot_map [T][R].
static __global__ void __launch_bounds__(kPackThreads) slot_kernel(DevPlacement p, int src, int64_t T, int64_t chunk,
                                                            const int32_t* ids, int K, const int32_t* chunk_counts,
                                                            int32_t* slot_map) {
  __shared__ int sm_prefix[kMaxRanks], sm_running[kMaxRanks], sm_warp[(kPackThreads / 32) * kMaxRanks];
  const int R = p.num_ranks;
  for (int d = threadIdx.x; d < R; d += blockDim.x) {
    int s = 0;
    for (int b = 0; b < static_cast<int>(blockIdx.x); ++b) s += chunk_counts[b * R + d];
    sm_prefix[d] = s;
  }
  __syncthreads();
  const int64_t t0 = blockIdx.x * chunk, t1 = min(T, t0 + chunk);
  slot_chunk(p, ids, K, src, t0, t1, sm_prefix, slot_map, sm_warp, sm_running);
}

// Copies of every token into the per-destination regions at the slots of slot_kernel: warp w takes
// (token w >> lp, part w & (2^lp - 1)), so that few tokens still spread over the whole GPU (the
// copies were once done by the ~T/256 CTAs of the slot pass: one CTA for 128 tokens).
static __global__ void __launch_bounds__(kPushThreads) push_kernel(ActFormat f, QuantParams q, DevPlacement p, int src,
                                                            int64_t T, int lp, const bf16_raw* hidden,
                                                            const int32_t* ids, const float* w, int H, int K,
                                                            const int32_t* slot_map, DestTable dst) {
  const int R = p.num_ranks, parts = 1 << lp;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int64_t nw = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t i = gw; i < T * parts; i += nw) {
    const int64_t t = i >> lp;
    push_token(f, q, p, src, t, hidden, ids, w, H, K, slot_map + t * R, dst.d, int(i & (parts - 1)), parts);
  }
}

// expert_counts[e] += (token, k) pairs of the valid slots naming local expert e (zeroed before).
static __global__ void expert_count_kernel(const int32_t* local_ids, const int32_t* counts, int R, int C, int K,
                                    int num_local, int32_t* expert_counts) {
  const int64_t n = int64_t(R) * C * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t slot = i / K;
    const int s = static_cast<int>(slot / C), j = static_cast<int>(slot % C);
    if (j >= counts[s]) continue;
    const int e = local_ids[i];
    if (e >= 0 && e < num_local) atomicAdd(&expert_counts[e], 1);
  }
}

// Combine encode: the valid slots of y [R][C][H] into [R][C] rows of format f at out_payload/out_scales.
static __global__ void encode_rows_kernel(ActFormat f, QuantParams q, const bf16_raw* y, const int32_t* counts, int R, int C,
                                   int H, uint8_t* out_payload, uint8_t* out_scales) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int64_t nw = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const size_t ps = payload_bytes(f, H), ss = scale_bytes(f, H);
  for (int64_t slot = gw; slot < int64_t(R) * C; slot += nw) {
    const int s = static_cast<int>(slot / C), j = static_cast<int>(slot % C);
    if (j >= counts[s]) continue;  // warp-uniform
    uint8_t* pp = lane == 0 ? out_payload + slot * ps : nullptr;
    uint8_t* sp = lane == 0 && ss ? out_scales + slot * ss : nullptr;
    push_row(f, q, y + slot * H, H, 1, pp, sp);
  }
}

// The home rank's sum: one warp per token; rows from rank d sit at recv[d][slot_map[t][d]].
static __global__ void reduce_kernel(ActFormat f, int H, int R, int C, int64_t T, const int32_t* slot_map,
                              const uint8_t* recv_payload, const uint8_t* recv_scales, bf16_raw* out) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int64_t nw = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const size_t ps = payload_bytes(f, H), ss = scale_bytes(f, H);
  for (int64_t t = gw; t < T; t += nw) {
    const uint8_t* my_pp = nullptr;
    const uint8_t* my_sp = nullptr;
    int n = 0;
    for (int d = 0; d < R; ++d) {
      const int j = slot_map[t * R + d];
      if (j < 0) continue;
      if (lane == n) {
        my_pp = recv_payload + (size_t(d) * C + j) * ps;
        my_sp = ss ? recv_scales + (size_t(d) * C + j) * ss : nullptr;
      }
      ++n;
    }
    reduce_row(f, H, n, my_pp, my_sp, out + t * H);
  }
}

}  // namespace epmoe::a2a
