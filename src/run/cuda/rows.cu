// Row passes and routing tables of the CUDA runner (rows.h). Measured before the vector forms (ncu,
// H200, DeepSeek-V3, M = 32768 bf16): permute 380 us, weighted sum 343 us (2.5, 1.5 TB/s), as every
// thread moved 2 elements (2-, 4-byte accesses) per step (bench/results/history-runner.md).
#include "run/cuda/rows.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda/pdl.cuh"
#include "epmoe/error.h"
#include "epmoe/format.h"
#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"
#include "run/cuda/nvfp4_layout.h"
#include "run/cuda/permute.cuh"
#include "run/cuda/tile_tables.h"

namespace epmoe::cuda {
namespace {

__device__ __forceinline__ float load_act(ActFormat f, const QuantParams& p, const uint8_t* row, const uint8_t* sc,
                                          int h) {
  if (f == ActFormat::bf16) return num::bf16_to_f32(reinterpret_cast<const bf16_raw*>(row)[h]);
  if (f == ActFormat::fp8) return dev::fp8_dequant(row[h], reinterpret_cast<const float*>(sc)[h / 128]);
  const uint8_t b = row[h / 2];
  return dev::nvfp4_dequant((h & 1) ? b >> 4 : b & 0xf, sc[h / 16], p.nvfp4_global_scale);
}

// Scalar permute (any H): one CTA per slot, two elements per thread step.
__global__ void permute_kernel(ActFormat f, QuantParams p, const uint8_t* __restrict__ payload,
                               const uint8_t* __restrict__ scales, const int32_t* __restrict__ ids,
                               const int32_t* __restrict__ counts, int C, int K, int E, int H,
                               const int32_t* __restrict__ offsets, int32_t* __restrict__ fill,
                               int32_t* __restrict__ pair_pos, bf16_raw* __restrict__ A) {
  dev::pdl_enter();
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint8_t* row = payload + i * int64_t(payload_bytes(f, H));
  const uint8_t* sc = scales ? scales + i * int64_t(scale_bytes(f, H)) : nullptr;
  for (int h = threadIdx.x * 2; h < H; h += blockDim.x * 2) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(load_act(f, p, row, sc, h), load_act(f, p, row, sc, h + 1));
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) *reinterpret_cast<__nv_bfloat162*>(A + int64_t(pos[k]) * H + h) = v;
  }
}

// Elements 8c .. 8c + 7 of a slot's fp8 (two words) or nvfp4 (one word) codes `q`, with the row's
// scales `sc`, as four bf16 pairs (2j, 2j + 1): load_act's values, rounded in pairs. Both vector
// permutes convert through it.
template <ActFormat F>
__device__ __forceinline__ uint4 dequant8(const uint32_t* q, const uint8_t* sc, int c, float nvfp4_global_scale) {
  float v[8];
  if constexpr (F == ActFormat::fp8) {
    const float s = reinterpret_cast<const float*>(sc)[(8 * c) / 128];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = dev::fp8_dequant(uint8_t(q[j >> 2] >> (8 * (j & 3))), s);
  } else {
    const uint8_t s = sc[(8 * c) / 16];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = dev::nvfp4_dequant(uint8_t((q[0] >> (4 * j)) & 0xf), s, nvfp4_global_scale);
  }
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    w[j] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Vector permute (H % 8 == 0, 16-byte aligned payload and A): a thread step is 8 elements, read as
// 16 (bf16), 8 (fp8) or 4 (nvfp4) bytes and stored as one 16-byte bf16 chunk per claimed row. The
// values are load_act's, rounded in the same pairs. A thread loads kPermuteChunks chunks before it
// stores them, and the launch gives a CTA as few threads as cover the row in one such step (as the
// weighted sum's): at H 2048 a 256-thread CTA moved one chunk per thread, 4 KB per CTA behind its
// claim of the rows (3.4 TB/s at Qwen3-30B M 32768, session 22); this form took it 78.3 -> 74.4 us
// (ncu, session 23; predicted ~68).
constexpr int kPermuteChunks = 4;
template <ActFormat F>
__device__ __forceinline__ uint4 permute_chunk(const QuantParams& p, const uint8_t* row, const uint8_t* sc, int c) {
  if constexpr (F == ActFormat::bf16) {
    return __ldg(reinterpret_cast<const uint4*>(row) + c);
  } else if constexpr (F == ActFormat::fp8) {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(row) + c);
    const uint32_t qw[2] = {q.x, q.y};
    return dequant8<F>(qw, sc, c, p.nvfp4_global_scale);
  } else {
    const uint32_t q = __ldg(reinterpret_cast<const uint32_t*>(row) + c);
    return dequant8<F>(&q, sc, c, p.nvfp4_global_scale);
  }
}
template <ActFormat F>
__global__ void permute_vec_kernel(QuantParams p, const uint8_t* __restrict__ payload, const uint8_t* __restrict__ scales,
                                   const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int C, int K,
                                   int E, int H, const int32_t* __restrict__ offsets, int32_t* __restrict__ fill,
                                   int32_t* __restrict__ pair_pos, bf16_raw* __restrict__ A) {
  dev::pdl_enter();
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint8_t* row = payload + i * int64_t(payload_bytes(F, H));
  const uint8_t* sc = scales ? scales + i * int64_t(scale_bytes(F, H)) : nullptr;
  const int nch = H / 8;
  for (int c0 = threadIdx.x; c0 < nch; c0 += kPermuteChunks * blockDim.x) {
    uint4 out[kPermuteChunks];
#pragma unroll
    for (int u = 0; u < kPermuteChunks; ++u) {
      const int c = c0 + u * blockDim.x;
      if (c < nch) out[u] = permute_chunk<F>(p, row, sc, c);
    }
#pragma unroll
    for (int u = 0; u < kPermuteChunks; ++u) {
      const int c = c0 + u * blockDim.x;
      if (c >= nch) continue;
      for (int k = 0; k < K; ++k)
        if (pos[k] >= 0) reinterpret_cast<uint4*>(A + int64_t(pos[k]) * H)[c] = out[u];
    }
  }
}

// Vector permute into the nvfp4 engine's K order: a thread dequantizes one 64-K block of the slot's
// row (16-byte loads, the values and roundings of permute_vec_kernel) into 32 natural bf16 pairs and
// permutes them as kperm_kernel does (position p <- natural column kperm_src(p), one byte permute per
// output word) into the CTA's shared copy of the row, which the CTA then writes to each claimed row
// with 16-byte stores, one contiguous chunk per thread step. Why: the
// separate in-place pass read and wrote every row of A once more (940 MB at DeepSeek-V3's 32768
// rows, ~4% of the nvfp4 runner at M 32768; bench/results/2026-12-02-session20-h200.md).
template <ActFormat F>
__global__ void permute_kperm_kernel(QuantParams p, const uint8_t* __restrict__ payload,
                                     const uint8_t* __restrict__ scales, const int32_t* __restrict__ ids,
                                     const int32_t* __restrict__ counts, int C, int K, int E, int H,
                                     const int32_t* __restrict__ offsets, int32_t* __restrict__ fill,
                                     int32_t* __restrict__ pair_pos, bf16_raw* __restrict__ A) {
  dev::pdl_enter();
  extern __shared__ uint4 srow[];  // the permuted row, H / 8 chunks
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint8_t* row = payload + i * int64_t(payload_bytes(F, H));
  const uint8_t* sc = scales ? scales + i * int64_t(scale_bytes(F, H)) : nullptr;
  for (int b = threadIdx.x; b < H / 64; b += blockDim.x) {
    uint32_t w[32];  // natural pairs (2j, 2j + 1) of the block
    if constexpr (F == ActFormat::bf16) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + 8 * b + c);
        w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
      }
    } else {
      constexpr int kChunks = F == ActFormat::fp8 ? 4 : 2;  // 16-byte loads per 64 codes
      uint32_t q[4 * kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + kChunks * b + c);
        q[4 * c] = v.x, q[4 * c + 1] = v.y, q[4 * c + 2] = v.z, q[4 * c + 3] = v.w;
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) {  // the block's 8-element chunks, as permute_vec_kernel's
        const uint4 v = dequant8<F>(q + c * (F == ActFormat::fp8 ? 2 : 1), sc, 8 * b + c, p.nvfp4_global_scale);
        w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
      }
    }
    uint32_t o[32];
    nvfp4_layout::kperm_block(w, o);
#pragma unroll
    for (int c = 0; c < 8; ++c) srow[8 * b + c] = make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
    const uint4 v = srow[c];
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) reinterpret_cast<uint4*>(A + int64_t(pos[k]) * H)[c] = v;
  }
}

// The expert rows (pair_pos, -1: none) and routing weights of slot i into shared memory; a barrier.
__device__ __forceinline__ void slot_routing(int64_t i, int K, const int32_t* pair_pos, const float* w, int32_t* pos,
                                             float* wk) {
  if (threadIdx.x < K) {
    pos[threadIdx.x] = pair_pos[i * K + threadIdx.x];
    wk[threadIdx.x] = w[i * K + threadIdx.x];
  }
  __syncthreads();
}

// Scalar weighted sum (any H): one CTA per slot, two elements per thread step.
__global__ void reduce_kernel(const bf16_raw* __restrict__ o, const int32_t* __restrict__ pair_pos,
                              const float* __restrict__ w, const int32_t* __restrict__ counts, int C, int K, int H,
                              bf16_raw* __restrict__ y) {
  dev::pdl_enter();
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  __shared__ int32_t pos[32];
  __shared__ float wk[32];
  slot_routing(i, K, pair_pos, w, pos, wk);
  for (int h = threadIdx.x * 2; h < H; h += blockDim.x * 2) {
    float a0 = 0.f, a1 = 0.f;
    for (int k = 0; k < K; ++k) {
      if (pos[k] < 0) continue;
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(o + int64_t(pos[k]) * H + h);
      const float2 f = __bfloat1622float2(v);
      a0 = __fadd_rn(a0, __fmul_rn(wk[k], f.x));
      a1 = __fadd_rn(a1, __fmul_rn(wk[k], f.y));
    }
    *reinterpret_cast<__nv_bfloat162*>(y + i * H + h) = __floats2bfloat162_rn(a0, a1);
  }
}

// Vector weighted sum (H % 8 == 0, 16-byte aligned o and y): a thread takes kChunks 16-byte chunks
// (8 elements each) per step and loads them for kBatch experts at a time before adding in ascending
// k, so 8 loads are in flight even with one expert per slot (one chunk per thread step: 2.9 TB/s
// with top_k 1; bench/results/history-runner.md). Same operations and order as reduce_kernel.
constexpr int kChunks = 4, kBatch = 2;
__global__ void reduce_vec_kernel(const bf16_raw* __restrict__ o, const int32_t* __restrict__ pair_pos,
                                  const float* __restrict__ w, const int32_t* __restrict__ counts, int C, int K, int H,
                                  bf16_raw* __restrict__ y) {
  dev::pdl_enter();
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  __shared__ int32_t pos[32];
  __shared__ float wk[32];
  slot_routing(i, K, pair_pos, w, pos, wk);
  const int nch = H / 8;
  for (int c0 = threadIdx.x; c0 < nch; c0 += kChunks * blockDim.x) {
    float acc[kChunks][8];
#pragma unroll
    for (int u = 0; u < kChunks; ++u)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[u][j] = 0.f;
    for (int k0 = 0; k0 < K; k0 += kBatch) {
      uint4 v[kBatch][kChunks];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int q = k0 + b < K ? pos[k0 + b] : -1;
#pragma unroll
        for (int u = 0; u < kChunks; ++u) {
          const int c = c0 + u * blockDim.x;
          v[b][u] = q >= 0 && c < nch ? __ldg(reinterpret_cast<const uint4*>(o + int64_t(q) * H) + c)
                                      : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int k = k0 + b;
        if (k >= K || pos[k] < 0) continue;
        const float wv = wk[k];
#pragma unroll
        for (int u = 0; u < kChunks; ++u) {
          const uint32_t x[4] = {v[b][u].x, v[b][u].y, v[b][u].z, v[b][u].w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[u][2 * j] = __fadd_rn(acc[u][2 * j], __fmul_rn(wv, __uint_as_float(x[j] << 16)));
            acc[u][2 * j + 1] = __fadd_rn(acc[u][2 * j + 1], __fmul_rn(wv, __uint_as_float(x[j] & 0xffff0000u)));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int c = c0 + u * blockDim.x;
      if (c >= nch) continue;
      uint32_t out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(acc[u][2 * j], acc[u][2 * j + 1]);
        out[j] = *reinterpret_cast<const uint32_t*>(&b);
      }
      reinterpret_cast<uint4*>(y + i * H)[c] = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

// ---- routing tables; the fp8 operands of the wgmma fp8 engine -------------------------------------

constexpr int kScanThreads = 1024;

// Slot i's pairs into the per-expert counters cnt (global or shared); ids outside [0, E) count nowhere.
// One pair routed to local expert e (ids outside [0, E) belong to no local expert).
__device__ __forceinline__ void count_id(int e, int E, int32_t* cnt) {
  if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
}
__device__ __forceinline__ void count_slot(const int32_t* __restrict__ ids, int64_t i, int K, int E, int32_t* cnt) {
  for (int k = 0; k < K; ++k) count_id(ids[i * K + k], E, cnt);
}

__global__ void count_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int64_t S, int C,
                             int K, int E, int32_t* __restrict__ cnt) {
  dev::pdl_enter();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= S || !slot_valid(i, C, counts)) return;
  count_slot(ids, i, K, E, cnt);
}

// Offsets of each expert's rows (cnt: shared or global), the m-tile table(s), and zeroed fill
// counters, by one CTA of kScanThreads; thread i owns a contiguous chunk of experts. With a second
// height (t.bm2 > 0) an expert whose rows make fewer m-tiles of bm2 rows than of bm goes to the
// second table instead (t.tiles2, num_tiles[1]; the rule: tile_tables.h).
struct TileTables {
  int bm, bm2;
  MTile* tiles;
  MTile* tiles2;
  int32_t* num_tiles;
};
// Exclusive prefix over the CTA's threads of three values at once (rows, tiles, second-table
// tiles): a shuffle scan within each warp, then the warp totals scanned by warp 0 through shared
// memory; three barriers. (A Hillis-Steele scan over 1024 threads took 20, and the one-CTA kernel
// 5.5 us at 128 pairs and 8.4 at 8192; with this scan 3.9 and 6.4: Qwen3-30B fp8, ncu,
// bench/results/history-runner.md.)
// Inclusive prefix of v over the lanes of a (full) warp.
__device__ __forceinline__ int3 warp_inclusive_scan3(int3 v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, v.x, o), b = __shfl_up_sync(0xffffffffu, v.y, o),
              c = __shfl_up_sync(0xffffffffu, v.z, o);
    if (lane >= o) v.x += a, v.y += b, v.z += c;
  }
  return v;
}
__device__ __forceinline__ int3 block_exclusive_scan3(int3 v) {
  __shared__ int3 s_warp[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int3 inc = warp_inclusive_scan3(v, lane);
  if (lane == 31) s_warp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const int3 w = warp_inclusive_scan3(lane < warps ? s_warp[lane] : make_int3(0, 0, 0), lane);
    if (lane < warps) s_warp[lane] = w;  // inclusive totals of warps 0..lane
  }
  __syncthreads();
  const int3 before = warp > 0 ? s_warp[warp - 1] : make_int3(0, 0, 0);
  return make_int3(before.x + inc.x - v.x, before.y + inc.y - v.y, before.z + inc.z - v.z);
}

__device__ void scan_offsets(const int32_t* cnt, int E, const TileTables t, int32_t* __restrict__ offsets,
                             int32_t* __restrict__ fill) {
  const int tid = threadIdx.x;
  const int chunk = (E + kScanThreads - 1) / kScanThreads;
  const int e0 = tid * chunk, e1 = min(E, e0 + chunk);
  int32_t rows = 0, nt = 0, nt2 = 0;
  for (int e = e0; e < e1; ++e) {
    rows += cnt[e];
    if (tile_tables::in_second(cnt[e], t.bm, t.bm2)) nt2 += tile_tables::tiles_of(cnt[e], t.bm2);
    else nt += tile_tables::tiles_of(cnt[e], t.bm);
  }
  const int3 ex = block_exclusive_scan3(make_int3(rows, nt, nt2));
  int32_t r = ex.x, i1 = ex.y, i2 = ex.z;
  for (int e = e0; e < e1; ++e) {
    offsets[e] = r;
    fill[e] = 0;
    const bool second = tile_tables::in_second(cnt[e], t.bm, t.bm2);
    const int bm = second ? t.bm2 : t.bm;
    MTile* const table = second ? t.tiles2 : t.tiles;
    int32_t& at = second ? i2 : i1;
    const int c = tile_tables::tiles_of(cnt[e], bm);
    for (int j = 0; j < c; ++j)
      table[at++] = MTile{e, r + j * bm, min(bm, cnt[e] - j * bm), tile_tables::walk_tag(j, c)};
    r += cnt[e];
  }
  if (tid == kScanThreads - 1) {
    t.num_tiles[0] = i1;
    if (t.bm2 > 0) t.num_tiles[1] = i2;
  }
}

__global__ void __launch_bounds__(kScanThreads) offsets_kernel(const int32_t* __restrict__ cnt, int E,
                                                               TileTables t, int32_t* __restrict__ offsets,
                                                               int32_t* __restrict__ fill) {
  dev::pdl_enter();
  scan_offsets(cnt, E, t, offsets, fill);
}

// count_kernel and offsets_kernel in one CTA, for few pairs (kFusedCountPairs): the counts go
// through shared memory (E ints), so neither the memset of cnt nor a second launch is needed.
// The counts are the same integers (an order-free sum), so every table is the same. One CTA's
// count grows with the pairs (20 us at 32768, Qwen3-30B M 32768, session 22) where the grid-wide
// count and the offsets took 8 us together (session 13): hence 8192. Measured (ncu, session 23):
// Qwen3-30B M 32768 count + offsets 20.2 -> 9.7 us.
constexpr int64_t kFusedCountPairs = 1 << 13;
constexpr int kCountBatch = 8;
static_assert(kFusedCountPairs == int64_t(kCountBatch) * kScanThreads, "each thread holds its pairs' ids once");
// With pair_pos (launch_count_claim) the CTA then claims every pair's row as the permutes do
// (permute.cuh, claim_rows: offsets[e] + a per-expert counter), from the ids it already holds, and
// records each row's slot in src_rows, so that the decode GEMM1 reads its rows from the dispatch
// buffer and no permute runs.
__global__ void __launch_bounds__(kScanThreads)
    count_offsets_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int64_t S, int C, int K,
                         int E, TileTables t, int32_t* __restrict__ cnt, int32_t* __restrict__ offsets,
                         int32_t* __restrict__ fill, int32_t* __restrict__ pair_pos, int32_t* __restrict__ src_rows) {
  dev::pdl_enter();
  extern __shared__ int32_t s_cnt[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) s_cnt[e] = 0;
  __syncthreads();
  // kCountBatch ids per thread, all loaded before their atomics: one id per step left a whole
  // global-load latency per step in this single CTA (27 us for 32768 pairs, Qwen3-30B M 32768,
  // session 22). 32-bit indices (P <= kFusedCountPairs), and each pair's id loaded independently
  // of its slot's validity, which is applied after both arrive.
  const int P = int(S) * K;
  int32_t e[kCountBatch];
  bool valid[kCountBatch];
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b) {
    const int p = int(threadIdx.x) + b * kScanThreads;
    e[b] = p < P ? ids[p] : -1;
    valid[b] = p < P && slot_valid(p / K, C, counts);
  }
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b) count_id(valid[b] ? e[b] : -1, E, s_cnt);
  __syncthreads();
  for (int x = threadIdx.x; x < E; x += blockDim.x) cnt[x] = s_cnt[x];
  scan_offsets(s_cnt, E, t, offsets, fill);
  if (!pair_pos) return;
  __syncthreads();  // every thread's offsets written, and scan_offsets done reading s_cnt
  for (int x = threadIdx.x; x < E; x += blockDim.x) s_cnt[x] = 0;
  __syncthreads();
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b) {
    if (!valid[b]) continue;  // as the permutes: an invalid slot's entries are not written
    const int p = int(threadIdx.x) + b * kScanThreads;
    int32_t q = -1;
    if (e[b] >= 0 && e[b] < E) {
      q = offsets[e[b]] + atomicAdd(&s_cnt[e[b]], 1);
      src_rows[q] = p / K;
    }
    pair_pos[p] = q;
  }
}

// fp8 dispatch into the fp8 GEMMs (wgmma decode engine and CUTLASS): a slot's e4m3 codes are
// copied as they are (16-byte moves when aligned) and its block scales go to
// sf[row * sf_row + kb * sf_block] (transposed for the wgmma engine, row-major for CUTLASS). One CTA
// per slot, 128 threads. (Measured in session 30, ncu, Qwen3-30B M 8192 / 32768 and DeepSeek-V3
// M 32768 / 128: 14.4 / 47.3 / 122.6 / 5.2 us with 128 threads, as CUTLASS's copy had; one warp per
// slot, four slots per CTA and four 16-byte chunks per lane step 15.1 / 48.1 / 124.6 / 6.5; 256
// threads, as the wgmma engine's copy had, 131.2 us at DeepSeek-V3 M 32768.)
__global__ void permute_fp8_kernel(const uint8_t* __restrict__ payload, const float* __restrict__ scales,
                                   const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int C, int K,
                                   int E, int H, bool aligned16, const int32_t* __restrict__ offsets,
                                   int32_t* __restrict__ fill, int32_t* __restrict__ pair_pos,
                                   uint8_t* __restrict__ A8, float* __restrict__ sf, int64_t sf_row,
                                   int64_t sf_block) {
  dev::pdl_enter();
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint8_t* row = payload + i * int64_t(H);
  if (aligned16) {
    for (int c = threadIdx.x; c < H / 16; c += blockDim.x) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + c);
      for (int k = 0; k < K; ++k)
        if (pos[k] >= 0) reinterpret_cast<uint4*>(A8 + int64_t(pos[k]) * H)[c] = v;
    }
  } else {
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      const uint8_t v = row[h];
      for (int k = 0; k < K; ++k)
        if (pos[k] >= 0) A8[int64_t(pos[k]) * H + h] = v;
    }
  }
  const int nb = fp8_blocks(H);
  const float* sc = scales + i * int64_t(nb);
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    const float s = sc[b];
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) sf[pos[k] * sf_row + b * sf_block] = s;
  }
}

// h rows (bf16) to e4m3 codes + block-128 scales (intermediate_quant = fp8) for the wgmma fp8
// GEMM2: the same codes and scales as the round trip below, kept as codes. One warp per block.
__global__ void intermediate_to_fp8_kernel(const bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                                           const int32_t* __restrict__ cnt, int E, int I, bool ue8m0,
                                           uint8_t* __restrict__ h8, float* __restrict__ hs_t, int64_t ld) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  const int64_t rows = offsets[E - 1] + cnt[E - 1];
  if (r >= rows) return;
  const bf16_raw* row = h + r * I;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < fp8_blocks(I); b += warps) {
    float v[4];
    bool on;
    const dev::Fp8Block bp = dev::fp8_warp_block(row, I, b, lane, ue8m0, v, on);
    uint32_t packed = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) packed |= uint32_t(dev::fp8_code(v[q], bp)) << (8 * q);
    if (on) *reinterpret_cast<uint32_t*>(h8 + r * I + b * 128 + lane * 4) = packed;
    if (lane == 0) hs_t[b * ld + r] = bp.scale;
  }
}

// h rows take the fp8 block-128 round trip (intermediate_quant = fp8); one warp per block.
__global__ void intermediate_fp8_kernel(bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ cnt, int E, int I, bool ue8m0) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  const int64_t rows = offsets[E - 1] + cnt[E - 1];
  if (r >= rows) return;
  bf16_raw* row = h + r * I;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < fp8_blocks(I); b += warps) {
    float v[4];
    bool on;
    const dev::Fp8Block bp = dev::fp8_warp_block(row, I, b, lane, ue8m0, v, on);
    if (!on) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      row[b * 128 + lane * 4 + q] = num::f32_to_bf16(dev::fp8_dequant(dev::fp8_code(v[q], bp), bp.scale));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads of a vector row-pass CTA that covers a row's H / 8 16-byte chunks in one step of
// `per_thread` chunks each: whole warps, at least one, at most `max_threads`.
int row_step_threads(int H, int per_thread, int max_threads) {
  return std::clamp(((H / 8 + per_thread - 1) / per_thread + 31) & ~31, 32, max_threads);
}

}  // namespace

bool launch_permute_bf16(const DispatchOutput& in, const int32_t* offsets, int32_t* fill, int32_t* pair_pos,
                         bf16_raw* A, cudaStream_t st, bool pdl, bool kperm) {
  const int64_t S = in.slots();
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts, H = in.hidden;
  const bool vec = H % 8 == 0 && aligned16(in.payload) && aligned16(A);
  kperm = kperm && vec && H % 64 == 0 && H <= kPermuteKpermMaxH;
  if (S <= 0) return kperm;  // no rows: either order holds
  const unsigned grid = unsigned(S);
  if (kperm) {
    auto* kernel = in.format == ActFormat::bf16  ? permute_kperm_kernel<ActFormat::bf16>
                   : in.format == ActFormat::fp8 ? permute_kperm_kernel<ActFormat::fp8>
                                                 : permute_kperm_kernel<ActFormat::nvfp4>;
    launch_kernel(kernel, grid, 256, size_t(H) * 2, st, pdl, in.quant, in.payload, in.scales, in.local_ids, in.counts,
                  C, K, E, H, offsets, fill, pair_pos, A);
  } else if (vec) {
    auto* kernel = in.format == ActFormat::bf16  ? permute_vec_kernel<ActFormat::bf16>
                   : in.format == ActFormat::fp8 ? permute_vec_kernel<ActFormat::fp8>
                                                 : permute_vec_kernel<ActFormat::nvfp4>;
    const int threads = row_step_threads(H, kPermuteChunks, 256);
    launch_kernel(kernel, grid, threads, 0, st, pdl, in.quant, in.payload, in.scales, in.local_ids, in.counts, C, K, E,
                  H, offsets, fill, pair_pos, A);
  } else {
    launch_kernel(permute_kernel, grid, 256, 0, st, pdl, in.format, in.quant, in.payload, in.scales, in.local_ids,
                  in.counts, C, K, E, H, offsets, fill, pair_pos, A);
  }
  return kperm;
}

void launch_reduce(const DispatchOutput& in, const int32_t* pair_pos, const bf16_raw* o, bf16_raw* y, cudaStream_t st,
                   bool pdl) {
  const int64_t S = in.slots();
  if (S <= 0) return;
  const int C = in.capacity, K = in.top_k, H = in.hidden;
  if (H % 8 == 0 && aligned16(o) && aligned16(y)) {
    // As few threads as cover the row in one step of kChunks chunks (>= one warp, <= 128): at
    // H = 2048 a 128-thread CTA left half its chunk slots empty and half the loads per SM in flight.
    const int threads = row_step_threads(H, kChunks, 128);
    launch_kernel(reduce_vec_kernel, unsigned(S), threads, 0, st, pdl, o, pair_pos, in.weights, in.counts, C, K, H, y);
  } else {
    launch_kernel(reduce_kernel, unsigned(S), 256, 0, st, pdl, o, pair_pos, in.weights, in.counts, C, K, H, y);
  }
}

void launch_count(const DispatchOutput& in, int bm, int32_t* cnt, int32_t* offsets, int32_t* fill, MTile* tiles,
                  int32_t* num_tiles, cudaStream_t st, bool pdl, int bm2, MTile* tiles2) {
  const int64_t S = in.slots();
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts;
  const TileTables t{bm, bm2 > 0 && tiles2 ? bm2 : 0, tiles, tiles2, num_tiles};
  if (S * K <= kFusedCountPairs && size_t(E) * 4 <= 32 * 1024) {
    launch_kernel(count_offsets_kernel, 1, kScanThreads, size_t(E) * 4, st, pdl, in.local_ids, in.counts, S, C, K, E,
                  t, cnt, offsets, fill, static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr));
    return;
  }
  EPMOE_CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(E) * 4, st));
  launch_kernel(count_kernel, unsigned((S + 255) / 256), 256, 0, st, pdl, in.local_ids, in.counts, S, C, K, E, cnt);
  launch_kernel(offsets_kernel, 1, kScanThreads, 0, st, pdl, cnt, E, t, offsets, fill);
}

bool launch_count_claim(const DispatchOutput& in, int bm, int32_t* cnt, int32_t* offsets, int32_t* fill, MTile* tiles,
                        int32_t* num_tiles, int32_t* pair_pos, int32_t* src_rows, cudaStream_t st, bool pdl) {
  const int64_t S = in.slots();
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts;
  if (!(S * K <= kFusedCountPairs && size_t(E) * 4 <= 32 * 1024)) return false;
  const TileTables t{bm, 0, tiles, nullptr, num_tiles};
  launch_kernel(count_offsets_kernel, 1, kScanThreads, size_t(E) * 4, st, pdl, in.local_ids, in.counts, S, C, K, E, t,
                cnt, offsets, fill, pair_pos, src_rows);
  return true;
}

void launch_permute_fp8_rows(const DispatchOutput& in, const int32_t* offsets, int32_t* fill, int32_t* pair_pos,
                             uint8_t* A8, float* sf, int64_t sf_row, int64_t sf_block, cudaStream_t st, bool pdl) {
  const int64_t S = in.slots();
  if (S <= 0) return;
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts, H = in.hidden;
  if (K > 32) throw UsageError("fp8 permute: top_k=" + std::to_string(K) + " exceeds 32 (claim_rows' table)");
  const bool aligned16 = reinterpret_cast<uintptr_t>(in.payload) % 16 == 0 && reinterpret_cast<uintptr_t>(A8) % 16 == 0 &&
                         H % 16 == 0;
  launch_kernel(permute_fp8_kernel, unsigned(S), 128, 0, st, pdl, in.payload,
                reinterpret_cast<const float*>(in.scales), in.local_ids, in.counts, C, K, E, H, aligned16, offsets,
                fill, pair_pos, A8, sf, sf_row, sf_block);
}

void launch_intermediate_to_fp8(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I,
                                bool ue8m0, int64_t max_rows, uint8_t* h8, float* hs_t, cudaStream_t st, bool pdl) {
  launch_kernel(intermediate_to_fp8_kernel, unsigned(max_rows), 256, 0, st, pdl, h, offsets, cnt, E, I, ue8m0, h8,
                hs_t, max_rows);
}

void launch_intermediate_fp8(bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I, bool ue8m0,
                             int64_t max_rows, cudaStream_t st, bool pdl) {
  launch_kernel(intermediate_fp8_kernel, unsigned(max_rows), 256, 0, st, pdl, h, offsets, cnt, E, I, ue8m0);
}

}  // namespace epmoe::cuda
