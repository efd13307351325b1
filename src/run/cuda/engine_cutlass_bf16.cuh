// The unswapped bf16 grouped GEMM's configuration (see engine_cutlass.h), in one place for every
// instantiation that must compute the same tiles: the plain GEMM (engine_cutlass_bf16.cu) and its
// two SwiGLU forms (engine_cutlass_swiglu.cu, engine_cutlass_glu.cu), which are checked against it
// bitwise or within the bf16 bound, so they may differ only in their epilogue and loads.
#pragma once
#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace epmoe::cuda::cutlass_engine::bf16 {

// 128x256 output tile by two consumer warpgroups (64x256 fp32 accumulators each), K step 64;
// clusters of two m-tiles of one expert receive each weight tile by TMA multicast.
using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
using Element = cutlass::bfloat16_t;
constexpr int kAlign = 8;  // 16 bytes

// The mainloop beside `Epilogue` (the pipeline takes the shared memory the epilogue leaves).
template <class Epilogue>
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::ColumnMajor*, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

template <class MainloopT, class Epilogue>
using GemmOf = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>, MainloopT, Epilogue>>;

}  // namespace epmoe::cuda::cutlass_engine::bf16
#endif  // EPMOE_WITH_CUTLASS
