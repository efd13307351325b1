// CUTLASS engine, fp8 instantiation (see engine_cutlass.h): e4m3 x e4m3 grouped GEMM with DeepSeek
// block scales. (Its rows come from the fp8 permute in rows.cu, the dispatched bytes unchanged.)
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;

// 128x128 tile, K step 128 = one scale block: the wgmma partial sums of each 128 of K are
// multiplied by scale_a[row] * scale_b[tile] and added into fp32 accumulators (DeepSeek's
// promotion), so the fp8 tensor cores' limited accumulator precision never spans more than 128
// products. Clusters of two m-tiles of one expert share each weight tile by TMA multicast.
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_2, _1, _1>;
using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignAB = 16, kAlignD = 8;

// Scale layouts: A one fp32 per row and 128 of K, B one per 128x128 tile; both K-major, which is
// how they arrive (dispatch scales [row][H/128], weight scales [E][N/128][K/128]), so nothing is
// transposed. (With K step = scale block = 128 the shared-memory scale layouts are the same as for
// the MN-major variant; only the global addressing differs.)
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlignD, ElementD,
    cutlass::layout::RowMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
    kAlignAB, ElementAB, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, kAlignAB, float, TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<Shape<int, int, int>>, Mainloop,
                                                   Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

static_assert(!Mainloop::MMajorSFA && !Mainloop::NMajorSFB, "scales are expected K-major");
static_assert(Mainloop::ScaleGranularityM == 1 && Mainloop::ScaleGranularityN == 128 &&
              Mainloop::ScaleGranularityK == 128);

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
