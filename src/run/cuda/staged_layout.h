// Shared-memory layout of the staged decode-GEMM epilogue (wg::store_tile_staged in
// engine_wgmma.cuh): where each lane's stmatrix rows and 16-byte read-backs fall, as integer
// functions the host tests check (tests/run/test_staged_layout.cpp: every value reaches the output
// position store_tile gives it, and no access pattern has a bank conflict).
#pragma once

#include "epmoe/numeric.h"  // EPMOE_HD

namespace epmoe::cuda::staged_layout {

// GEMM2 (non-fused): a warp-private buffer of 32 token rows x 64 bytes per pass. Row q holds the
// warp's four 8-column chunks c = 2h + hh (weight rows 64h + 16 warp + 8hh .. +7), chunk c at
// 16-byte slot c ^ ((q >> 1) & 3): the 8 rows one stmatrix phase writes (q = 8g .. 8g+7, one c)
// and the 8 (row, chunk) pairs of one quarter-warp's read-back (q = 2 rows, c = 0..3) fall on 8
// distinct 16-byte bank groups.
constexpr int kRowBytes = 64;
constexpr int kPassTokens = 32;
constexpr int kWarpBytes = kPassTokens * kRowBytes;
EPMOE_HD constexpr int gemm2_offset(int q, int c) { return kRowBytes * q + 16 * (c ^ ((q >> 1) & 3)); }
// Output column (from the tile's n0) of chunk c of warp `warp`.
EPMOE_HD constexpr int gemm2_column(int warp, int c) { return 64 * (c >> 1) + 16 * warp + 8 * (c & 1); }

}  // namespace epmoe::cuda::staged_layout
