// The CUTLASS path's SwiGLU pass (declared in engine_cutlass.h): GEMM1's [rows][2I] gate | up to
// the intermediate, bf16 or e4m3 codes + block scales. A row pass like those of rows.cu, apart
// from the GEMM instantiations so that it builds without the CUTLASS headers.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda/pdl.cuh"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/silu.cuh"

namespace epmoe::cuda::cutlass_engine {

namespace {

// One warp per 128 intermediate columns of a row (lane l takes 4 consecutive columns); the grid
// strides over rows, whose number only the device knows.
__global__ void swiglu_kernel(const bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                              const int32_t* __restrict__ cnt, int E, int I, bool round_trip, bool ue8m0,
                              bf16_raw* __restrict__ a, uint8_t* __restrict__ a8, float* __restrict__ sfa8) {
  dev::pdl_enter();
  const int64_t rows = offsets[E - 1] + cnt[E - 1];
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  const int nb = fp8_blocks(I);
  const int64_t total = rows * nb;
  for (int64_t w = blockIdx.x * int64_t(warps) + (threadIdx.x >> 5); w < total; w += int64_t(gridDim.x) * warps) {
    const int64_t r = w / nb;
    const int b = int(w % nb);
    const int c0 = b * 128 + lane * 4;
    const bf16_raw* g = h + r * 2 * I;
    float v[4], amax = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int c = c0 + q;
      float x = 0.f;
      if (c < I) {
        const float gv = num::bf16_to_f32(g[c]), uv = num::bf16_to_f32(g[I + c]);
        // Same expression as the mma.sync epilogue; rounded to bf16 (the runner's intermediate).
        x = num::bf16_to_f32(num::f32_to_bf16(silu(gv) * uv));
      }
      v[q] = x;
      amax = fmaxf(amax, fabsf(x));
    }
    if (a8 || round_trip) {
      const dev::Fp8Block bp = dev::fp8_block_params(dev::warp_max(amax), ue8m0);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (c0 + q >= I) continue;
        const uint8_t code = dev::fp8_code(v[q], bp);
        if (a8)
          a8[r * I + c0 + q] = code;
        else
          a[r * I + c0 + q] = num::f32_to_bf16(dev::fp8_dequant(code, bp.scale));
      }
      if (a8 && lane == 0) sfa8[r * nb + b] = bp.scale;
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (c0 + q < I) a[r * I + c0 + q] = num::f32_to_bf16(v[q]);
    }
  }
}

// The end of a work item: the lane's 8 intermediate values v of columns c0 of row r (bw: the same
// as bf16 pairs; zeros where !on) stored as bf16, or through the fp8 block rule (every lane of the
// warp calls it, for the block's amax).
__device__ __forceinline__ void intermediate_store(const float (&v)[8], const uint32_t (&bw)[4], float amax, bool on,
                                                   int lane, uint32_t r, int c0, int I, int nb, bool round_trip,
                                                   bool ue8m0, bf16_raw* __restrict__ a, uint8_t* __restrict__ a8,
                                                   float* __restrict__ sfa8);

// One work item of the vector form: the lane's 8 columns c0 of row r from its loaded gate and up
// chunks (on: c0 < I; every lane of the warp calls it, for the block's amax).
__device__ __forceinline__ void swiglu_item(uint4 gq, uint4 uq, bool on, int lane, uint32_t r, int c0, int I, int nb,
                                            bool round_trip, bool ue8m0, bf16_raw* __restrict__ a,
                                            uint8_t* __restrict__ a8, float* __restrict__ sfa8) {
  float v[8], amax = 0.f;
  uint32_t bw[4] = {0, 0, 0, 0};  // v as bf16 pairs
  if (on) {
    const uint32_t gw[4] = {gq.x, gq.y, gq.z, gq.w}, uw[4] = {uq.x, uq.y, uq.z, uq.w};
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gv = __uint_as_float((j & 1) ? gw[j / 2] & 0xffff0000u : gw[j / 2] << 16);
      const float uv = __uint_as_float((j & 1) ? uw[j / 2] & 0xffff0000u : uw[j / 2] << 16);
      x[j] = silu(gv) * uv;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // bf16 rounding as num::f32_to_bf16 (hardware pair conversion)
      bw[j] = dev::bf16x2_exact(x[2 * j], x[2 * j + 1]);
      v[2 * j] = __uint_as_float(bw[j] << 16);
      v[2 * j + 1] = __uint_as_float(bw[j] & 0xffff0000u);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = 0.f;
  }
  intermediate_store(v, bw, amax, on, lane, r, c0, I, nb, round_trip, ue8m0, a, a8, sfa8);
}

__device__ __forceinline__ void intermediate_store(const float (&v)[8], const uint32_t (&bw)[4], float amax, bool on,
                                                   int lane, uint32_t r, int c0, int I, int nb, bool round_trip,
                                                   bool ue8m0, bf16_raw* __restrict__ a, uint8_t* __restrict__ a8,
                                                   float* __restrict__ sfa8) {
  if (a8 || round_trip) {
    // The block of these columns is 16 lanes wide; in a partial last block (I % 128 != 0) the
    // lanes past I add 0 to the amax.
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const dev::Fp8Block bp = dev::fp8_block_params(amax, ue8m0);
    if (!on) return;
    uint32_t q[4];  // e4m3 pairs: fp8_code's value, converted by the hardware
#pragma unroll
    for (int j = 0; j < 4; ++j)
      q[j] = bp.divide ? dev::e4m3x2_hw(__fdiv_rn(v[2 * j], bp.mul), __fdiv_rn(v[2 * j + 1], bp.mul))
                       : dev::e4m3x2_hw(__fmul_rn(v[2 * j], bp.mul), __fmul_rn(v[2 * j + 1], bp.mul));
    if (a8) {
      *reinterpret_cast<uint2*>(a8 + size_t(r) * I + c0) = make_uint2(q[0] | q[1] << 16, q[2] | q[3] << 16);
      if ((lane & 15) == 0) sfa8[size_t(r) * nb + c0 / 128] = bp.scale;
    } else {
      uint32_t rw[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        rw[j] = uint32_t(num::f32_to_bf16(dev::fp8_dequant(uint8_t(q[j]), bp.scale))) |
                uint32_t(num::f32_to_bf16(dev::fp8_dequant(uint8_t(q[j] >> 8), bp.scale))) << 16;
      *reinterpret_cast<uint4*>(a + size_t(r) * I + c0) = make_uint4(rw[0], rw[1], rw[2], rw[3]);
    }
  } else if (on) {
    *reinterpret_cast<uint4*>(a + size_t(r) * I + c0) = make_uint4(bw[0], bw[1], bw[2], bw[3]);
  }
}

// The item's gate and up chunks (zeros where the lane's columns are past I).
__device__ __forceinline__ void swiglu_load(const bf16_raw* __restrict__ h, uint32_t r, int c0, int I, bool on,
                                            uint4& gq, uint4& uq) {
  const bf16_raw* g = h + size_t(r) * 2 * I;
  gq = on ? __ldg(reinterpret_cast<const uint4*>(g + c0)) : make_uint4(0, 0, 0, 0);
  uq = on ? __ldg(reinterpret_cast<const uint4*>(g + I + c0)) : make_uint4(0, 0, 0, 0);
}

// Vector form (I % 8 == 0, 16-byte aligned h and a): a lane takes 8 consecutive columns (gate and
// up as one 16-byte load each; kQuant: h is the bf16 intermediate [rows][I] already, as the fp8
// one-GEMM SwiGLU writes it, and only the fp8 block rule is applied, the same bytes as the pass
// from the same values), so a warp covers 256 columns = two fp8 blocks of 16 lanes; the
// grid strides over (row, 256-column group) with a 32-bit index. Same arithmetic as swiglu_kernel
// (measured at M 32768: the scalar kernel took 191 us for bf16 and 271 us with the fp8 codes, 2.1
// and 1.2 TB/s, with 2-byte accesses; bench/results/history-runner.md).
// kSkip: the work items are (m-tile, row of the tile, 256-column group), each warp taking one
// contiguous run of them, and the rows of the experts `skip` names (SwigluSkip) are left; a row's
// bytes are computed as without it (SwiGLU only: the quantization runs over all rows). The run
// keeps a warp on one or two tiles, so it looks each tile up once and steps over a skipped tile
// (or a tile's rows past its count) in one iteration:
// with a grid stride, every item paid the two dependent lookups, 37 us for a pass that skipped
// everything (DeepSeek-V3 bf16 M 32768 uniform, ncu; bench/results/2026-12-03-session27-h200.md).
// (Two items in flight per warp, both loaded before either is computed, measured the same: 15.4 /
// 47.3 / 119.9 us against 15.0 / 48.2 / 120.7 at Qwen3-30B fp8 M 8192 / 32768 and DeepSeek-V3 fp8
// M 32768, ncu, session 30.)
template <bool kQuant, bool kSkip>
__global__ void intermediate_vec_kernel(const bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ cnt, int E, int I, bool round_trip, bool ue8m0,
                                        bf16_raw* __restrict__ a, uint8_t* __restrict__ a8,
                                        float* __restrict__ sfa8, const SwigluSkip skip) {
  static_assert(!(kQuant && kSkip), "the quantization takes every row");
  dev::pdl_enter();
  const int lane = threadIdx.x & 31;
  const uint32_t warps = blockDim.x >> 5;
  const uint32_t ng = uint32_t(I + 255) / 256;
  const int nb = fp8_blocks(I);
  const uint32_t nw = gridDim.x * warps, gw = blockIdx.x * warps + (threadIdx.x >> 5);
  // One work item: the lane's 8 columns c0 of row r (on: c0 < I; I % 8 == 0, so a lane's columns
  // are all in or all out).
  auto item = [&](uint32_t r, int c0) {
    const bool on = c0 < I;
    if constexpr (kQuant) {
      const uint4 q = on ? __ldg(reinterpret_cast<const uint4*>(h + size_t(r) * I + c0)) : make_uint4(0, 0, 0, 0);
      const uint32_t bw[4] = {q.x, q.y, q.z, q.w};
      float v[8], amax = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = __uint_as_float(bw[j] << 16);
        v[2 * j + 1] = __uint_as_float(bw[j] & 0xffff0000u);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
      intermediate_store(v, bw, amax, on, lane, r, c0, I, nb, false, ue8m0, nullptr, a8, sfa8);
    } else {
      uint4 gq, uq;
      swiglu_load(h, r, c0, I, on, gq, uq);
      swiglu_item(gq, uq, on, lane, r, c0, I, nb, round_trip, ue8m0, a, a8, sfa8);
    }
  };
  if constexpr (!kSkip) {
    const uint32_t total = uint32_t(offsets[E - 1] + cnt[E - 1]) * ng;
    for (uint32_t w = gw; w < total; w += nw) {
      const uint32_t r = w / ng;
      item(r, int(w - r * ng) * 256 + lane * 8);
    }
  } else {
    // 128 rows per m-tile (launch_count's table at bm 128).
    const uint32_t total = uint32_t(*skip.num_tiles) * 128 * ng;
    const uint32_t per = (total + nw - 1) / nw;  // the warp's run of items
    const uint32_t w_end = min(total, (gw + 1) * per);
    uint32_t tile = 0xffffffffu;  // the tile looked up last, and what it says
    MTile mt{};
    bool fused = false;
    for (uint32_t w = gw * per; w < w_end; ++w) {
      uint32_t r = w / ng;
      const int c0 = int(w - r * ng) * 256 + lane * 8;
      if (r / 128 != tile) {  // warp-uniform: every lane has the same w
        tile = r / 128;
        mt = skip.tiles[tile];
        const int rows_e = cnt[mt.expert];
        fused = skip.fused.contains(rows_e);
      }
      const int in_tile = int(r % 128);
      if (fused || in_tile >= mt.rows) {  // nothing left in this tile: on to the next one's first item
        w = (tile + 1) * 128 * ng - 1;
        continue;
      }
      item(uint32_t(mt.row0 + in_tile), c0);
    }
  }
}

// The warps of the vector form: one per (row, 256 columns), or with a skip per (m-tile row, 256
// columns) over every m-tile's 128 rows (at most one partial tile per expert beyond max_rows / 128).
int64_t vec_warps(int64_t max_rows, int E, int I, bool tiles) {
  return (tiles ? ((max_rows + 127) / 128 + E) * 128 : max_rows) * ((I + 255) / 256);
}

template <bool kQuant>
void launch_vec(int64_t warps, const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I,
                bool round_trip, bool ue8m0, bf16_raw* a, uint8_t* a8, float* sfa8, cudaStream_t stream,
                const SwigluSkip& skip, bool pdl) {
  const int grid = static_cast<int>(std::min<int64_t>((warps + 7) / 8, 132 * 16));
  if constexpr (!kQuant) {
    if (skip.fused.n > 0) {
      launch_kernel(intermediate_vec_kernel<false, true>, grid, 256, 0, stream, pdl, h, offsets, cnt, E, I,
                    round_trip, ue8m0, a, a8, sfa8, skip);
      return;
    }
  }
  launch_kernel(intermediate_vec_kernel<kQuant, false>, grid, 256, 0, stream, pdl, h, offsets, cnt, E, I, round_trip,
                ue8m0, a, a8, sfa8, skip);
}

}  // namespace

void quantize_intermediate(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I,
                           int64_t max_rows, bool ue8m0, uint8_t* a8, float* sfa8, cudaStream_t stream, bool pdl) {
  if (E <= 0 || max_rows <= 0) return;
  if (I % 16 != 0 || reinterpret_cast<uintptr_t>(h) % 16 != 0 || reinterpret_cast<uintptr_t>(a8) % 8 != 0 || !sfa8)
    throw UsageError("cutlass quantize_intermediate: needs intermediate % 16 == 0 (got " + std::to_string(I) +
                     "), 16-byte aligned h, 8-byte aligned codes and a scale buffer");
  const int64_t warps = vec_warps(max_rows, E, I, false);
  if (warps >= (int64_t(1) << 31))
    throw UsageError("cutlass quantize_intermediate: " + std::to_string(max_rows) + " rows exceed the 32-bit index");
  launch_vec<true>(warps, h, offsets, cnt, E, I, false, ue8m0, nullptr, a8, sfa8, stream, SwigluSkip{}, pdl);
  EPMOE_CUDA_CHECK_LAUNCH();
}

void swiglu(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I, int64_t max_rows,
            bool fp8_round_trip, bool ue8m0, bf16_raw* a, uint8_t* a8, float* sfa8, cudaStream_t stream,
            const SwigluSkip& skip, bool pdl) {
  if (E <= 0 || max_rows <= 0) return;
  // Both fp8 forms take a partial last block (its lanes past I add 0 to the amax, in both kernels).
  if ((a8 || fp8_round_trip) && I % 16 != 0)
    throw UsageError("cutlass swiglu: the fp8 intermediate needs intermediate % 16 == 0, got " + std::to_string(I));
  const bool skipping = skip.fused.n > 0;
  if (skipping && (skip.fused.n > RowRanges::kMax || !skip.tiles || !skip.num_tiles))
    throw UsageError("cutlass swiglu: skip needs 1.." + std::to_string(RowRanges::kMax) +
                     " ranges and the m-tile table, got n=" + std::to_string(skip.fused.n));
  const int64_t warps = vec_warps(max_rows, E, I, skipping);
  const bool vec = I % 8 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
                   (a8 ? reinterpret_cast<uintptr_t>(a8) % 8 == 0 : reinterpret_cast<uintptr_t>(a) % 16 == 0) &&
                   warps < (int64_t(1) << 31);
  if (skipping && !vec)
    throw UsageError("cutlass swiglu: skip needs intermediate % 8 == 0 and 16-byte aligned rows, got intermediate " +
                     std::to_string(I));
  if (vec) {
    launch_vec<false>(warps, h, offsets, cnt, E, I, fp8_round_trip, ue8m0, a, a8, sfa8, stream, skip, pdl);
  } else {
    const int64_t work = max_rows * fp8_blocks(I);
    const int grid = static_cast<int>(std::min<int64_t>((work + 7) / 8, 132 * 16));
    launch_kernel(swiglu_kernel, grid, 256, 0, stream, pdl, h, offsets, cnt, E, I, fp8_round_trip, ue8m0, a, a8, sfa8);
  }
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda::cutlass_engine
