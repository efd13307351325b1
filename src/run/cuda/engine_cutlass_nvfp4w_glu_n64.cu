// CUTLASS engine, GEMM1 of nvfp4 weights with SwiGLU in its epilogue, 64-wide token tiles
// (engine_cutlass_nvfp4w.cuh, GluGemm); reached through grouped_gemm_nvfp4w with g.glu.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_nvfp4w.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t nvfp4w_glu_n64_workspace_bytes(int experts, int sms) {
  return workspace_bytes<nvfp4w::GluGemm<64>::Type, false, false, true>(experts, sms);
}

void grouped_gemm_nvfp4w_glu_n64(const Grouped& g, cudaStream_t stream) {
  run<nvfp4w::GluGemm<64>::Type, false, false, true>(g, "nvfp4-weight SwiGLU (64-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
