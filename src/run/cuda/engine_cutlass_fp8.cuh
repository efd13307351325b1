// The unswapped fp8 grouped GEMM's configuration (see engine_cutlass.h), in one place for both
// instantiations that must compute the same tiles: the plain GEMM (engine_cutlass_fp8.cu) and the
// one-GEMM SwiGLU (engine_cutlass_glu_fp8.cu), which is checked against it bitwise, so they may
// differ only in their epilogue, loads and the weight scales' row granularity.
#pragma once
#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace epmoe::cuda::cutlass_engine::fp8 {

// 128x128 tile, K step 128 = one scale block: the wgmma partial sums of each 128 of K are
// multiplied by scale_a[row] * scale_b[tile] and added into fp32 accumulators (DeepSeek's
// promotion), so the fp8 tensor cores' limited accumulator precision never spans more than 128
// products. Clusters of two m-tiles of one expert share each weight tile by TMA multicast.
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
using ElementAB = cutlass::float_e4m3_t;
constexpr int kAlignAB = 16;

// Scale layouts: A one fp32 per row and 128 of K, B one per kScaleN rows and 128 of K (128: the
// weights' tiles); both K-major, which is how they arrive (dispatch scales [row][H/128], weight
// scales [E][N/128][K/128]), so nothing is transposed. (With K step = scale block = 128 the
// shared-memory scale layouts are the same as for the MN-major variant; only the global addressing
// differs.)
template <int kScaleN>
using ScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleN, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
template <int kScaleN>
using LayoutSFA = decltype(ScaleConfig<kScaleN>::deduce_layoutSFA());
template <int kScaleN>
using LayoutSFB = decltype(ScaleConfig<kScaleN>::deduce_layoutSFB());

// The mainloop beside `Epilogue` (the pipeline takes the shared memory the epilogue leaves).
template <class Epilogue, int kScaleN = 128>
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
    cute::tuple<cutlass::layout::RowMajor*, LayoutSFA<kScaleN>*>, kAlignAB, ElementAB,
    cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB<kScaleN>*>, kAlignAB, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

template <class MainloopT, class Epilogue>
using GemmOf = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>, MainloopT, Epilogue>>;

template <class MainloopT, int kScaleN>
constexpr bool kScalesAsExpected = !MainloopT::MMajorSFA && !MainloopT::NMajorSFB &&
                                   MainloopT::ScaleGranularityM == 1 && MainloopT::ScaleGranularityN == kScaleN &&
                                   MainloopT::ScaleGranularityK == 128;

}  // namespace epmoe::cuda::cutlass_engine::fp8
#endif  // EPMOE_WITH_CUTLASS
