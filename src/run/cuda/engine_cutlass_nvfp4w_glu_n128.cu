// CUTLASS engine, GEMM1 of nvfp4 weights with SwiGLU in its epilogue, 128-wide token tiles
// (engine_cutlass_nvfp4w.cuh, GluGemm); reached through grouped_gemm_nvfp4w with g.glu.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_nvfp4w.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t nvfp4w_glu_n128_workspace_bytes(int experts, int sms) {
  return workspace_bytes<nvfp4w::GluGemm<128>::Type, false, false, true>(experts, sms);
}

void grouped_gemm_nvfp4w_glu_n128(const Grouped& g, cudaStream_t stream) {
  run<nvfp4w::GluGemm<128>::Type, false, false, true>(g, "nvfp4-weight SwiGLU (128-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
