// The nvfp4 register-decode wgmma engine for many rows per expert ("wide"): the prepared kernel's
// weights, decode, K order and epilogue (engine_wgmma_nvfp4_prepared.cu), but m-tiles of up to 128
// tokens, each weight tile decoded once per 128 tokens instead of once per 32.
//
// Why (measured, bench/results/2026-12-01-session10-h200.md): the 32-token decode engine streams
// and decodes an expert's weights once per 32 rows, so at 128 rows per expert (DeepSeek-V3, M
// 16384) it takes 5.47 ms, and above 192 rows the runner widened nvfp4 to bf16 in scratch for
// CUTLASS (10.3 ms at M 32768, 22.4 at 131072, against 4.9 / 19.5 for bf16 weights). Here the
// weights are still read from the prepared copy straight into registers and decoded there (no
// widened copy), and each decoded A fragment feeds m64nNk16 wgmmas with N up to 128: per 128-K
// stage a CTA does 4x the MMA work of the decode engine for the same decode and weight bytes.
//
// Token-tile width per tile: the tile table is built with 128-row m-tiles, and each tile runs the
// narrowest of N = 32, 64, 96, 128 that covers its rows (wgrs::wgmma_bf16_rA<N>), so an expert's
// last, partial m-tile costs at most 31 padded token columns of MMA rather than up to 127. The
// choice is per tile and uniform across the CTA, and every width reads the same accumulator
// registers (the m64nN fragment is a prefix of the m64n128 one).
//
// Arithmetic: the same A fragments (decoded weights times block scale, times 2^-8), the same
// token K order, the same k16 steps in the same order into fp32 accumulators, the same epilogue
// scale: the outputs equal the 32-token engines' bit for bit (tested), as long as a wgmma's sum
// for one output column does not depend on N (which the test checks on the hardware it runs on).
//
// Pipeline (one warpgroup, 128 weight rows, 2 CTAs per SM): token stages [2 sub-blocks][128 rows]
// [128 B] SW128 (32 KB) in a cp.async ring of 3 slots, one stage ahead; weights one stage ahead
// in a register ring of two sets (128 accumulators leave room for no more); one A-register set,
// so a sub-block's decode waits for the previous sub-block's wgmmas, and the other CTA on the SM
// keeps the tensor cores busy meanwhile.
#include "run/cuda/engine_wgmma_nvfp4.cuh"
#include "run/cuda/wgmma_rs.cuh"

namespace epmoe::cuda::wgf4w {
namespace {

using namespace wgf4;
using gemm::cp_async16;
using gemm::cp_commit;
using gemm::cp_wait;
using gemm::smem_u32;

constexpr int kTN = kWgmmaWideBlockM;  // tokens per m-tile at most (the tile table's bm)
constexpr int kNR = kTN / 2;           // accumulators per m64 half and thread
constexpr int kGroups = 2;             // warpgroups per CTA, each on its own 128-row weight tile
constexpr int kCtaThreads = kGroups * kThreads;
constexpr int kAtom = kTN * 128;       // one 64-K sub-block of tokens: [kTN rows][128 B], SW128
constexpr int kTokBytes = 2 * kAtom;   // a stage's tokens
constexpr int kSlot = kTokBytes + kGroups * kPreparedBlock;  // + each warpgroup's prepared block
constexpr int kAhead = 2;              // stages loaded ahead of the one computed
constexpr int kSlots = kAhead + 2;     // + the stage computed and the previous one (its last wgmmas)
constexpr int kSmem = kSlot * kSlots + 1024;
static_assert(kTN == 64 || kTN == 128, "token-tile widths the issue switch covers");
static_assert(kTN % (kCtaThreads / 4) == 0, "whole passes of token rows");
static_assert(kSlot % 1024 == 0, "SW128 token atoms need 1024-byte alignment");

__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds8(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

__device__ __forceinline__ void zero(float (&acc)[2][kNR]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < kNR; ++i) acc[h][i] = 0.f;
}

template <int N>
__device__ __forceinline__ void issue_n(float (&acc)[2][kNR], const uint32_t (&wa)[2][2][8], uint32_t tokens) {
  wg::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint64_t db = wg::desc_sw128(tokens + j * 32);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t a[4] = {wa[h][0][2 * j], wa[h][1][2 * j], wa[h][0][2 * j + 1], wa[h][1][2 * j + 1]};
      wgrs::wgmma_bf16_rA<N>(acc[h], a, db);
    }
  }
  wg::wgmma_commit();
}

// The 8 wgmmas of one 64-K sub-block at the tile's width n (32, 64, 96 or 128).
__device__ __forceinline__ void issue_batch(float (&acc)[2][kNR], const uint32_t (&wa)[2][2][8], uint32_t tokens,
                                            int n) {
  if constexpr (kTN == 64) {
    if (n == 32) issue_n<32>(acc, wa, tokens);
    else issue_n<64>(acc, wa, tokens);
  } else {
    switch (n) {
      case 32: issue_n<32>(acc, wa, tokens); break;
      case 64: issue_n<64>(acc, wa, tokens); break;
      case 96: issue_n<96>(acc, wa, tokens); break;
      default: issue_n<128>(acc, wa, tokens); break;
    }
  }
}

__device__ __forceinline__ int tile_width(int rows) { return min(kTN, (rows + 31) & ~31); }

__global__ void __launch_bounds__(kCtaThreads, 1) nvfp4_wide_kernel(GemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;

  // Warpgroup wgi works on weight tile (the group's first n-tile) + wgi; inside it, thread tid
  // plays the prepared kernel's thread tid (its rows, its bytes of each prepared block).
  const int cta_tid = threadIdx.x, wgi = cta_tid / kThreads, tid = cta_tid % kThreads, lane = tid & 31,
            warp = tid >> 5;
  const int K = p.K, KT = K / kKS;
  const wg::TileWalk walk(p, kGroups);
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KT;
  using Cur = wg::TileWalk::Tile;
  const uint8_t* prep = static_cast<const uint8_t*>(p.W.prepared);

  // Token loads (both warpgroups): thread (row tr + 64 i, quarter tq) copies four 16-byte chunks
  // of its row per pass i: quarter tq is bytes 64 tq .. of the stage's 256-byte row, i.e.
  // sub-block tq / 2, chunks 4 (tq % 2) .. +3. Rows past the tile's rows are zero-filled up to
  // its width (their token columns are computed and never stored); rows past the width are not
  // loaded.
  constexpr int kRowsPerPass = kCtaThreads / 4;
  const int tr = cta_tid >> 2, tq = cta_tid & 3;
  const uint32_t a_off = uint32_t((tq >> 1) * kAtom + tr * 128);
  const int a_m0 = 4 * (tq & 1), a_sw = tr & 7;
  const int64_t a_pass = int64_t(kRowsPerPass) * K * 2;  // bytes between rows tr and tr + kRowsPerPass
  // Weight loads: this warpgroup's prepared block of the stage, copied as it is: thread tid its own
  // four 16-byte code chunks (the ones it decodes), threads 0-63 the 1 KB of scales.
  const uint32_t w_off = uint32_t(kTokBytes + wgi * kPreparedBlock);
  const uint8_t* la = nullptr;  // row tr of the tile, quarter tq, at k = 0
  const uint8_t* lw = nullptr;  // this warpgroup's weight tile, stage 0
  int a_rows = 0, a_width = 0;
  auto enter = [&](const Cur& c) {
    a_rows = c.mt.rows;
    a_width = tile_width(c.mt.rows);
    la = reinterpret_cast<const uint8_t*>(p.A + int64_t(c.mt.row0 + tr) * K) + tq * 64;
    // Past NT (the odd last group) this warpgroup re-reads tile NT - 1 and stores nothing.
    const int nt = min(c.n0 / walk.n_per_tile + wgi, walk.NT - 1);
    lw = prep + (int64_t(c.mt.expert) * walk.NT + nt) * int64_t(KT) * kPreparedBlock;
  };
  wg::LoadCursor lc;
  lc.start(walk, enter);
  auto load_stage = [&]() {
    const uint32_t st = base + uint32_t(lc.slot) * kSlot;
    const uint8_t* A = la + int64_t(lc.kt) * kKS * 2;
#pragma unroll
    for (int g = 0; g < kTN / kRowsPerPass; ++g) {
      const int row = tr + kRowsPerPass * g;
      if (row < a_width) {
        const bool ok = row < a_rows;
        const uint8_t* src = ok ? A + g * a_pass : A;  // a masked copy reads nothing
#pragma unroll
        for (int i = 0; i < 4; ++i)
          cp_async16(st + a_off + g * kRowsPerPass * 128 + (((a_m0 + i) ^ a_sw) << 4), src + i * 16, ok);
      }
    }
    const uint8_t* W = lw + int64_t(lc.kt) * kPreparedBlock;
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async16(st + w_off + i * 2048 + tid * 16, W + i * 2048 + tid * 16, true);
    if (tid < 64) cp_async16(st + w_off + 8192 + tid * 16, W + 8192 + tid * 16, true);
    lc.advance(KT, kSlots, walk, enter);
  };

  float acc[2][kNR];
  zero(acc);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) load_stage();
    cp_commit();
  }

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int width = my_tiles > 0 ? tile_width(cur.mt.rows) : 0;
  int c_kt = 0, c_slot = 0, c_local = 0;
  uint32_t wa[2][2][8];
  for (int64_t s = 0; s < steps; ++s) {
    const int kt = c_kt, slot = c_slot;
    if (++c_kt == KT) c_kt = 0;
    if (++c_slot == kSlots) c_slot = 0;
    cp_wait<kAhead - 1>();
    wg::fence_proxy_async();
    // Stage s is visible to all; every warp has waited for the wgmmas of step s - 2, whose slot
    // the load below takes.
    __syncthreads();
    if (s + kAhead < steps) load_stage();
    cp_commit();
    const uint32_t st = base + uint32_t(slot) * kSlot;
    const uint32_t w = st + w_off;
    uint4 c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = lds16(w + i * 2048 + tid * 16);
    const uint2 sc = lds8(w + 8192 + tid * 8);
    uint32_t scl[2][2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 2; ++q) scale_pair((h ? sc.y : sc.x) >> (16 * q), scl[h][q]);
#pragma unroll
    for (int sb = 0; sb < 2; ++sb) {
      wg::wgmma_wait0();  // the previous batch still reads wa
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = c[2 * sb + h];
        decode16<true>(v.x, v.y, scl[h][0][sb], wa[h][0]);
        decode16<true>(v.z, v.w, scl[h][1][sb], wa[h][1]);
      }
      issue_batch(acc, wa, st + sb * kAtom, width);
    }
    if (kt == KT - 1) {
      wg::wgmma_wait0();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kNR; ++i) asm volatile("" : "+f"(acc[h][i])::"memory");
      const Cur mine{cur.mt, cur.n0 + wgi * walk.n_per_tile};
      if (mine.n0 / walk.n_per_tile < walk.NT)
        wg::store_tile(p, mine, acc, warp, lane, nvfp4_layout::kAccScale / p.W.global_scale[cur.mt.expert],
                       p.out_kperm);
      zero(acc);
      if (++c_local < my_tiles) {
        cur = walk.at(c_local);
        width = tile_width(cur.mt.rows);
      }
    }
  }
  wg::wgmma_wait0();
  cp_wait<0>();
}

}  // namespace
}  // namespace epmoe::cuda::wgf4w

namespace epmoe::cuda {

void launch_grouped_gemm_wgmma_nvfp4_wide(const GemmArgs& a, cudaStream_t stream) {
  using namespace wgf4w;
  if (!a.W.prepared || !a.W.global_scale || !a.A)
    throw UsageError("cuda runner (wgmma nvfp4, wide): needs prepared weights, global_scale and bf16 A");
  const KernelFit fit = fit_kernel(reinterpret_cast<const void*>(nvfp4_wide_kernel), kCtaThreads, kSmem);
  const int n_per_tile = a.fused ? wgf4::kRowsW / 2 : wgf4::kRowsW;
  const int64_t groups = ((a.N + n_per_tile - 1) / n_per_tile + kGroups - 1) / kGroups;
  const int grid = static_cast<int>(std::min<int64_t>(int64_t(a.max_tiles) * groups, int64_t(fit.sms) * fit.per_sm));
  if (grid <= 0) return;
  nvfp4_wide_kernel<<<grid, kCtaThreads, kSmem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
