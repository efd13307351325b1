// CUTLASS engine, fp8 block-scaled unswapped GEMM on the ping-pong schedule (Grouped::pingpong):
// the same product as engine_cutlass_fp8.cu, each consumer warpgroup on its own 64x128 tile (64
// rows of an expert x 128 weight rows, K step 128 = one scale block), the two alternating.
//
// Why a second schedule: the block-scaled mainloop waits for each 128-K block's wgmmas before it
// scales and adds them into the fp32 accumulators. Cooperative, both warpgroups share one tile and
// wait at the same time, so the tensor cores idle through every promotion and every epilogue;
// ping-pong, one warpgroup's promotion and epilogue run while the other's wgmmas do. 64-row tiles
// also pad an expert's rows to a multiple of 64 instead of 128 (e.g. 150 rows: 192 instead of 256).
// 64 + 64 accumulator registers per thread: no spill at the 168-register cap (ptxas -v).
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace epmoe::cuda::cutlass_engine::detail {
namespace {

using namespace cute;

using TileShape = Shape<_64, _128, _128>;
using ClusterShape = Shape<_2, _1, _1>;  // two m-tiles of one expert share each weight tile (multicast)
using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignAB = 16, kAlignD = 8;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlignD, ElementD,
    cutlass::layout::RowMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
    kAlignAB, ElementAB, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, kAlignAB, float, TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise>::CollectiveOp;

using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cutlass::gemm::GroupProblemShape<Shape<int, int, int>>, Mainloop, Epilogue>>;

static_assert(!Mainloop::MMajorSFA && !Mainloop::NMajorSFB, "scales are expected K-major");
static_assert(Mainloop::ScaleGranularityM == 1 && Mainloop::ScaleGranularityN == 128 &&
              Mainloop::ScaleGranularityK == 128);

}  // namespace

size_t fp8_pingpong_workspace_bytes(int experts, int sms) { return workspace_bytes<Gemm, true>(experts, sms); }

void grouped_gemm_fp8_pingpong(const Grouped& g, cudaStream_t stream) { run<Gemm, true>(g, "fp8 ping-pong", stream); }

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
