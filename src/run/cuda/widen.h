// Widening of quantized expert weights to bf16 for the CUTLASS engine of the "cuda" runner: Hopper
// has no bf16 x fp8 and no fp4 tensor-core op, so fp8 weights meeting a bf16 operand and nvfp4
// weights are turned into bf16 in a bounded scratch buffer, a chunk of consecutive experts at a time,
// and then run through the bf16 grouped GEMM (engine_cutlass_bf16.cu).
//
// Values (the same as the mma.sync engine builds in its B fragments, engine_mma.cuh):
//   fp8  : bf16(e4m3 * fp32 tile scale), one rounding per weight;
//   nvfp4: bf16(e2m1 * e4m3 block scale), exact (at most 6 significant bits); the per-expert global
//          scale is NOT applied here: the GEMM's epilogue multiplies the fp32 accumulator by
//          1/gs (inverse_scales below, passed as the per-group alpha).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "epmoe/quant.h"
#include "epmoe/tensor.h"

namespace epmoe::cuda::widen {

// Default scratch bound (Tuning::widen_scratch_mb's default, 1024 MiB).
constexpr size_t kDefaultScratchBytes = size_t(1) << 30;

// Bytes of one expert of `m` widened to bf16 (rows * cols * 2).
size_t expert_bytes(const MatrixView& m);

// Experts per chunk that fit in `scratch_bytes`: at least 1 (one expert is the unit, even when it
// alone exceeds the bound), at most `experts`.
int chunk_experts(size_t scratch_bytes, size_t expert_bytes, int experts);

// out[e - e0][r][c] = widened m[e][r][c] for e in [e0, e0 + n). Experts whose rows[e] is 0 (the
// full per-expert count array, indexed by the absolute expert e; read on the device; null = widen
// all) are skipped: their GEMM gets no tiles and never reads the scratch. m must be fp8 or nvfp4 on
// the device; out 16-byte aligned.
void to_bf16(const MatrixView& m, int e0, int n, const int32_t* rows, bf16_raw* out, cudaStream_t stream);

// inv[e] = factor * (1 / gs[e]) (IEEE fp32 division, as the mma.sync engine computes it) for e <
// experts. A power-of-two factor (the paired nvfp4 GEMM's 2^8) scales the quotient exactly.
void inverse_scales(const float* gs, int experts, float* inv, cudaStream_t stream, float factor = 1.0f);

}  // namespace epmoe::cuda::widen
