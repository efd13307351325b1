// CUTLASS engine, bf16 swap-AB with 192-wide token tiles (engine_cutlass_swap.cuh);
// reached through grouped_gemm_bf16_swap (engine_cutlass_swap_bf16.cu), which checks the arguments.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_swap.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t bf16_swap_n192_workspace_bytes(int experts, int sms) {
  return workspace_bytes<swap::Bf16<192>::Gemm, false, false, true>(experts, sms);
}

void grouped_gemm_bf16_swap_n192(const Grouped& g, cudaStream_t stream) {
  run<swap::Bf16<192>::Gemm, false, false, true>(g, "bf16 swap-AB (192-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
