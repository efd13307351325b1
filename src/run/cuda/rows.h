// Row passes of the CUDA runner around its GEMMs: the permute of received slots into per-expert bf16
// rows and the routing-weighted sum of the expert outputs back per slot. Both are HBM-bound; each
// has a vector form (16-byte rows: H % 8 == 0 and 16-byte aligned buffers) and a scalar fallback
// with the same arithmetic, so the two give the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/dispatch.h"

namespace epmoe::cuda {

// A[pos] = bf16(activation of slot i) for every valid (slot i, k) of this rank, pos claimed from
// offsets[e] + fill[e] (atomic) and recorded in pair_pos[i * K + k] (-1: not a local expert).
void launch_permute_bf16(const DispatchOutput& in, const int32_t* offsets, int32_t* fill, int32_t* pair_pos,
                         bf16_raw* A, cudaStream_t st);

// y[slot] = bf16(sum over k ascending of w_k * o[pair_pos[slot][k]]) in fp32 without fma.
void launch_reduce(const DispatchOutput& in, const int32_t* pair_pos, const bf16_raw* o, bf16_raw* y, cudaStream_t st);

}  // namespace epmoe::cuda
