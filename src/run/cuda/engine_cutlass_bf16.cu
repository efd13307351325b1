// CUTLASS engine, bf16 instantiation (see engine_cutlass.h). The SwiGLU pass between the two
// grouped GEMMs is in swiglu_pass.cu.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_bf16.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;
using namespace bf16;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::RowMajor*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;
using Gemm = GemmOf<bf16::Mainloop<Epilogue>, Epilogue>;

}  // namespace

bool available() { return true; }

size_t bf16_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, false>(experts, sms); }

void grouped_gemm_bf16(const Grouped& g, cudaStream_t stream) {
  if (g.swap_ab) return grouped_gemm_bf16_swap(g, stream);
  if (g.K % kAlign != 0 || g.N % kAlign != 0)
    throw UsageError("cutlass bf16 grouped GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 8 (16-byte TMA rows)");
  detail::run<Gemm, false>(g, "bf16", stream);
}

#else  // built without the CUTLASS headers

bool available() { return false; }
size_t bf16_workspace_bytes(int, int) { return 0; }
void grouped_gemm_bf16(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
