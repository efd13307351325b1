// CUTLASS engine, GEMM1 of nvfp4 weights with SwiGLU in its epilogue (engine_cutlass_nvfp4w.cuh,
// GluGemm): the 256-wide token tiles, and the choice of width (64 and 128 in
// engine_cutlass_nvfp4w_glu_n{64,128}.cu). Reached through grouped_gemm_nvfp4w with g.glu, which
// checks the arguments.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_nvfp4w.cuh"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::detail {

size_t nvfp4w_glu_workspace_bytes(int experts, int sms, int tile_n) {
  if (tile_n == 64) return nvfp4w_glu_n64_workspace_bytes(experts, sms);
  if (tile_n == 128) return nvfp4w_glu_n128_workspace_bytes(experts, sms);
  return workspace_bytes<nvfp4w::GluGemm<256>::Type, false, false, true>(experts, sms);
}

void grouped_gemm_nvfp4w_glu(const Grouped& g, cudaStream_t stream) {
  if (g.swap_tile_n == 64) return grouped_gemm_nvfp4w_glu_n64(g, stream);
  if (g.swap_tile_n == 128) return grouped_gemm_nvfp4w_glu_n128(g, stream);
  // The head launch's fill writes its tail's and mid's tables (run_mixed, Grouped::Part): one layout.
  static_assert(
      same_tables<nvfp4w::GluGemm<256>::Type, nvfp4w::GluGemm<Grouped::kPartTail>::Type, false, false, true>() &&
      same_tables<nvfp4w::GluGemm<256>::Type, nvfp4w::GluGemm<Grouped::kPartMid>::Type, false, false, true>());
  run<nvfp4w::GluGemm<256>::Type, false, false, true>(g, "nvfp4-weight SwiGLU (256-wide token tiles)", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
