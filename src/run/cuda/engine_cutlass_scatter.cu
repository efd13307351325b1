// CUTLASS engine, GEMM2 writing single-row slots home (see engine_cutlass.h, RowScatter and
// grouped_gemm_bf16_scatter).
//
// Why: the weighted sum reads every GEMM2 row back and writes each slot's row (246 us of a
// 4.5 ms DeepSeek-V3 bf16 call at M 32768, 73 of 0.65 ms at Qwen3-30B; ncu, session 28). Where a
// slot has one local row, which is most slots once the experts are spread over many ranks and
// every slot of `bench runner`'s layout, the sum has one term, w * o, which the epilogue can
// compute from the accumulator it holds: the pass then skips those slots and their rows are never
// stored to `out` and read back.
// The kernel is the bf16 GEMM's (engine_cutlass_bf16.cuh: same tiles, cluster, mainloop and MMA,
// so the same accumulators) with the scatter epilogue (engine_cutlass_scatter.cuh). The GPU tests
// check the runner's output bitwise against the plain GEMM + weighted sum.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_bf16.cuh"
#include "run/cuda/engine_cutlass_scatter.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;
using namespace bf16;

using Gemm = GemmOf<bf16::Mainloop<scatter::Epilogue>, scatter::Epilogue>;

}  // namespace

size_t scatter_workspace_bytes(int experts, int sms) {
  return detail::workspace_bytes<Gemm, false, false, false, true>(experts, sms);
}

void grouped_gemm_bf16_scatter(const Grouped& g, cudaStream_t stream) {
  if (g.K % kAlign != 0 || g.N % kAlign != 0)
    throw UsageError("cutlass bf16 scatter GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 8 (16-byte TMA rows)");
  check_scatter(g, "bf16 scatter GEMM");
  detail::run<Gemm, false, false, false, true>(g, "bf16 scatter", stream);
}

#else

size_t scatter_workspace_bytes(int, int) { return 0; }
void grouped_gemm_bf16_scatter(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}

#endif

void check_scatter(const Grouped& g, const char* what) {
  if (g.alpha || g.halves || g.swap_ab || g.src || g.glu)
    throw UsageError(std::string("cutlass ") + what + ": takes no alpha, halves, swap-AB, source or SwiGLU");
  if (!g.scatter.row_pair || !g.scatter.weights || !g.scatter.y || g.scatter.top_k < 1)
    throw UsageError(std::string("cutlass ") + what + ": scatter needs row_pair, weights, y and top_k >= 1 (top_k=" +
                     std::to_string(g.scatter.top_k) + ")");
}

}  // namespace epmoe::cuda::cutlass_engine
