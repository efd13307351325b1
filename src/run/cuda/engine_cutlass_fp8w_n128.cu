// CUTLASS engine, fp8 weights x bf16 rows with 128-wide token tiles (engine_cutlass_fp8w.cuh);
// reached through grouped_gemm_fp8w (engine_cutlass_fp8w.cu), which checks the arguments.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_fp8w.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t fp8w_n128_workspace_bytes(int experts, int sms) {
  return workspace_bytes<fp8w::Gemm<128>::Type, false, false, true, true>(experts, sms);
}

void grouped_gemm_fp8w_n128(const Grouped& g, cudaStream_t stream) {
  run<fp8w::Gemm<128>::Type, false, false, true, true>(g, "fp8-weight (128-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
