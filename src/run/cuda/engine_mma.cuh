// The grouped GEMM kernel (mma.sync m16n8k16 bf16, fp32 accumulation, cp.async multi-stage
// pipeline). Weights stay in their storage format in shared memory and are widened to bf16 while
// the B fragments are built:
//   bf16  : ldmatrix straight from a swizzled tile;
//   fp8   : e4m3 -> fp32, times the fp32 128x128 tile scale, rounded to bf16 (one rounding per
//           weight);
//   nvfp4 : e2m1 (shared-memory table) * e4m3 block scale, exact in bf16; the per-expert global
//           scale divides the fp32 accumulator in the epilogue.
// One kernel template per weight format is instantiated in gemm_<format>.cu (parallel builds).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "run/cuda/engine.h"
#include "run/cuda/silu.cuh"

namespace epmoe::cuda::gemm {

constexpr int kBN = 128, kBK = 64, kThreads = 256;

template <int BM>
struct Shape;
template <>
struct Shape<128> {
  static constexpr int WARPS_M = 2, WARPS_N = 4;
};
template <>
struct Shape<32> {
  static constexpr int WARPS_M = 1, WARPS_N = 8;
};

// Bytes of one B row in shared memory (16-byte padding breaks bank conflicts for the byte formats;
// bf16 rows are XOR-swizzled instead because ldmatrix reads them).
template <WeightFormat WF>
constexpr int b_row_bytes() { return WF == WeightFormat::bf16 ? kBK * 2 : WF == WeightFormat::fp8 ? kBK + 16 : kBK / 2 + 16; }

// Pipeline depth: nvfp4 carries the fewest bytes per stage, so it needs more stages to keep as
// many weight bytes in flight (decode streams weights; about 80-100 KB of smem per CTA).
template <int BM, WeightFormat WF>
constexpr int stages() {
  if (BM == 32) return WF == WeightFormat::nvfp4 ? 8 : 4;
  return WF == WeightFormat::nvfp4 ? 4 : 3;
}

template <int BM, WeightFormat WF>
struct Smem {
  static constexpr int A_BYTES = BM * kBK * 2;
  static constexpr int B_BYTES = kBN * b_row_bytes<WF>();
  static constexpr int S_BYTES = WF == WeightFormat::nvfp4 ? kBN * 4 : 0;  // 4 e4m3 scales / row / stage
  static constexpr int STAGE = A_BYTES + B_BYTES + S_BYTES;
  static constexpr int TOTAL = STAGE * stages<BM, WF>();
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
// Streaming register loads (read once: no L1 allocation, the read-only path): the prepared nvfp4
// engine's weight blocks.
__device__ __forceinline__ uint4 ldg_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 128-byte rows of eight 16-byte chunks, chunk c of row r stored at c ^ (r & 7).
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two e4m3 codes (low byte = lower k) to bf16x2, exactly: the hardware cvt gives f16x2 (every
// e4m3 value is a normal f16 or zero), then the f16 fields are re-biased into bf16 (3 mantissa
// bits used, so the shift loses nothing and no bit leaks between the halves). kExtraExp > 0 gives
// code * 2^kExtraExp instead (the nvfp4 decode engine's scaled block scales), still exact while
// 448 * 2^kExtraExp < 2^128.
template <uint32_t kExtraExp = 0>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t two) {
  static_assert(kExtraExp <= 118, "448 * 2^kExtraExp must stay finite in bf16");
  constexpr uint32_t kBias = (112u + kExtraExp) << 7;  // f16 -> bf16 exponent re-bias
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const uint32_t x = uint32_t(h.x) | (uint32_t(h.y) << 16);
  const uint32_t m3 = (x & 0x7fff7fffu) >> 3;
  return (x & 0x80008000u) | (m3 + ((kBias | (kBias << 16)) & __vcmpne2(m3, 0u)));
}
// Two e4m3 codes (low byte = lower k) to bf16x2 of code * scale, through fp32 (measured faster
// here than the exact bf16 re-bias plus a bf16x2 multiply, and it keeps the scale in fp32).
__device__ __forceinline__ uint32_t fp8x2_scaled(uint16_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * scale, f.y * scale);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// e2m1 code -> bf16 bits (sign in bit 3).
__device__ __forceinline__ uint32_t e2m1_bf16(uint32_t c) {
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  const uint32_t mag = e ? ((126u + e) << 7) | (m << 6) : (m ? 0x3f00u : 0u);
  return mag | ((c & 8u) << 12);
}

template <int BM, WeightFormat WF>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(GemmArgs p) {
  using S = Shape<BM>;
  constexpr int WM = BM / S::WARPS_M, WN = kBN / S::WARPS_N, MI = WM / 16, NI = WN / 8;
  constexpr int STAGES = stages<BM, WF>();
  extern __shared__ __align__(128) uint8_t smem[];
  // nvfp4: byte of two e2m1 codes -> bf16x2 (low nibble in the low half).
  __shared__ uint32_t lut4[WF == WeightFormat::nvfp4 ? 256 : 1];
  if constexpr (WF == WeightFormat::nvfp4) {
    lut4[threadIdx.x] = e2m1_bf16(threadIdx.x & 0xfu) | (e2m1_bf16(threadIdx.x >> 4) << 16);
    __syncthreads();
  }

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / S::WARPS_N, wn = warp % S::WARPS_N;
  const int K = p.K, KT = K / kBK;
  const int rows_w = p.W.rows, cols_w = p.W.cols;
  const int n_per_tile = p.fused ? kBN / 2 : kBN;
  const int NT = (p.N + n_per_tile - 1) / n_per_tile;
  const int total = *p.num_tiles * NT;

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const MTile mt = p.tiles[tile / NT];
    const int nt = tile % NT;
    const int n0 = nt * n_per_tile;
    const int e = mt.expert;

    // Source row of W for B-tile row r (fused: gate/up interleaved so that every warp holds both
    // halves of the same intermediate columns).
    auto w_row = [&](int r) -> int {
      if (!p.fused) return n0 + r;
      const int half = WN / 2, w = r % WN;
      return (w < half ? 0 : p.N) + n0 + (r / WN) * half + (w % half);
    };

    auto load_stage = [&](int slot, int kt) {
      uint8_t* st = smem + slot * Smem<BM, WF>::STAGE;
      const int k0 = kt * kBK;
      // A: BM rows x 8 chunks of 16 bytes.
      for (int i = tid; i < BM * 8; i += kThreads) {
        const int r = i >> 3, c = i & 7;
        const bool ok = r < mt.rows;
        const bf16_raw* src = p.A + int64_t(mt.row0 + (ok ? r : 0)) * K + k0 + c * 8;
        cp_async16(smem_u32(st + swz(r, c)), src, ok);
      }
      uint8_t* sb = st + Smem<BM, WF>::A_BYTES;
      if constexpr (WF == WeightFormat::bf16) {
        const bf16_raw* W = static_cast<const bf16_raw*>(p.W.data) + int64_t(e) * rows_w * cols_w;
        for (int i = tid; i < kBN * 8; i += kThreads) {
          const int r = i >> 3, c = i & 7;
          const int wr = w_row(r);
          const bool ok = wr < rows_w && (p.fused || n0 + r < p.N);
          cp_async16(smem_u32(sb + swz(r, c)), W + int64_t(ok ? wr : 0) * cols_w + k0 + c * 8, ok);
        }
      } else if constexpr (WF == WeightFormat::fp8) {
        const uint8_t* W = static_cast<const uint8_t*>(p.W.data) + int64_t(e) * rows_w * cols_w;
        for (int i = tid; i < kBN * 4; i += kThreads) {
          const int r = i >> 2, c = i & 3;
          const int wr = w_row(r);
          const bool ok = wr < rows_w && (p.fused || n0 + r < p.N);
          cp_async16(smem_u32(sb + r * b_row_bytes<WF>() + c * 16), W + int64_t(ok ? wr : 0) * cols_w + k0 + c * 16, ok);
        }
      } else {
        const uint8_t* W = static_cast<const uint8_t*>(p.W.data) + int64_t(e) * rows_w * (cols_w / 2);
        const uint8_t* Sc = static_cast<const uint8_t*>(p.W.scales) + int64_t(e) * rows_w * (cols_w / 16);
        uint8_t* ss = sb + Smem<BM, WF>::B_BYTES;
        for (int i = tid; i < kBN * 3; i += kThreads) {
          const int r = i % kBN, c = i / kBN;  // c = 0, 1: data chunks; 2: the row's 4 scales
          const int wr = w_row(r);
          const bool ok = wr < rows_w && (p.fused || n0 + r < p.N);
          const int64_t row = ok ? wr : 0;
          if (c < 2)
            cp_async16(smem_u32(sb + r * b_row_bytes<WF>() + c * 16), W + row * (cols_w / 2) + k0 / 2 + c * 16, ok);
          else
            cp_async4(smem_u32(ss + r * 4), Sc + row * (cols_w / 16) + k0 / 16, ok);
        }
      }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load_stage(s, s);
      cp_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
      cp_wait<STAGES - 2>();
      __syncthreads();
      {
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_stage(nk % STAGES, nk);
        cp_commit();
      }
      const uint8_t* st = smem + (kt % STAGES) * Smem<BM, WF>::STAGE;
      const uint8_t* sb = st + Smem<BM, WF>::A_BYTES;
      // fp8: one 128x128 scale per (row block, k block); a warp's rows sit in one block per half.
      float sc_lo = 1.f, sc_hi = 1.f;
      if constexpr (WF == WeightFormat::fp8) {
        const float* Sc = static_cast<const float*>(p.W.scales);
        const int split = p.W.row_split;
        const int rb = fp8_tile_rows(rows_w, split), cb = (cols_w + 127) / 128;
        const int kb = (kt * kBK) / 128;
        const int r_lo = w_row(wn * WN), r_hi = w_row(wn * WN + WN - 1);
        sc_lo = Sc[(int64_t(e) * rb + fp8_tile_row(min(r_lo, rows_w - 1), split)) * cb + kb];
        sc_hi = Sc[(int64_t(e) * rb + fp8_tile_row(min(r_hi, rows_w - 1), split)) * cb + kb];
      }
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          const int r = wm * WM + mi * 16 + (lane & 15);
          ldmatrix_x4(a[mi], smem_u32(st + swz(r, kk * 2 + (lane >> 4))));
        }
        uint32_t b[NI][2];
        if constexpr (WF == WeightFormat::bf16) {
#pragma unroll
          for (int ni = 0; ni < NI; ni += 2) {
            const int r = wn * WN + ni * 8 + (lane & 7) + ((lane >> 4) << 3);
            uint32_t t[4];
            ldmatrix_x4(t, smem_u32(sb + swz(r, kk * 2 + ((lane >> 3) & 1))));
            b[ni][0] = t[0];
            b[ni][1] = t[1];
            b[ni + 1][0] = t[2];
            b[ni + 1][1] = t[3];
          }
        } else if constexpr (WF == WeightFormat::fp8) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const int r = wn * WN + ni * 8 + (lane >> 2);
            const uint8_t* row = sb + r * b_row_bytes<WF>() + kk * 16 + 2 * (lane & 3);
            const float s = ni < NI / 2 ? sc_lo : sc_hi;  // fused: gate / up half; else lo == hi
            b[ni][0] = fp8x2_scaled(*reinterpret_cast<const uint16_t*>(row), s);
            b[ni][1] = fp8x2_scaled(*reinterpret_cast<const uint16_t*>(row + 8), s);
          }
        } else {
          const uint8_t* ss = sb + Smem<BM, WF>::B_BYTES;
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const int r = wn * WN + ni * 8 + (lane >> 2);
            const uint8_t* row = sb + r * b_row_bytes<WF>() + kk * 8 + (lane & 3);
            const uint32_t sc = ss[r * 4 + kk];
            const uint32_t s2 = e4m3x2_to_bf16x2(static_cast<uint16_t>(sc | (sc << 8)));
            b[ni][0] = bf16x2_mul(lut4[row[0]], s2);  // e2m1 * e4m3 is exact in bf16
            b[ni][1] = bf16x2_mul(lut4[row[4]], s2);
          }
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) mma_bf16(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
      }
    }
    cp_wait<0>();
    __syncthreads();  // the next tile's prologue overwrites stages this one may still read

    // Epilogue.
    const float inv_gs = WF == WeightFormat::nvfp4 ? 1.0f / p.W.global_scale[e] : 1.0f;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WM + mi * 16 + (lane >> 2) + h * 8;
        if (r >= mt.rows) continue;
        bf16_raw* orow = p.out + int64_t(mt.row0 + r) * p.N;
        if (p.fused) {
#pragma unroll
          for (int ni = 0; ni < NI / 2; ++ni) {
            const int j = n0 + wn * (WN / 2) + ni * 8 + 2 * (lane & 3);
            float v[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const float g = acc[mi][ni][h * 2 + q] * inv_gs;
              const float u = acc[mi][ni + NI / 2][h * 2 + q] * inv_gs;
              v[q] = silu(g) * u;
            }
            if (j < p.N) *reinterpret_cast<uint32_t*>(orow + j) = pack_bf16(v[0], v[1]);
          }
        } else {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const int n = n0 + wn * WN + ni * 8 + 2 * (lane & 3);
            if (n < p.N)
              *reinterpret_cast<uint32_t*>(orow + n) =
                  pack_bf16(acc[mi][ni][h * 2] * inv_gs, acc[mi][ni][h * 2 + 1] * inv_gs);
          }
        }
      }
  }
}

template <int BM, WeightFormat WF>
void launch_bm(const GemmArgs& a, cudaStream_t stream) {
  constexpr int smem = Smem<BM, WF>::TOTAL;
  const KernelFit fit = fit_kernel(reinterpret_cast<const void*>(grouped_gemm_kernel<BM, WF>), kThreads, smem);
  const int sms = fit.sms, per_sm = fit.per_sm;
  const int n_per_tile = a.fused ? kBN / 2 : kBN;
  const int64_t work = int64_t(a.max_tiles) * ((a.N + n_per_tile - 1) / n_per_tile);
  const int grid = static_cast<int>(std::min<int64_t>(work, int64_t(sms) * per_sm));
  if (grid <= 0) return;
  grouped_gemm_kernel<BM, WF><<<grid, kThreads, smem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}

template <WeightFormat WF>
void launch(const GemmArgs& a, int bm, cudaStream_t stream) {
  check_no_a_rows(a, "cuda runner (mma.sync)");
  if (a.K % kBK != 0)
    throw UsageError("cuda runner: GEMM K=" + std::to_string(a.K) + " is not a multiple of 64; the CUDA runner needs "
                     "hidden and intermediate sizes that are");
  if (a.fused && a.N % 64 != 0)
    throw UsageError("cuda runner: intermediate=" + std::to_string(a.N) + " is not a multiple of 64");
  if (bm == 32)
    launch_bm<32, WF>(a, stream);
  else
    launch_bm<128, WF>(a, stream);
}

}  // namespace epmoe::cuda::gemm
