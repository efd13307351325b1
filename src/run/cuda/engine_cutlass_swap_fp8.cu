// CUTLASS engine, fp8 block-scaled swap-AB with 64-wide token tiles (engine_cutlass_swap.cuh), and
// the entry points that pick the token-tile width (the 96-, 128- and 192-wide ones are
// engine_cutlass_swap_fp8_n{96,128,192}.cu).
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_swap.cuh"

#include <string>

#include "epmoe/error.h"

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)

size_t fp8_swap_workspace_bytes(int experts, int sms, int tile_n) {
  swap::check_tile(tile_n, "fp8", true);
  if (tile_n == 96) return detail::fp8_swap_n96_workspace_bytes(experts, sms);
  if (tile_n == 128) return detail::fp8_swap_n128_workspace_bytes(experts, sms);
  if (tile_n == 192) return detail::fp8_swap_n192_workspace_bytes(experts, sms);
  return detail::workspace_bytes<swap::Fp8<64>::Gemm, true, false, true>(experts, sms);
}

void grouped_gemm_fp8_swap(const Grouped& g, cudaStream_t stream) {
  swap::check_tile(g.swap_tile_n, "fp8", true);
  check_fp8(g, "fp8 swap-AB grouped GEMM");
  if (g.swap_tile_n == 96) return detail::grouped_gemm_fp8_swap_n96(g, stream);
  if (g.swap_tile_n == 128) return detail::grouped_gemm_fp8_swap_n128(g, stream);
  if (g.swap_tile_n == 192) return detail::grouped_gemm_fp8_swap_n192(g, stream);
  detail::run<swap::Fp8<64>::Gemm, true, false, true>(g, "fp8 swap-AB", stream);
}

#else  // built without the CUTLASS headers

size_t fp8_swap_workspace_bytes(int, int, int) { return 0; }
void grouped_gemm_fp8_swap(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
