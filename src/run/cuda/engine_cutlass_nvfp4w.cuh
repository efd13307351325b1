// CUTLASS engine, nvfp4 weights times bf16 rows without a widened copy (see engine_cutlass.h):
// CUTLASS's Hopper mixed-input grouped GEMM (as engine_cutlass_fp8w.cuh, swapped: the weights are
// the register operand, the rows the shared-memory one, D = out^T column-major = out [rows][N]) on
// the paired copy of the weights (nvfp4_paired.h: two bytes per pair of weights, both codes and
// their block scale). The consumer warpgroups decode each register of two pairs into two bf16x2 of
// code * scale * 2^-8 with ~16 integer operations and two bf16x2 multiplies, in the DirectConvert
// path of the mainloop (its own scale operand is one per K tile, nvfp4 needs one per 16 of K). The
// epilogue's per-group alpha is 2^8 / gs (widen::inverse_scales with factor 256).
//
// Bits: the decoded weights are bf16(e2m1 * e4m3) times 2^-8, exactly (at most 6 significant
// bits), i.e. widen::to_bf16's values scaled by a power of two; the k16 steps run in the same order
// as the widened path's swapped GEMM, so the fp32 sums are that path's times 2^-8 and the epilogue
// multiplies them by 2^8 * (1/gs) -- the same fp32 product (the GPU tests compare the two bit for
// bit).
#pragma once
#if !defined(EPMOE_CUTLASS_GROUPED_IMPL)
#error "define EPMOE_CUTLASS_GROUPED_IMPL before including run/cuda/engine_cutlass.h and this header"
#endif
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/engine_cutlass_swap.cuh"  // the swapped epilogue and GEMM type, shared
#include "run/cuda/engine_mma.cuh"  // bf16x2_mul
#include "run/cuda/nvfp4_paired.h"

#if defined(EPMOE_WITH_CUTLASS)
namespace epmoe::cuda::cutlass_engine::nvfp4w {
// One byte of the paired copy: a type of its own, so that CUTLASS converts it with the converter
// below (TMA moves it as uint8, its size in bits).
struct alignas(1) paired_t {
  uint8_t bits;
};
}  // namespace epmoe::cuda::cutlass_engine::nvfp4w

namespace cutlass {
// The mixed-input mainloop converts its A fragment a 32-bit register at a time (N = 4 here): bytes
// (0, 1) and (2, 3) are pairs (k, k + 1) of a weight row, k even (wgmma's A fragment holds
// consecutive-k pairs in each bf16x2 register), each decoded on its own.
template <int N, FloatRoundStyle Round>
struct NumericArrayConverter<bfloat16_t, epmoe::cuda::cutlass_engine::nvfp4w::paired_t, N, Round> {
  static_assert(N % 4 == 0, "the paired decode works on whole 32-bit registers of four weights");
  using result_type = Array<bfloat16_t, N>;
  using source_type = Array<epmoe::cuda::cutlass_engine::nvfp4w::paired_t, N>;
  static constexpr FloatRoundStyle round_style = Round;

  CUTLASS_DEVICE static result_type convert(source_type const& s) {
    namespace np = epmoe::cuda::nvfp4_paired;
    result_type r;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(&s);
    uint32_t* dst = reinterpret_cast<uint32_t*>(&r);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N / 4; ++i) {
      const uint32_t w = src[i];
      dst[2 * i] = epmoe::cuda::gemm::bf16x2_mul(np::pair_codes(w, 0), np::pair_scale_bf16x2(w, 0));
      dst[2 * i + 1] = epmoe::cuda::gemm::bf16x2_mul(np::pair_codes(w, 1), np::pair_scale_bf16x2(w, 1));
    }
    return r;
  }
  CUTLASS_DEVICE result_type operator()(source_type const& s) const { return convert(s); }
};
}  // namespace cutlass

namespace epmoe::cuda::cutlass_engine::nvfp4w {

using swap::ClusterShape;

template <int kTileN>
struct Gemm {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_64>;
  using Epi = swap::Epilogue<TileShape>;  // D = out^T column-major, alpha per group
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, paired_t, cutlass::layout::RowMajor*, 16,
      cutlass::bfloat16_t, cutlass::layout::ColumnMajor*, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Type = swap::GemmOf<Mainloop, Epi>;
  static_assert(Mainloop::KernelConversionMode == cutlass::detail::ConversionMode::DirectConvert);
  static_assert(!Mainloop::SwapAB, "the weights must be the register operand as given");
  static_assert(Mainloop::DispatchPolicy::Stages >= 3, "too few pipeline stages");
};

}  // namespace epmoe::cuda::cutlass_engine::nvfp4w
#endif  // EPMOE_WITH_CUTLASS
