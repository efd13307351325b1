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
#include <cuda_bf16.h>

#include "run/cuda/engine_cutlass_glu.cuh"  // glu::RegisterEpilogue, silu

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

// GEMM1 with SwiGLU in its epilogue (grouped_gemm_nvfp4w with g.glu): W13's paired copy in GLU
// order (nvfp4_paired::glu_row: each 16 weight rows are 8 gate rows, then the up rows of the same 8
// intermediate columns). In the m64nN accumulator fragment a thread holds rows r and r + 8 of its
// warp's 16 ((2 columns, 2 rows, N / 8 groups of 8 columns), r = lane / 4), so element i + 2 is the
// up value of gate element i: SwiGLU needs no data from other threads. The problem is 2I weight
// rows; D is the intermediate [rows][I] (column-major out^T, stride I between token rows).
//
// Register-direct (CUTLASS's no-smem ptr-array epilogue behind its TMA adapter, as the bf16
// one-GEMM SwiGLU): each value is rounded to bf16 after alpha as GEMM1's store rounds it, then
// silu(g) * u as the SwiGLU pass computes it (silu.cuh), rounded: that pass's bits. Lanes l and l ^ 4
// hold neighbouring intermediate columns of the same two tokens, so one shuffle gives each a
// column pair of one token: 4-byte stores.
using GluBase = glu::RegisterEpilogue<cute::Stride<cute::_1, int64_t, cute::_0>>;  // D column-major

struct GluOp : GluBase {
  using GluBase::GluBase;

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_HOST_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                      BlockCoordMNKL blk_coord_mnkl,
                                      cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                      ResidueMNK, int thread_idx, char*) {
#if defined(__CUDA_ARCH__)
    using namespace cute;
    static_assert(decltype(size<0>(accumulators))::value % 4 == 0, "(2 columns, 2 rows, ...) per m64 fragment");
    const int M = int(get<0>(problem_shape_mnkl));  // 2I weight rows
    const int N = int(get<1>(problem_shape_mnkl));  // the expert's token rows
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    bf16_raw* D = reinterpret_cast<bf16_raw*>(glu_params.ptr_D[l_coord]);
    const int64_t ld = get<1>(glu_params.dD[l_coord]);
    const float* alpha_ptr = glu_params.thread.alpha_ptr;
    const float alpha = alpha_ptr ? alpha_ptr[l_coord] : 1.0f;
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                           make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < int(size(accumulators)); i += 4) {
      const int r = get<0>(tCcD(i)), c = get<1>(tCcD(i));  // gate row r (r % 16 < 8), tokens c, c + 1
      bf16_raw h[2];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float g = __bfloat162float(__float2bfloat16_rn(alpha * accumulators(i + j)));
        const float u = __bfloat162float(__float2bfloat16_rn(alpha * accumulators(i + j + 2)));
        h[j] = __bfloat16_as_ushort(__float2bfloat16_rn(silu(g) * u));
      }
      // Lane pairs (l, l ^ 4) hold intermediate columns j (r even) and j + 1 (r odd): the even lane
      // stores token c's (j, j + 1), the odd lane token c + 1's.
      const bool odd = r & 1;
      const bf16_raw other = static_cast<bf16_raw>(__shfl_xor_sync(0xffffffffu, uint32_t(odd ? h[0] : h[1]), 4));
      const int tok = odd ? c + 1 : c;
      const int col = nvfp4_paired::glu_column(r) - (odd ? 1 : 0);
      const uint32_t v = odd ? uint32_t(other) | (uint32_t(h[1]) << 16) : uint32_t(h[0]) | (uint32_t(other) << 16);
      if (r < M && tok < N) *reinterpret_cast<uint32_t*>(D + int64_t(tok) * ld + col) = v;
    }
#endif
  }
};
using GluEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<GluOp>;

// Without the TMA epilogue's staging buffer the builder's stage count left no room for what else
// the ptr-array kernel keeps in shared memory (its tensor maps and barriers, ~4 KiB): 14 stages of
// the 64-wide tile came to 233472 bytes, over the 232448 an H200 block may have. Hence the carveout.
constexpr int kGluCarveout = 4096;
constexpr int kMaxSmem = 232448;  // sm_90 dynamic shared memory per block

template <int kTileN>
struct GluGemm {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_64>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, paired_t, cutlass::layout::RowMajor*, 16,
      cutlass::bfloat16_t, cutlass::layout::ColumnMajor*, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename GluEpilogue::SharedStorage)) +
                                                        kGluCarveout>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Type = swap::GemmOf<Mainloop, GluEpilogue>;
  static_assert(Mainloop::KernelConversionMode == cutlass::detail::ConversionMode::DirectConvert);
  static_assert(!Mainloop::SwapAB, "the weights must be the register operand as given");
  static_assert(Type::GemmKernel::SharedStorageSize <= kMaxSmem, "more shared memory than a block may have");
};

}  // namespace epmoe::cuda::cutlass_engine::nvfp4w
#endif  // EPMOE_WITH_CUTLASS
