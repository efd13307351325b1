// CUTLASS engine, fp8 weights times bf16 rows without a widened copy (see engine_cutlass.h):
// CUTLASS's Hopper mixed-input grouped GEMM, whose consumer warpgroups load each weight tile's
// e4m3 codes from shared memory into registers, decode them to bf16 there and feed register-A
// wgmmas. One template per token-tile width; engine_cutlass_fp8w{,_n64,_n128}.cu instantiate them.
//
// Swapped like engine_cutlass_swap.cuh (the mixed-input mainloop puts its narrow operand in
// registers, which wgmma allows only for A): A = W [N][K] e4m3, B = the rows [rows][K] bf16, D =
// out^T column-major = out [rows][N]. Cluster 2x1: two weight tiles of one expert share the token
// tile, multicast.
//
// The decode: each code becomes fp32, is multiplied in fp32 by its row's scale for that 128 of K
// and rounded once to bf16 -- bf16(e4m3 * s) with the fp32 product, the value widen::to_bf16
// writes. So the weights the tensor cores see are the widened path's, and the k16 steps run in the
// same order: the products are the same bits (the GPU tests compare the two bit for bit).
// CUTLASS's scales are per weight row and chunk of K (it has no 128x128 tile form), so
// expand_fp8_scales writes each tile's scale onto its rows: [E][kb][N] floats, weight rows
// contiguous (the mainloop wants them MN-major), 1/32 of the e4m3 bytes at K = 128 per block.
#pragma once
#if !defined(EPMOE_CUTLASS_GROUPED_IMPL)
#error "define EPMOE_CUTLASS_GROUPED_IMPL before including run/cuda/engine_cutlass.h and this header"
#endif
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/engine_cutlass_swap.cuh"  // the swapped epilogue and GEMM type, shared

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::fp8w {

using swap::ClusterShape;

template <int kTileN>
struct Gemm {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_64>;
  using Epi = swap::Epilogue<TileShape>;  // D = out^T column-major, as the swap-AB GEMMs write it
  // A = (e4m3 codes, fp32 scale): ConvertAndScale with the scale applied in fp32 (the scale type
  // is not the MMA type, so CUTLASS converts code -> fp32, multiplies, then rounds to bf16).
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<cutlass::float_e4m3_t, float>,
      cutlass::layout::RowMajor*, 16, cutlass::bfloat16_t, cutlass::layout::ColumnMajor*, 8, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Type = swap::GemmOf<Mainloop, Epi>;
  static_assert(Mainloop::KernelConversionMode == cutlass::detail::ConversionMode::ConvertAndScale);
  static_assert(!Mainloop::SwapAB, "the weights must be the register operand as given");
  static_assert(Mainloop::DispatchPolicy::Stages >= 3, "too few pipeline stages");
};

}  // namespace epmoe::cuda::cutlass_engine::fp8w
#endif  // EPMOE_WITH_CUTLASS
