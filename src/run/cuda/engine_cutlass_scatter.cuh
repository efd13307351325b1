// The epilogue of GEMM2's forms that write single-row slots home (engine_cutlass.h, RowScatter):
// CUTLASS's register-direct ptr-array epilogue with its tile operation replaced. Each thread looks
// up its two rows' pairs once, rounds as the plain GEMM's store does (bf16(1 * acc)), and stores
// bf16 pairs either to out[row] (pair -1) or, weighted as the weighted sum weights a one-term sum,
// to y[slot]. Shared by the bf16 (engine_cutlass_scatter.cu) and fp8 (engine_cutlass_scatter_fp8.cu)
// instantiations, whose accumulators differ only in width.
#pragma once
#if defined(EPMOE_WITH_CUTLASS)
#include <cuda_bf16.h>

#include "cutlass/epilogue/collective/default_epilogue_array.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "run/cuda/engine_cutlass.h"

namespace epmoe::cuda::cutlass_engine::scatter {

using namespace cute;

using ScatterEpiBase = cutlass::epilogue::collective::DefaultEpilogueArray<
    void, cute::Stride<int64_t, cute::_1, cute::_0>*, cute::Stride<int64_t, cute::_1, cute::_0>*,
    cutlass::epilogue::thread::LinearCombination<cutlass::bfloat16_t, 1, float, float>,
    cutlass::epilogue::PtrArrayNoSmemWarpSpecialized>;

struct ScatterEpilogueOp : ScatterEpiBase {
  struct Arguments : ScatterEpiBase::Arguments {
    const detail::ScatterTable* scatter = nullptr;  // in the workspace (fill_tables)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  Params sp;  // the base keeps its copy private
  CUTLASS_HOST_DEVICE ScatterEpilogueOp(Params const& p) : ScatterEpiBase(p), sp(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_HOST_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                      BlockCoordMNKL blk_coord_mnkl,
                                      cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                      ResidueMNK, int thread_idx, char*) {
#if defined(__CUDA_ARCH__)
    // The m64nN accumulator fragment per thread: (2 columns, 2 rows 8 apart, N/8 column groups),
    // so element i is in the thread's row (i >> 1) & 1.
    constexpr int kAcc = decltype(size(accumulators))::value;
    static_assert(kAcc % 4 == 0, "one m64nN accumulator set per thread");
    const int M = int(get<0>(problem_shape_mnkl));
    const int N = int(get<1>(problem_shape_mnkl));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    bf16_raw* D = reinterpret_cast<bf16_raw*>(sp.ptr_D[l_coord]);
    const int64_t ld = get<0>(sp.dD[l_coord]);
    const detail::ScatterTable& st = *sp.scatter;
    const int32_t* row_pair = st.s.row_pair + st.offsets[l_coord];
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                           make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    int row[2], pair[2];
    float w[2];
    bf16_raw* dst[2];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < 2; ++r) {
      row[r] = get<0>(tCcD(2 * r));
      pair[r] = row[r] < M ? __ldg(row_pair + row[r]) : -1;
      w[r] = pair[r] >= 0 ? __ldg(st.s.weights + pair[r]) : 0.f;
      dst[r] = pair[r] >= 0 ? st.s.y + int64_t(pair[r] / st.s.top_k) * N : D + int64_t(row[r]) * ld;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kAcc; i += 2) {
      const int r = (i >> 1) & 1, col = get<1>(tCcD(i));  // col even; N % 8 == 0
      if (row[r] >= M || col >= N) continue;
      // The plain GEMM's store: bf16(1 * acc). A single-row slot then as the weighted sum's
      // one-term form: bf16(0 + w * o), in fp32 without fma (0 + (-0) is +0 there too).
      float x0 = __bfloat162float(__float2bfloat16_rn(accumulators(i)));
      float x1 = __bfloat162float(__float2bfloat16_rn(accumulators(i + 1)));
      if (pair[r] >= 0) {
        x0 = __fadd_rn(0.f, __fmul_rn(w[r], x0));
        x1 = __fadd_rn(0.f, __fmul_rn(w[r], x1));
      }
      *reinterpret_cast<__nv_bfloat162*>(dst[r] + col) = __floats2bfloat162_rn(x0, x1);
    }
#endif
  }
};
using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<ScatterEpilogueOp>;

}  // namespace epmoe::cuda::cutlass_engine::scatter
#endif  // EPMOE_WITH_CUTLASS
