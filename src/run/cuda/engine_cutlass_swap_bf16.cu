// CUTLASS engine, bf16 swap-AB with 64-wide token tiles (engine_cutlass_swap.cuh), and the entry
// points that pick the token-tile width (the 128- and 192-wide ones are
// engine_cutlass_swap_bf16_n{128,192}.cu).
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_swap.cuh"

#include <string>

#include "epmoe/error.h"

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)

size_t bf16_swap_workspace_bytes(int experts, int sms, int tile_n) {
  swap::check_tile(tile_n, "bf16", false);
  if (tile_n == 128) return detail::bf16_swap_n128_workspace_bytes(experts, sms);
  if (tile_n == 192) return detail::bf16_swap_n192_workspace_bytes(experts, sms);
  return detail::workspace_bytes<swap::Bf16<64>::Gemm, false, false, true>(experts, sms);
}

void grouped_gemm_bf16_swap(const Grouped& g, cudaStream_t stream) {
  swap::check_tile(g.swap_tile_n, "bf16", false);
  if (g.K % 8 != 0 || g.N % 8 != 0)
    throw UsageError("cutlass bf16 swap-AB grouped GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 8 (16-byte TMA rows)");
  if (g.swap_tile_n == 128) return detail::grouped_gemm_bf16_swap_n128(g, stream);
  if (g.swap_tile_n == 192) return detail::grouped_gemm_bf16_swap_n192(g, stream);
  detail::run<swap::Bf16<64>::Gemm, false, false, true>(g, "bf16 swap-AB", stream);
}

#else  // built without the CUTLASS headers

size_t bf16_swap_workspace_bytes(int, int, int) { return 0; }
void grouped_gemm_bf16_swap(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
