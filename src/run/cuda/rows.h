// Row passes of the CUDA runner around its GEMMs: the routing tables (rows per expert, offsets,
// m-tiles), the permute of received slots into per-expert rows, the fp8 forms of the intermediate
// between the GEMMs, and the routing-weighted sum of the expert outputs back per slot. The bf16
// permute and the sum are HBM-bound; each has a vector form (16-byte rows: H % 8 == 0 and 16-byte
// aligned buffers) and a scalar fallback with the same arithmetic, so the two give the same bits.
// `pdl`: launched with programmatic dependent launch (core/cuda/pdl.cuh; tuning.pdl), the same
// results. Few pairs (S*K <= 65536) count and scan in one CTA (no memset, one launch).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/dispatch.h"
#include "run/cuda/engine.h"

namespace epmoe::cuda {

// cnt[e] = valid (slot, k) pairs of local expert e; offsets[e] = their first row (exclusive scan);
// fill[e] = 0 (the permute's counters); tiles / num_tiles[0] = the m-tiles of bm rows. cnt, offsets
// and fill hold E entries, tiles at least (S*K + bm - 1) / bm + E. With bm2 > 0 and tiles2, an
// expert whose rows make fewer m-tiles of bm2 rows than of bm (ties: bm) has its m-tiles of bm2
// rows in tiles2 / num_tiles[1] instead (the wide nvfp4 engine's two heights, one launch each).
void launch_count(const DispatchOutput& in, int bm, int32_t* cnt, int32_t* offsets, int32_t* fill, MTile* tiles,
                  int32_t* num_tiles, cudaStream_t st, bool pdl = false, int bm2 = 0, MTile* tiles2 = nullptr);
// launch_count (one table) where its single-CTA form applies (S*K <= 8192, E <= 8192), which then
// also claims every pair's row as the permutes do: pair_pos[i*K + k] = the row of valid slot i's
// pair k, or -1 for an id of no local expert (an invalid slot's entries are not written), and
// src_rows[row] = the slot the row comes from (rows [0, offsets[E-1] + cnt[E-1])). A decode GEMM1
// then reads its rows from the dispatch buffer through src_rows (GemmArgs::a_rows) and no permute
// runs. Returns false, launching nothing, where the pairs do not fit: use launch_count and a
// permute.
bool launch_count_claim(const DispatchOutput& in, int bm, int32_t* cnt, int32_t* offsets, int32_t* fill, MTile* tiles,
                        int32_t* num_tiles, int32_t* pair_pos, int32_t* src_rows, cudaStream_t st, bool pdl = false);

// fp8 dispatch into the fp8 GEMMs: the rows' e4m3 codes as they are into A8 [rows][H], their
// block-128 scales into sf[row * sf_row + kb * sf_block] (the wgmma engine's transposed matrix:
// sf_row 1, sf_block its leading dimension; CUTLASS's row-major one: ceil(H/128), 1); rows claimed
// as launch_permute_bf16 does. top_k above 32 throws UsageError.
void launch_permute_fp8_rows(const DispatchOutput& in, const int32_t* offsets, int32_t* fill, int32_t* pair_pos,
                             uint8_t* A8, float* sf, int64_t sf_row, int64_t sf_block, cudaStream_t st,
                             bool pdl = false);

// intermediate_quant = fp8 on h [max_rows][I] (rows [0, offsets[E-1] + cnt[E-1]) are used):
// to_fp8 writes e4m3 codes h8 and transposed block scales hs_t[kb * max_rows + row] (the wgmma fp8
// GEMM2's operand); the other rounds h in place through the same codes (the bf16 GEMM2's operand).
void launch_intermediate_to_fp8(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I,
                                bool ue8m0, int64_t max_rows, uint8_t* h8, float* hs_t, cudaStream_t st,
                                bool pdl = false);
void launch_intermediate_fp8(bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I, bool ue8m0,
                             int64_t max_rows, cudaStream_t st, bool pdl = false);

// A[pos] = bf16(activation of slot i) for every valid (slot i, k) of this rank, pos claimed from
// offsets[e] + fill[e] (atomic) and recorded in pair_pos[i * K + k] (-1: not a local expert).
// kperm: write the rows in the nvfp4 decode engine's K order instead (per 64-K block, natural column
// nvfp4_layout::kperm_src(p) at position p: the bytes kperm_nvfp4_tokens would leave), saving that
// pass's read and write of every row. Returns whether it did: only the vector form does (H % 64 ==
// 0, 16-byte aligned payload and A, H <= kPermuteKpermMaxH); otherwise the rows are natural and the
// caller runs kperm_nvfp4_tokens.
constexpr int kPermuteKpermMaxH = 24576;  // the row staged in 48 KB of shared memory
bool launch_permute_bf16(const DispatchOutput& in, const int32_t* offsets, int32_t* fill, int32_t* pair_pos,
                         bf16_raw* A, cudaStream_t st, bool pdl = false, bool kperm = false);

// y[slot] = bf16(sum over k ascending of w_k * o[pair_pos[slot][k]]) in fp32 without fma.
void launch_reduce(const DispatchOutput& in, const int32_t* pair_pos, const bf16_raw* o, bf16_raw* y, cudaStream_t st,
                   bool pdl = false);

}  // namespace epmoe::cuda
