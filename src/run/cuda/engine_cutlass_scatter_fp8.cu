// CUTLASS engine, the fp8 GEMM2 writing single-row slots home (see engine_cutlass.h, RowScatter
// and grouped_gemm_fp8_scatter; why: engine_cutlass_scatter.cu). The kernel is the fp8 GEMM's
// (engine_cutlass_fp8.cuh: same tiles, cluster, block-scaled mainloop and promotion, so the same
// accumulators) with the scatter epilogue (engine_cutlass_scatter.cuh). The GPU tests check the
// runner's output bitwise against the plain GEMM + weighted sum.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_fp8.cuh"
#include "run/cuda/engine_cutlass_scatter.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using Gemm = fp8::GemmOf<scatter::Epilogue>;

}  // namespace

size_t fp8_scatter_workspace_bytes(int experts, int sms) {
  return detail::workspace_bytes<Gemm, true, false, false, true>(experts, sms);
}

void grouped_gemm_fp8_scatter(const Grouped& g, cudaStream_t stream) {
  check_fp8(g, "fp8 scatter GEMM");
  check_scatter(g, "fp8 scatter GEMM");
  detail::run<Gemm, true, false, false, true>(g, "fp8 scatter", stream);
}

#else

size_t fp8_scatter_workspace_bytes(int, int) { return 0; }
void grouped_gemm_fp8_scatter(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
