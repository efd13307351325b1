// Instantiations of the decode wgmma engine (bf16 and fp8 x fp8), one translation unit.
#include "run/cuda/gemm_wgmma.cuh"

namespace epmoe::cuda {

static_assert(kWgmmaBlockM == wg::kBT, "the runner's decode m-tile must match the wgmma token tile");

void launch_grouped_gemm_wgmma_bf16(const GemmArgs& a, cudaStream_t stream) { wg::launch<false>(a, stream); }
void launch_grouped_gemm_wgmma_fp8(const GemmArgs& a, cudaStream_t stream) { wg::launch<true>(a, stream); }

}  // namespace epmoe::cuda
