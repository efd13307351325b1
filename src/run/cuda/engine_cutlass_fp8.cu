// CUTLASS engine, fp8 instantiation (see engine_cutlass.h): e4m3 x e4m3 grouped GEMM with DeepSeek
// block scales. (Its rows come from the fp8 permute in rows.cu, the dispatched bytes unchanged.)
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "run/cuda/engine_cutlass_fp8.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;
using namespace fp8;

using ElementD = cutlass::bfloat16_t;
constexpr int kAlignD = 8;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlignD, ElementD,
    cutlass::layout::RowMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
using Gemm = GemmOf<fp8::Mainloop<Epilogue>, Epilogue>;
static_assert(kScalesAsExpected<fp8::Mainloop<Epilogue>, 128>, "scales K-major, per row and per 128x128 tile");

}  // namespace

size_t fp8_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, true>(experts, sms); }

void check_fp8(const Grouped& g, const char* what) {
  if (g.K % 16 != 0)
    throw UsageError(std::string("cutlass ") + what + ": K=" + std::to_string(g.K) +
                     " must be a multiple of 16 (16-byte TMA rows of e4m3)");
  if (g.N % 8 != 0)
    throw UsageError(std::string("cutlass ") + what + ": N=" + std::to_string(g.N) +
                     " must be a multiple of 8 (16-byte TMA rows of bf16 output; with halves the up half's "
                     "columns start N in)");
  if (!g.sfa || !g.sfw)
    throw UsageError(std::string("cutlass ") + what + ": activation and weight scales must be non-null");
}

void grouped_gemm_fp8(const Grouped& g, cudaStream_t stream) {
  if (g.swap_ab) return grouped_gemm_fp8_swap(g, stream);
  check_fp8(g, "fp8 grouped GEMM");
  detail::run<Gemm, true>(g, "fp8", stream);
}

#else  // built without the CUTLASS headers

size_t fp8_workspace_bytes(int, int) { return 0; }
void check_fp8(const Grouped&, const char*) {}
void grouped_gemm_fp8(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
