// Device pieces shared by the "nccl" and "nvlink" dispatchers: the placement rule, the per-chunk
// dispatch plan (deterministic slots from prefix sums, never atomics), the warp that quantizes one
// token row once and stores it to every destination, and the combine sum in ascending rank order.
// Quantization uses the "cuda" engineer's codecs (src/quant/cuda/quant_device.cuh) so that every
// GPU path rounds exactly like the CPU reference.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/format.h"
#include "epmoe/numeric.h"
#include "dispatch/a2a/types.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::a2a {

// ExpertPlacement::choose: the copy on the source rank if any, else copy (src + t) mod n.
__device__ __forceinline__ void choose_copy(const DevPlacement& p, int e, int src, int64_t t, int& rank, int& slot) {
  if (p.contiguous) {
    rank = e / p.slots_per_rank;
    slot = e - rank * p.slots_per_rank;
    return;
  }
  const int o = p.offsets[e], n = p.offsets[e + 1] - o;
  int pick = 0;
  if (n > 1) {
    pick = -1;
    for (int i = 0; i < n; ++i)
      if (p.ranks[o + i] == src) { pick = i; break; }
    if (pick < 0) pick = static_cast<int>((int64_t(src) + t) % n);
  }
  rank = p.ranks[o + pick];
  slot = p.slots[o + pick];
}

// f(k, ids[t*K + k]) for k = 0 .. K-1, the ids loaded eight at a time: eight independent loads in
// flight cost one memory round trip, where a loop that uses each id before loading the next costs
// K (measured: count phase at 128 tokens 2.7 -> 2.3-2.4 us; bench/results/history-comm.md).
template <class Fn>
__device__ __forceinline__ void for_each_id(const int32_t* ids, int K, int64_t t, Fn&& f) {
  const int32_t* row = ids + t * K;
  for (int k0 = 0; k0 < K; k0 += 8) {
    int32_t e[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = k0 + j < K ? row[k0 + j] : -1;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (k0 + j < K) f(k0 + j, e[j]);
  }
}

// Ranks that token t goes to (ids already validated).
__device__ __forceinline__ uint32_t token_mask(const DevPlacement& p, const int32_t* ids, int K, int src, int64_t t) {
  uint32_t m = 0;
  for_each_id(ids, K, t, [&](int, int e) {
    if (e < 0) return;
    int r, s;
    choose_copy(p, e, src, t, r, s);
    m |= 1u << r;
  });
  return m;
}

// Phase 1 of a dispatch for one CTA: tokens [t0, t1) of this source. Writes this chunk's count per
// destination to chunk_counts[R] and lowers *bad to the first bad (t*K + k) it sees (ids outside
// [-1, E)). Needs blockDim.x * R <= shared ints passed in `sm` (R ints used).
__device__ inline void count_chunk(const DevPlacement& p, const int32_t* ids, int K, int src, int64_t t0, int64_t t1,
                                   int32_t* chunk_counts, int* bad, int* sm_counts) {
  const int R = p.num_ranks;
  for (int d = threadIdx.x; d < R; d += blockDim.x) sm_counts[d] = 0;
  __syncthreads();
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    bool ok = true;
    uint32_t m = 0;
    for_each_id(ids, K, t, [&](int k, int e) {
      if (e < -1 || e >= p.num_experts) {
        atomicMin(bad, static_cast<int>(t * K + k));
        ok = false;
      } else if (e >= 0 && ok) {
        int r, s;
        choose_copy(p, e, src, t, r, s);
        m |= 1u << r;
      }
    });
    if (!ok) continue;
    while (m) {
      const int d = __ffs(m) - 1;
      m &= m - 1;
      atomicAdd(&sm_counts[d], 1);  // integer sum: order-independent
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < R; d += blockDim.x) chunk_counts[d] = sm_counts[d];
}

// Phase 3 helper: slots of tokens [t0, t1) per destination, written to slot_map[t][R] (-1 = not
// sent). prefix[d] is the number of this source's tokens before t0 that go to d. Sub-chunks of
// blockDim.x tokens (a multiple of 32): warp ballots give the rank inside a warp, per-warp totals in
// shared memory the rank inside the block. Shared: sm_warp needs (blockDim.x/32)*R ints,
// sm_running R ints.
__device__ inline void slot_chunk(const DevPlacement& p, const int32_t* ids, int K, int src, int64_t t0, int64_t t1,
                                  const int32_t* prefix, int32_t* slot_map, int* sm_warp, int* sm_running) {
  const int R = p.num_ranks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const unsigned lt = (1u << lane) - 1u;
  for (int d = threadIdx.x; d < R; d += blockDim.x) sm_running[d] = prefix[d];
  __syncthreads();
  for (int64_t base = t0; base < t1; base += blockDim.x) {
    const int64_t t = base + threadIdx.x;
    const uint32_t m = t < t1 ? token_mask(p, ids, K, src, t) : 0u;
    for (int d = 0; d < R; ++d) {
      const unsigned bal = __ballot_sync(0xffffffffu, (m >> d) & 1u);
      if (lane == 0) sm_warp[warp * R + d] = __popc(bal);
    }
    __syncthreads();
    for (int d = 0; d < R; ++d) {
      const unsigned bal = __ballot_sync(0xffffffffu, (m >> d) & 1u);
      int off = sm_running[d];
      for (int w = 0; w < warp; ++w) off += sm_warp[w * R + d];
      if (t < t1) slot_map[t * R + d] = ((m >> d) & 1u) ? off + __popc(bal & lt) : -1;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
      int sum = 0;
      for (int w = 0; w < nwarps; ++w) sum += sm_warp[w * R + d];
      sm_running[d] += sum;
    }
    __syncthreads();
  }
}

// Elements [e0, e1) of part `part` of `parts` of a row of H: whole 512-element pieces.
__device__ __forceinline__ void part_range(int H, int part, int parts, int& e0, int& e1) {
  const int n = (H + 511) / 512;
  e0 = (part * n / parts) * 512;
  e1 = min(H, ((part + 1) * n / parts) * 512);
}

// Warps per row so that `rows` rows keep about `warps` warps busy (a power of two, at most 16).
__device__ __forceinline__ int parts_for(int64_t rows, int64_t warps) {
  int p = 1;
  while (p < 16 && rows * p * 2 <= warps) p *= 2;
  return p;
}

__device__ __forceinline__ float bf16f(uint32_t bits16) { return num::bf16_to_f32(static_cast<uint16_t>(bits16)); }

// One warp: quantizes row `x` (H bf16) once per chunk and stores it to `ndst` destinations; lane i
// (< ndst) holds destination i's payload and scale pointers for this token. Stores are 16 bytes
// (bf16, fp8) or 8 bytes (nvfp4) wide; H % 16 == 0 for fp8 (a partial last 128-block: its lanes
// past H count 0 towards the amax and store nothing) and nvfp4, % 8 for bf16.
// Only elements [e0, e1) are handled (e0 a multiple of 512, e1 one too or H), so that several warps
// can share one row when there are few tokens.
__device__ inline void push_row(ActFormat f, const QuantParams& q, const bf16_raw* x, int H, int ndst, uint8_t* my_pp,
                                uint8_t* my_sp, int e0 = 0, int e1 = -1) {
  if (e1 < 0) e1 = H;
  const int lane = threadIdx.x & 31;
  if (f == ActFormat::bf16) {
    const int nchunks = e1 / 8;
    const uint4* src = reinterpret_cast<const uint4*>(x);
    // Whole-warp trip count: every lane takes part in every shuffle.
    for (int c0 = e0 / 8; c0 < nchunks; c0 += 32) {
      const int c = c0 + lane;
      const bool active = c < nchunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (active) v = __ldg(src + c);
      for (int i = 0; i < ndst; ++i) {
        uint8_t* pp = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_pp), i));
        if (active) reinterpret_cast<uint4*>(pp)[c] = v;
      }
    }
    return;
  }
  if (f == ActFormat::fp8) {
    const int nblk = fp8_blocks(e1);
    const int g = lane >> 3, sub = lane & 7;
    for (int b0 = e0 / 128; b0 < nblk; b0 += 4) {
      const int blk = b0 + g;
      const bool active = blk < nblk && blk * 128 + sub * 16 < e1;
      float v[16];
      float amax = 0.f;
      if (active) {
        const uint4* src = reinterpret_cast<const uint4*>(x + blk * 128 + sub * 16);
        const uint4 a = __ldg(src), b = __ldg(src + 1);
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v[2 * i] = bf16f(w[i] & 0xffffu);
          v[2 * i + 1] = bf16f(w[i] >> 16);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      const cuda::dev::Fp8Block bp = cuda::dev::fp8_block_params(amax, q.ue8m0);
      uint32_t out[4] = {0, 0, 0, 0};
      if (active) {
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i / 4] |= uint32_t(cuda::dev::fp8_code(v[i], bp)) << (8 * (i % 4));
      }
      for (int i = 0; i < ndst; ++i) {
        uint8_t* pp = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_pp), i));
        uint8_t* sp = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_sp), i));
        if (active) {  // a block's lane 0 is active whenever any of its lanes is
          *reinterpret_cast<uint4*>(pp + blk * 128 + sub * 16) = make_uint4(out[0], out[1], out[2], out[3]);
          if (sub == 0) reinterpret_cast<float*>(sp)[blk] = bp.scale;
        }
      }
    }
    return;
  }
  // nvfp4: one lane per block of 16.
  const int nblk = e1 / 16;
  for (int b0 = e0 / 16; b0 < nblk; b0 += 32) {
    const int blk = b0 + lane;
    const bool active = blk < nblk;
    uint8_t packed[8];
    uint8_t s = 0;
    if (active) {
      float v[16];
      const uint4* src = reinterpret_cast<const uint4*>(x + blk * 16);
      const uint4 a = __ldg(src), b = __ldg(src + 1);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[2 * i] = bf16f(w[i] & 0xffffu);
        v[2 * i + 1] = bf16f(w[i] >> 16);
      }
      s = cuda::dev::nvfp4_block(v, q.nvfp4_global_scale, packed);
    }
    uint2 word = make_uint2(0, 0);
    if (active) {
      word.x = uint32_t(packed[0]) | uint32_t(packed[1]) << 8 | uint32_t(packed[2]) << 16 | uint32_t(packed[3]) << 24;
      word.y = uint32_t(packed[4]) | uint32_t(packed[5]) << 8 | uint32_t(packed[6]) << 16 | uint32_t(packed[7]) << 24;
    }
    for (int i = 0; i < ndst; ++i) {
      uint8_t* pp = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_pp), i));
      uint8_t* sp = reinterpret_cast<uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_sp), i));
      if (active) {
        *reinterpret_cast<uint2*>(pp + blk * 8) = word;
        sp[blk] = s;
      }
    }
  }
}

// One warp: the copies of token t (routing row ids/w of this source) to every destination in its
// slot_map row. Stores payload, scales, the K translated local ids and the K weights.
__device__ inline void push_token(ActFormat f, const QuantParams& q, const DevPlacement& p, int src, int64_t t,
                                  const bf16_raw* hidden, const int32_t* ids, const float* w, int H, int K,
                                  const int32_t* slot_row, const DestRegion* dst, int part = 0, int parts = 1) {
  const int lane = threadIdx.x & 31;
  const int R = p.num_ranks;
  const size_t ps = payload_bytes(f, H), ss = scale_bytes(f, H);
  // Lane k: the chosen copy of expert k.
  int crank = -1, cslot = -1;
  float wk = 0.f;
  if (lane < K) {
    const int e = ids[t * K + lane];
    wk = w[t * K + lane];
    if (e >= 0) choose_copy(p, e, src, t, crank, cslot);
  }
  // Destinations of this token, in ascending rank order: lane i holds the i-th.
  uint8_t* my_pp = nullptr;
  uint8_t* my_sp = nullptr;
  int ndst = 0;
  for (int d = 0; d < R; ++d) {
    const int j = slot_row[d];
    if (j < 0) continue;
    if (lane == ndst) {
      my_pp = dst[d].payload + size_t(j) * ps;
      my_sp = ss ? dst[d].scales + size_t(j) * ss : nullptr;
    }
    if (lane < K && part == 0) {
      dst[d].ids[size_t(j) * K + lane] = crank == d ? cslot : -1;
      dst[d].weights[size_t(j) * K + lane] = wk;
    }
    ++ndst;
  }
  int e0, e1;
  part_range(H, part, parts, e0, e1);
  push_row(f, q, hidden + size_t(t) * H, H, ndst, my_pp, my_sp, e0, e1);
}

// One warp: out[H] = sum over d ascending of dequant(row_d) in fp32, as bf16. row pointers are in
// lane i (< n) as in push_row; n = 0 writes zeros. Payload of the combine is bf16 or fp8.
__device__ inline void reduce_row(ActFormat f, int H, int n, const uint8_t* my_pp, const uint8_t* my_sp, bf16_raw* out,
                                  int e0 = 0, int e1 = -1) {
  if (e1 < 0) e1 = H;
  const int lane = threadIdx.x & 31;
  const int nchunks = e1 / 8;  // 8 elements per lane per step
  for (int c0 = e0 / 8; c0 < nchunks; c0 += 32) {
    const int c = c0 + lane;
    const bool active = c < nchunks;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (int r = 0; r < n; ++r) {
      const uint8_t* pp = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_pp), r));
      const uint8_t* sp = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_sp), r));
      if (!active) continue;
      if (f == ActFormat::bf16) {
        const uint4 v = *reinterpret_cast<const uint4*>(pp + size_t(c) * 16);
        const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[2 * i] = __fadd_rn(acc[2 * i], bf16f(wv[i] & 0xffffu));
          acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], bf16f(wv[i] >> 16));
        }
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(pp + size_t(c) * 8);
        const float scale = reinterpret_cast<const float*>(sp)[(c * 8) / 128];
        const uint32_t wv[2] = {v.x, v.y};
#pragma unroll
        for (int i = 0; i < 8; ++i)
          acc[i] = __fadd_rn(acc[i], cuda::dev::fp8_dequant(static_cast<uint8_t>(wv[i / 4] >> (8 * (i % 4))), scale));
      }
    }
    if (active) {
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o[i] = cuda::dev::bf16x2_exact(acc[2 * i], acc[2 * i + 1]);
      reinterpret_cast<uint4*>(out)[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

}  // namespace epmoe::a2a
