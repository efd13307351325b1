// CUTLASS engine, fp8 block-scaled swap-AB with 96-wide token tiles (engine_cutlass_swap.cuh);
// reached through grouped_gemm_fp8_swap (engine_cutlass_swap_fp8.cu), which checks the arguments.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_swap.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t fp8_swap_n96_workspace_bytes(int experts, int sms) {
  return workspace_bytes<swap::Fp8<96>::Gemm, true, false, true>(experts, sms);
}

void grouped_gemm_fp8_swap_n96(const Grouped& g, cudaStream_t stream) {
  run<swap::Fp8<96>::Gemm, true, false, true>(g, "fp8 swap-AB (96-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
