// Weight preparation of runner "cuda", done once when a layer is built (CudaRunner::prepare, the
// Runner::prepare step): nvfp4 weights on the decode engine run fastest from a prepared copy
// (engine_wgmma_nvfp4_prepared.cu: each weight tile's stages contiguous, in the order the threads
// load them, the code bits permuted for a cheaper decode; the same bytes as data + scales, the same
// results bit for bit); fp8 W13's scales are reordered once for the CUTLASS one-GEMM SwiGLU
// instead of on every call.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/cuda/check.h"
#include "epmoe/format.h"
#include "epmoe/runner.h"

namespace epmoe::cuda {

// Writes the copies of w's nvfp4 matrices into w13 / w2 (grown as needed) and points
// w.w13.prepared / w.w2.prepared at them, for each matrix the engine takes (K % 128 == 0, W13 with
// I % 64 == 0); returns the bytes prepared (0 for other formats or shapes: nothing changes). The
// copies must be redone if the weights change; data and scales stay in use (large-M GEMMs widen
// from them). Enqueued on `stream` on the current device.
size_t prepare_nvfp4_weights(ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream);

// fp8 W13 where I % 64 == 0: its block scales in the order the fp8 one-GEMM SwiGLU reads them
// (cutlass_engine::glu_fp8_scales, one scale per 64 weight rows) into `scales` (grown as needed),
// w.w13.prepared pointed at them, so that a CUTLASS run skips that reordering launch (the same
// floats, so the same results). Returns their bytes; 0 for other formats or shapes (nothing
// changes). Must be redone if the scales change. Enqueued on `stream` on the current device.
size_t prepare_fp8_glu_scales(ExpertWeights& w, DeviceBuffer& scales, cudaStream_t stream);
// fp8 W13 and W2: their tile scales written onto each weight row (cutlass_engine::expand_fp8_scales,
// [E][K/128][N] fp32) into `rows13` / `rows2` (grown as needed), w.w2.prepared pointed at rows2,
// for the mixed-input GEMM of fp8 weights with a bf16 operand (CutlassPath::fp8w), so that its runs
// skip the per-call expansion (the same floats). The runner keeps which scales rows13 came from
// (W13's view has no second field). Returns their bytes; 0 for other formats. Must be redone if the
// scales change. Enqueued on `stream` on the current device; needs a build with CUTLASS.
size_t prepare_fp8_row_scales(ExpertWeights& w, DeviceBuffer& rows13, DeviceBuffer& rows2, cudaStream_t stream);
// nvfp4 W13 and W2 (both nvfp4, H and I multiples of 16): their paired copies
// (cutlass_engine::write_nvfp4_paired, one byte per weight: code + a nibble of its block scale)
// into `w13` / `w2` (grown as needed) for the mixed-input GEMM of nvfp4 weights (CutlassPath::nvfp4w).
// Nothing in w points at them: the runner keeps which data they came from. Returns their bytes, 0
// for other formats or shapes and where a block scale is NaN (which the copy cannot hold: such
// weights keep the widened path); synchronizes `stream` to learn that. With glu_order, W13's copy
// is in nvfp4_paired::glu_row's order (GEMM1 with SwiGLU in its epilogue; needs I % 8 == 0, which
// I % 16 gives). Must be redone if the weights change. Enqueued on `stream` on the current device;
// needs a build with CUTLASS.
size_t prepare_nvfp4_paired(const ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream,
                            bool glu_order = false);
// Bytes of those scales for E experts of hidden size H and intermediate size I (I % 64 == 0): one
// per 64 rows of W13 and 128-block of H.
inline size_t fp8_glu_scales_bytes(int E, int H, int I) {
  return size_t(E) * 2 * (I / 64) * fp8_blocks(H) * sizeof(float);
}

}  // namespace epmoe::cuda
