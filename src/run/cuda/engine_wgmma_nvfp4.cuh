// What the two nvfp4 register-decode wgmma kernels share (engine_wgmma_nvfp4.cu reads the weights
// through shared memory in their natural layout, engine_wgmma_nvfp4_prepared.cu straight into registers
// from the prepared layout): the tile geometry, the decode of one thread's 16 codes of a row into
// wgmma A fragments, the batch of wgmmas of one 64-K sub-block, and the epilogue. Both kernels run
// the same arithmetic in the same order, so their outputs are bitwise equal (tested).
#pragma once
#include "run/cuda/engine_wgmma.cuh"
#include "run/cuda/nvfp4_layout.h"
#include "run/cuda/wgmma_rs.cuh"

namespace epmoe::cuda::wgf4 {

constexpr int kBT = 32;       // tokens per m-tile (wgmma N)
constexpr int kRowsW = 128;   // weight rows per CTA tile
constexpr int kKS = 128;      // K values per stage
constexpr int kThreads = 128;
constexpr int kPreparedBlock = 9216;  // prepared bytes per (weight tile, 128-K stage): 8 KB codes + 1 KB scales
static_assert(kThreads == wg::kThreads && kRowsW == wg::kRowsW, "wg::persistent_grid sizes these kernels' grids too");

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ void zero(float (&acc)[2][16]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[h][i] = 0.f;
}

// Two e4m3 block scales of one row (low byte: sub-block 0's block, high byte: sub-block 1's) ->
// one bf16x2 per sub-block, the scale replicated into both halves, exactly scale * 2^118: times a
// decoded code (value * 2^-126) that is value * scale * 2^-8, exact and normal in bf16
// (tests/run/test_nvfp4_layout.cpp); the epilogue's kAccScale takes the 2^-8 back bit for bit.
__device__ __forceinline__ void scale_pair(uint32_t two, uint32_t (&s)[2]) {
  const uint32_t s2 = gemm::e4m3x2_to_bf16x2<nvfp4_layout::kScaleExp>(static_cast<uint16_t>(two));
  s[0] = prmt(s2, s2, 0x1010u);
  s[1] = prmt(s2, s2, 0x3232u);
}

// The 16 codes of one row and scale block (8 bytes) -> 8 bf16x2 of code * scale (times 2^-8);
// kPrepared: the words are in the prepared bit order (nvfp4_layout::prepare_word).
template <bool kPrepared = false>
__device__ __forceinline__ void decode16(uint32_t lo, uint32_t hi, uint32_t s2, uint32_t (&out)[8]) {
  uint32_t d[2][4];
  if constexpr (kPrepared) {
    nvfp4_layout::e2m1x8_to_bf16_prepared(lo, d[0]);
    nvfp4_layout::e2m1x8_to_bf16_prepared(hi, d[1]);
  } else {
    nvfp4_layout::e2m1x8_to_bf16(lo, d[0]);
    nvfp4_layout::e2m1x8_to_bf16(hi, d[1]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = gemm::bf16x2_mul(d[i >> 2][i & 3], s2);
}

// The 8 wgmmas of one 64-K sub-block: both m64 halves against the sub-block's token atom at
// `tokens` (SW128, N rows x 128 B), N tokens wide (the wide engine picks N per tile; its
// accumulators are acc[h][0, N / 2)). wa[h][q] holds rows (g, g + 8) of half h.
template <int N = kBT, int NR>
__device__ __forceinline__ void issue_batch(float (&acc)[2][NR], const uint32_t (&wa)[2][2][8], uint32_t tokens) {
  static_assert(N / 2 <= NR, "the accumulators hold N / 2 values per half");
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

// A finished tile's accumulators to its output rows (wg::store_tile, times 2^8 / global scale;
// fused GEMM1 in the K order GEMM2 reads when out_kperm), then zeroed for the next tile. The
// caller has waited for every wgmma.
__device__ __forceinline__ void store_tile(const GemmArgs& p, const wg::TileWalk::Tile& cur, float (&acc)[2][16],
                                           int warp, int lane) {
  wg::reg_fence(acc[0]);
  wg::reg_fence(acc[1]);
  wg::store_tile(p, cur, acc, warp, lane, nvfp4_layout::kAccScale / p.W.global_scale[cur.mt.expert], p.out_kperm);
  zero(acc);
}

}  // namespace epmoe::cuda::wgf4
