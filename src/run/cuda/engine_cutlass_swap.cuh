// CUTLASS engine, swap-AB instantiations (see engine_cutlass.h): out_e^T = W_e * A_e^T per expert,
// the weights' output dimension as CUTLASS's M, the expert's rows as its N. One template per
// operand type and token-tile width; engine_cutlass_swap_{bf16,fp8}{,_n128,_n192}.cu each
// instantiate one (so that they build in parallel).
//
// Tiles: 128 weight rows x kTileN token rows (64, 128 or 192, fp8 also 96; Grouped::swap_tile_n) x 64 of K (bf16) or
// 128 of K (fp8: K step = one scale block). Few rows per expert is where this runs (up to
// policy::kSwapMaxRows), so the time is streaming each expert's weights once: one CTA per 128
// weight rows per token tile, as many pipeline stages as shared memory holds to keep HBM busy.
// The token tile: 64 wastes nothing up to 64 rows per expert; above, an expert has two or three
// such tiles, which read each weight tile again (from L2, AlongN raster keeps them side by side),
// so L2 delivers 2-3x the weight bytes; a 128-wide tile reads each weight tile once up to 128 rows
// and costs only MMA work on the padding (TMA fetches no out-of-range token rows).
// Cluster 2x1 = two weight tiles of one expert: the token tile, which every weight tile of the
// expert reads again, is loaded from L2 once per pair and multicast. Weight-tile counts are even
// for every model shape with N a multiple of 256, so no CTA of a pair idles (a cluster along the
// token tiles instead would idle its second CTA whenever an expert has one token tile).
// Cooperative schedule: both consumer warpgroups on one tile (64 x kTileN accumulators each); with
// K loops of 16..112 steps the epilogue is a small part of a tile, so the ping-pong schedule's
// overlap of one tile's epilogue with the next mainloop has little to hide, while its
// one-warpgroup tiles would double the accumulator registers per thread.
//
// fp8: the block scales swap with the operands and keep their layouts: CUTLASS's A scales are the
// weights' 128x128 tiles ([E][N/128][K/128], granularity 128 in M and K), its B scales the rows'
// 1x128 groups ([rows][K/128], granularity 1 in N); both K-major as stored. The SM90 blockwise
// mainloop takes any granularity that divides the tile: with one A scale per tile (ScaleMsPerTile
// 1) and one B scale per token column (ScaleNsPerTile = kTileN), it multiplies each column's B
// scale by the tile's A scale and promotes every 128 of K: the product unswapped computes,
// scale_row * scale_tile, with the factors in the other order (the same fp32 value).
#pragma once
#if !defined(EPMOE_CUTLASS_GROUPED_IMPL)
#error "define EPMOE_CUTLASS_GROUPED_IMPL before including run/cuda/engine_cutlass.h and this header"
#endif
#include <string>

#include "epmoe/error.h"
#include "run/cuda/engine_cutlass.h"

namespace epmoe::cuda::cutlass_engine::swap {
// Throws unless swap_tile_exists(tile_n, fp8); `what` names the GEMM ("bf16", "fp8").
inline void check_tile(int tile_n, const char* what, bool fp8) {
  if (!swap_tile_exists(tile_n, fp8))
    throw UsageError(std::string("cutlass ") + what + " swap-AB grouped GEMM: swap_tile_n=" + std::to_string(tile_n) +
                     " has no instantiation; use 64, 128 or 192" + (fp8 ? " (or 96)" : ""));
}
}  // namespace epmoe::cuda::cutlass_engine::swap

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace epmoe::cuda::cutlass_engine::swap {

using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignD = 8;  // 16 bytes

// D = out^T, column-major: element (weight row n, token r) at r * N + n, i.e. out [rows][N].
template <class TileShape>
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, kAlignD,
    ElementD, cutlass::layout::ColumnMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

template <class Mainloop, class Epi>
using GemmOf = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>, Mainloop, Epi>>;

// At least 5 stages of loads in flight (the 64-wide tiles get 8 of 24 KiB, the 128-wide ones 6
// of 32 KiB): the weight stream relies on it, so a tile change that drops the depth fails here.
template <class Mainloop>
constexpr bool kDeepPipeline = Mainloop::DispatchPolicy::Stages >= 5;

// A = W [N][K] (K-major: RowMajor for A), B = the rows [rows][K] (K-major: ColumnMajor for B).
template <int kTileN>
struct Bf16 {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_64>;
  using Element = cutlass::bfloat16_t;
  static constexpr int kAlign = 8;
  using Epi = Epilogue<TileShape>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, kAlign, Element,
      cutlass::layout::ColumnMajor*, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Gemm = GemmOf<Mainloop, Epi>;
  static_assert(kDeepPipeline<Mainloop>, "the weight stream needs a deep pipeline");
};

template <int kTileN>
struct Fp8 {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_128>;
  using ElementAB = cutlass::float_e4m3_t;
  static constexpr int kAlign = 16;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<128, 1, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using Epi = Epilogue<TileShape>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>, kAlign, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Gemm = GemmOf<Mainloop, Epi>;
  static_assert(!Mainloop::MMajorSFA && !Mainloop::NMajorSFB, "scales are expected K-major");
  static_assert(Mainloop::ScaleGranularityM == 128 && Mainloop::ScaleGranularityN == 1 &&
                Mainloop::ScaleGranularityK == 128);
  static_assert(kDeepPipeline<Mainloop>, "the weight stream needs a deep pipeline");
};

}  // namespace epmoe::cuda::cutlass_engine::swap
#endif  // EPMOE_WITH_CUTLASS
