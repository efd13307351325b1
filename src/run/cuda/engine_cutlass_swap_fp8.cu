// CUTLASS engine, fp8 swap-AB instantiation (see engine_cutlass.h): out_e^T = W_e * A_e^T per
// expert on e4m3 x e4m3 with DeepSeek block scales, the weights' output dimension as CUTLASS's M.
//
// The block scales swap with the operands and keep their layouts: CUTLASS's A scales are the
// weights' 128x128 tiles ([E][N/128][K/128], granularity 128 in M and K), its B scales the rows'
// 1x128 groups ([rows][K/128], granularity 1 in N); both K-major as stored. The SM90 blockwise
// mainloop takes any granularity that divides the tile: with one A scale per tile (ScaleMsPerTile
// 1) and one B scale per token column (ScaleNsPerTile 64), it multiplies each column's B scale by
// the tile's A scale and promotes every 128 of K, the product unswapped computes, scale_row * scale_tile,
// with the factors in the other order (the same fp32 value).
//
// Tiles: 128 weight rows x 64 token rows x 128 of K (K step = one scale block), cluster 2x1 (two
// weight tiles share the multicast token tile), AlongN raster, cooperative: the reasoning of
// engine_cutlass_swap_bf16.cu.
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

using TileShape = Shape<_128, _64, _128>;
using ClusterShape = Shape<_2, _1, _1>;
using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignAB = 16, kAlignD = 8;

using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<128, 1, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// D = out^T, column-major (out [rows][N] row-major).
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, kAlignD,
    ElementD, cutlass::layout::ColumnMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
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

// 8 stages of 24 KiB (weights 16 KiB + tokens 8 KiB) next to an 18 KiB epilogue: ~190 KiB of loads
// in flight per SM is what keeps HBM busy with one CTA per SM; a tile change that drops the depth
// should be a decision, not a side effect.
static_assert(Mainloop::DispatchPolicy::Stages >= 6, "the weight stream needs a deep pipeline");

static_assert(!Mainloop::MMajorSFA && !Mainloop::NMajorSFB, "scales are expected K-major");
static_assert(Mainloop::ScaleGranularityM == 128 && Mainloop::ScaleGranularityN == 1 &&
              Mainloop::ScaleGranularityK == 128);

}  // namespace

size_t fp8_swap_workspace_bytes(int experts, int sms) {
  return detail::workspace_bytes<Gemm, true, false, true>(experts, sms);
}

void grouped_gemm_fp8_swap(const Grouped& g, cudaStream_t stream) {
  if (g.K % 128 != 0 || g.N % 128 != 0)
    throw UsageError("cutlass fp8 swap-AB grouped GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 128 (whole 128x128 weight scale tiles)");
  if (!g.sfa || !g.sfw)
    throw UsageError("cutlass fp8 swap-AB grouped GEMM: activation and weight scales must be non-null");
  detail::run<Gemm, true, false, true>(g, "fp8 swap-AB", stream);
}

#else  // built without the CUTLASS headers

size_t fp8_swap_workspace_bytes(int, int) { return 0; }
void grouped_gemm_fp8_swap(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
