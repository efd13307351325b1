// CUTLASS engine, bf16 swap-AB instantiation (see engine_cutlass.h): out_e^T = W_e * A_e^T per
// expert, the weights' output dimension as CUTLASS's M, the expert's rows as its N.
//
// Tiles: 128 weight rows x 64 token rows x 64 of K. Few rows per expert is where this runs (up to
// policy::kSwapMaxRows), so the time is streaming each expert's weights once: one CTA per 128
// weight rows per 64 tokens, as many pipeline stages as shared memory holds (24 KiB each) to keep
// HBM busy.
// Cluster 2x1 = two weight tiles of one expert: the token tile, which every weight tile of the
// expert reads again (half as many bytes as the weight tile per K step), is loaded from L2 once
// per pair and multicast, so L2 delivers 1.25x the weight bytes rather than 1.5x (the weights
// themselves pass through L2 on their way from HBM; this kernel should be bound by HBM, not by
// L2). Weight-tile counts are even for every model shape with N a multiple of 256, so no CTA of a
// pair idles (a cluster along the token tiles instead would idle its second CTA whenever an expert
// has at most 64 rows). The token tiles of one weight tile run side by side (AlongN raster) and
// share it through L2.
// Cooperative schedule: both consumer warpgroups on one tile (64x64 accumulators each); with K
// loops of 32..112 steps of 64 the 128x64 epilogue is a small part of a tile, so the ping-pong
// schedule's overlap of one tile's epilogue with the next mainloop has little to hide, while its
// one-warpgroup tiles would double the accumulator registers per thread.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;

using TileShape = Shape<_128, _64, _64>;
using ClusterShape = Shape<_2, _1, _1>;
using Element = cutlass::bfloat16_t;
constexpr int kAlign = 8;  // 16 bytes

// D = out^T, column-major: element (weight row n, token r) at r * N + n, i.e. out [rows][N].
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, kAlign,
    Element, cutlass::layout::ColumnMajor*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;

// A = W [N][K] (K-major: RowMajor for A), B = the rows [rows][K] (K-major: ColumnMajor for B).
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::ColumnMajor*, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<Shape<int, int, int>>, Mainloop,
                                                   Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

// 8 stages of 24 KiB (weights 16 KiB + tokens 8 KiB) next to an 18 KiB epilogue: ~190 KiB of loads
// in flight per SM is what keeps HBM busy with one CTA per SM; a tile change that drops the depth
// should be a decision, not a side effect.
static_assert(Mainloop::DispatchPolicy::Stages >= 6, "the weight stream needs a deep pipeline");

}  // namespace

size_t bf16_swap_workspace_bytes(int experts, int sms) {
  return detail::workspace_bytes<Gemm, false, false, true>(experts, sms);
}

void grouped_gemm_bf16_swap(const Grouped& g, cudaStream_t stream) {
  if (g.K % kAlign != 0 || g.N % kAlign != 0)
    throw UsageError("cutlass bf16 swap-AB grouped GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 8 (16-byte TMA rows)");
  detail::run<Gemm, false, false, true>(g, "bf16 swap-AB", stream);
}

#else  // built without the CUTLASS headers

size_t bf16_swap_workspace_bytes(int, int) { return 0; }
void grouped_gemm_bf16_swap(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
