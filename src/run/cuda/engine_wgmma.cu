// Instantiations of the decode wgmma engine (bf16 and fp8 x fp8), one translation unit; each call
// runs the plain or the deferred-wait pipeline (engine_wgmma.cuh) as GemmArgs::wgmma_defer says.
#include "run/cuda/engine_wgmma.cuh"

namespace epmoe::cuda {

static_assert(kWgmmaBlockM == wg::kBT, "the runner's decode m-tile must match the wgmma token tile");

// Deferred by default (Tuning::wgmma_defer): bitwise the same as plain
// (tests/run/cuda/test_engine_wgmma.cpp) and faster on an H200 (DeepSeek-V3 experts, 128 local):
// fp8 x fp8 M = 128 / 2048 2.075 -> 1.800 / 1.992 -> 1.843 ms, bf16 3.154 -> 3.125 / 3.231 ->
// 3.181 ms.
void launch_grouped_gemm_wgmma_bf16(const GemmArgs& a, cudaStream_t stream) {
  if (a.wgmma_defer) wg::launch<false, true>(a, stream);
  else wg::launch<false, false>(a, stream);
}
void launch_grouped_gemm_wgmma_fp8(const GemmArgs& a, cudaStream_t stream) {
  if (a.wgmma_defer) wg::launch<true, true>(a, stream);
  else wg::launch<true, false>(a, stream);
}

}  // namespace epmoe::cuda
