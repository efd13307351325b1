// silu(g) = g / (1 + e^-g) as every CUDA engine computes it (decode epilogues, SwiGLU passes,
// the CUTLASS SwiGLU epilogue), so that engines agree with each other bit for bit.
//
// Fast division (MUFU.RCP and a multiply) instead of an IEEE one: the IEEE division with its range
// check and slow path made the fp8 SwiGLU pass compute bound (ncu: SM 73% busy, DRAM 33%, 208 us at
// M 32768; bench/results/history-runner.md). __expf already made silu differ from the reference by
// a few ulp; the runner's tolerance covers both. Edge cases: g < -88 gives 1 + e^-g = inf (or >=
// 2^126), where __fdividef returns -0 / 0, as the exact result rounds to; +inf gives inf, NaN NaN.
#pragma once

namespace epmoe::cuda {

__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

}  // namespace epmoe::cuda
