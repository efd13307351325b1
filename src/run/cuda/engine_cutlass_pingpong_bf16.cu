// CUTLASS engine, bf16 unswapped GEMM on the ping-pong schedule (Grouped::pingpong): the same
// product as engine_cutlass_bf16.cu, each consumer warpgroup on its own 128x128 tile (K step 64),
// the two alternating, so one's epilogue runs while the other's wgmmas do (cooperative, both
// share a 128x256 tile and the tensor cores idle through its epilogue). 128 accumulator registers
// per thread, as the cooperative tile's. 6 pipeline stages; no spill at the 168-register cap.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace epmoe::cuda::cutlass_engine::detail {
namespace {

using namespace cute;

using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_2, _1, _1>;
using Element = cutlass::bfloat16_t;
constexpr int kAlign = 8;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::RowMajor*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
    cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::ColumnMajor*, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>::CollectiveOp;

using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cutlass::gemm::GroupProblemShape<Shape<int, int, int>>, Mainloop, Epilogue>>;

}  // namespace

size_t bf16_pingpong_workspace_bytes(int experts, int sms) { return workspace_bytes<Gemm, false>(experts, sms); }

void grouped_gemm_bf16_pingpong(const Grouped& g, cudaStream_t stream) {
  run<Gemm, false>(g, "bf16 ping-pong", stream);
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif
