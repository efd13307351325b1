// CUTLASS engine, nvfp4 weights x bf16 rows with 128-wide token tiles (engine_cutlass_nvfp4w.cuh);
// reached through grouped_gemm_nvfp4w (engine_cutlass_nvfp4w.cu), which checks the arguments.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_nvfp4w.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t nvfp4w_n128_workspace_bytes(int experts, int sms) {
  return workspace_bytes<nvfp4w::Gemm<128>::Type, false, false, true>(experts, sms);
}

void grouped_gemm_nvfp4w_n128(const Grouped& g, cudaStream_t stream) {
  run<nvfp4w::Gemm<128>::Type, false, false, true>(g, "nvfp4-weight (128-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
