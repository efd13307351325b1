// The one-GEMM SwiGLU's pieces that its bf16 and fp8 forms share (engine_cutlass_glu.cu,
// engine_cutlass_glu_fp8.cu): where a weight-tile slice reads from, and the epilogue.
//
// A GLU tile is 2 * kHalf problem columns: its first kHalf are the gate and its last kHalf the up
// values of the same kHalf intermediate columns. The 2x1 cluster multicasts the weight tile, each
// CTA of the pair loading one half of it (cute's make_tma_copy cuts the multicast box along N, the
// highest TMA dimension of K-major B), so slice x = 0 is the gate and x = 1 the up half.
#pragma once
#if defined(EPMOE_WITH_CUTLASS)
#include <cuda_bf16.h>

#include "cutlass/epilogue/collective/default_epilogue_array.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "epmoe/tensor.h"
#include "run/cuda/silu.cuh"

namespace epmoe::cuda::cutlass_engine::glu {

// Slice x of output tile n covers problem rows 2 * kHalf * n + kHalf * x.. as CUTLASS tiles the
// 2I-row W13; it must read rows x * I + kHalf * n..: the coordinate shift between the two.
CUTLASS_HOST_DEVICE int slice_shift(int x, int n, int I, int half) {
  return x * I + n * half - (n * 2 * half + x * half);
}

// The producer: Base's load (bf16 or fp8 blockwise mainloop: both take the same arguments, the
// A and B tensors first among the load inputs; the fp8 scales come from load_auxiliary) with slice
// x of the weight tile taken from gate rows (x = 0) or up rows (x = 1) of its intermediate columns.
template <class Base>
struct Loads : Base {
  using Base::Base;

  template <class LoadInputs, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Base::Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write, LoadInputs const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, typename Base::TensorStorage& shared) {
    using namespace cute;
    if (!elect_one_sync()) return;
    using CS = typename Base::DispatchPolicy::ClusterShape;
    static_assert(size<0>(CS{}) == 2 && size<1>(CS{}) == 1, "the weight tile's two slices come from a 2x1 cluster");
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), typename Base::SmemLayoutB{});
    const uint32_t block_x = block_rank_in_cluster % 2, block_y = block_rank_in_cluster / 2;
    auto tma_a = params.tma_load_a.get_slice(block_y);
    auto tma_b = params.tma_load_b.get_slice(block_x);
    auto [m, n, k, l] = blk_coord;
    auto gB_nkl = get<1>(load_inputs);  // (BLK_N, BLK_K, n tiles, k tiles, l) over the problem's 2I rows
    constexpr int kHalf = int(size<1>(typename Base::TileShape{})) / 2;
    const int I = int(size<2>(gB_nkl)) * kHalf;
    const int shift = slice_shift(int(block_x), int(n), I, kHalf);
    Tensor gB = domain_offset(make_coord(shift, 0, 0), gB_nkl(_, _, n, _, l));
    Tensor tAgA = tma_a.partition_S(get<0>(load_inputs)(_, _, m, _, l));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(gB);
    Tensor tBsB = tma_b.partition_D(sB);
    uint16_t mask_a = 0, mask_b = 0;
    auto cluster = Layout<CS>{};
    if constexpr (is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>)
      for (int j = 0; j < size<1>(cluster); ++j) mask_a |= uint16_t(1) << cluster(block_x, j, Int<0>{});
    if constexpr (is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>)
      for (int i = 0; i < size<0>(cluster); ++i) mask_b |= uint16_t(1) << cluster(i, block_y, Int<0>{});
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      copy(params.tma_load_a.with(get<0>(tensormaps), *barrier, mask_a), tAgA(_, _, _, *k_tile_iter),
           tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(get<1>(tensormaps), *barrier, mask_b), tBgB(_, _, _, *k_tile_iter),
           tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++write;
    }
  }
};

// CUTLASS's register-direct ptr-array epilogue (bf16 D of stride type StrideD), whose tile
// operation the SwiGLU epilogues replace (EpilogueOp below; nvfp4w::GluOp), keeping its Params.
template <class StrideD>
struct RegisterEpilogue
    : cutlass::epilogue::collective::DefaultEpilogueArray<
          void, StrideD*, StrideD*, cutlass::epilogue::thread::LinearCombination<cutlass::bfloat16_t, 1, float, float>,
          cutlass::epilogue::PtrArrayNoSmemWarpSpecialized> {
  using Base = cutlass::epilogue::collective::DefaultEpilogueArray<
      void, StrideD*, StrideD*, cutlass::epilogue::thread::LinearCombination<cutlass::bfloat16_t, 1, float, float>,
      cutlass::epilogue::PtrArrayNoSmemWarpSpecialized>;
  typename Base::Params glu_params;  // the base keeps its copy private
  CUTLASS_HOST_DEVICE RegisterEpilogue(typename Base::Params const& p) : Base(p), glu_params(p) {}
};

// The one-GEMM SwiGLU's tile operation. D is the intermediate [rows][I] (group pointer and row
// stride I from the tables). In the m64nN accumulator fragment ((2 columns, 2 rows, N / 8 groups
// of 8 columns) per thread, N = 2 * kHalf) the up value of element i is element i + kHalf / 2.
template <int kHalf>
struct EpilogueOp : RegisterEpilogue<cute::Stride<int64_t, cute::_1, cute::_0>> {
  using RegisterEpilogue<cute::Stride<int64_t, cute::_1, cute::_0>>::RegisterEpilogue;

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_HOST_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                      BlockCoordMNKL blk_coord_mnkl,
                                      cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                      ResidueMNK, int thread_idx, char*) {
#if defined(__CUDA_ARCH__)
    using namespace cute;
    static_assert(decltype(size(accumulators))::value == kHalf, "one m64n(2 kHalf) accumulator set per thread");
    constexpr int kUp = kHalf / 2;  // fragment distance from a gate value to its up value
    const int M = int(get<0>(problem_shape_mnkl));
    const int I = int(get<1>(problem_shape_mnkl)) / 2;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    bf16_raw* D = reinterpret_cast<bf16_raw*>(this->glu_params.ptr_D[l_coord]);
    const int64_t ld = get<0>(this->glu_params.dD[l_coord]);
    // Each accumulator's (row, column) in the problem (columns over 2I as the tiles are laid out).
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, 2 * I)), take<0, 2>(blk_shape_MNK),
                           make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    const int col0 = int(n_coord) * 2 * kHalf;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kUp; i += 2) {
      const int row = get<0>(tCcD(i)), c = get<1>(tCcD(i)) - col0;  // c < kHalf, even
      // bf16 rounding as GEMM1's store, then the SwiGLU pass's arithmetic and rounding.
      float x[2];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float g = __bfloat162float(__float2bfloat16_rn(accumulators(i + j)));
        const float u = __bfloat162float(__float2bfloat16_rn(accumulators(i + j + kUp)));
        x[j] = silu(g) * u;
      }
      if (row < M) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(x[0], x[1]);
        *reinterpret_cast<__nv_bfloat162*>(D + int64_t(row) * ld + int(n_coord) * kHalf + c) = v;
      }
    }
#endif
  }
};

template <int kHalf>
using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp<kHalf>>;

}  // namespace epmoe::cuda::cutlass_engine::glu
#endif  // EPMOE_WITH_CUTLASS
