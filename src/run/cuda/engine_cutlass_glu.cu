// CUTLASS engine, GEMM1 with SwiGLU in ONE grouped GEMM (see engine_cutlass.h,
// grouped_gemm_bf16_glu): a[rows][I] = bf16(silu(bf16(x W_gate^T)) * bf16(x W_up^T)).
//
// Why: unfused, GEMM1 writes [rows][2I] and a pass reads it back and writes [rows][I] (105 us at
// DeepSeek-V3 bf16 M 32768, 40 us at Qwen3-30B; bench/results/2026-12-02-session25-h200.md).
// engine_cutlass_swiglu.cu fuses it as two N = I GEMMs, which cost more than the pass. Here one
// 128x256 tile holds both halves of 128 intermediate columns:
// - Producer: the 2x1 cluster multicasts the 256-row weight tile, each CTA of the pair loading one
//   128-row slice of it (cute's make_tma_copy cuts the multicast box along N, the highest TMA
//   dimension of K-major B). Output tile n (problem N = 2I, I / 128 tiles) has slice 0 read gate
//   rows 128n.. and slice 1 up rows I + 128n..: the slice's coordinate tensor is shifted
//   (domain_offset) before partitioning. Loads, pipeline and MMA are otherwise CUTLASS's.
// - Consumer MMA: unchanged; accumulator columns 0-127 are the gate, 128-255 the up values of the
//   same 128 intermediate columns, and in the m64n256 accumulator fragment ((2 columns, 2 rows,
//   32 groups of 8 columns) per thread) the up value of element i is element i + 64.
// - Epilogue: register-direct (CUTLASS's no-smem ptr-array epilogue interface behind its TMA
//   adapter): each thread rounds its gate and up values to bf16 as GEMM1's store would, applies
//   silu(g) * u as the SwiGLU pass does (silu.cuh), rounds, and stores bf16 pairs.
// Same bits as grouped_gemm_bf16 (N = 2I) + swiglu (bf16 intermediate), which the GPU test checks.
// Needs I % 128 == 0, bf16 weights, no alpha.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "epmoe/error.h"
#include "run/cuda/silu.cuh"

#if defined(EPMOE_WITH_CUTLASS)
#include <cuda_bf16.h>

#include "cutlass/epilogue/collective/default_epilogue_array.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "run/cuda/engine_cutlass_bf16.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;

using namespace bf16;  // the bf16 GEMM's tiles and cluster: its bits
constexpr int kHalf = 128;  // intermediate columns per tile
static_assert(size<1>(TileShape{}) == 2 * kHalf && size<0>(ClusterShape{}) == 2 && glu_fits(kHalf));

// The producer: Base's load with slice x of the weight tile taken from gate rows (x = 0) or up
// rows (x = 1) of the tile's 128 intermediate columns.
template <class Base>
struct GluLoads : Base {
  using Base::Base;

  template <class LoadInputs, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Base::Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write, LoadInputs const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, typename Base::TensorStorage& shared) {
    if (!elect_one_sync()) return;
    using CS = typename Base::DispatchPolicy::ClusterShape;
    static_assert(size<0>(CS{}) == 2 && size<1>(CS{}) == 1, "the weight tile's two slices come from a 2x1 cluster");
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), typename Base::SmemLayoutB{});
    const uint32_t block_x = block_rank_in_cluster % 2, block_y = block_rank_in_cluster / 2;
    auto tma_a = params.tma_load_a.get_slice(block_y);
    auto tma_b = params.tma_load_b.get_slice(block_x);
    auto [m, n, k, l] = blk_coord;
    auto gB_nkl = get<1>(load_inputs);  // (256, 64, n tiles, k tiles, l) over the problem's 2I rows
    const int I = int(size<2>(gB_nkl)) * kHalf;
    // Slice x covers rows 256n + 128x .. of the tile as CUTLASS tiles them; it must read rows
    // 128n + xI ..: shift the coordinates by the difference.
    const int shift = int(block_x) * I + int(n) * kHalf - (int(n) * 2 * kHalf + int(block_x) * kHalf);
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

// The epilogue: CUTLASS's register-direct ptr-array epilogue with its tile operation replaced.
// D is the intermediate [rows][I] (group pointer and row stride I from the tables).
using EpiBase = cutlass::epilogue::collective::DefaultEpilogueArray<
    void, cute::Stride<int64_t, _1, _0>*, cute::Stride<int64_t, _1, _0>*,
    cutlass::epilogue::thread::LinearCombination<Element, 1, float, float>,
    cutlass::epilogue::PtrArrayNoSmemWarpSpecialized>;

struct GluEpilogueOp : EpiBase {
  typename EpiBase::Params glu_params;  // the base keeps its copy private
  CUTLASS_HOST_DEVICE GluEpilogueOp(typename EpiBase::Params const& p) : EpiBase(p), glu_params(p) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_HOST_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                      BlockCoordMNKL blk_coord_mnkl,
                                      cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                      ResidueMNK, int thread_idx, char*) {
#if defined(__CUDA_ARCH__)
    static_assert(decltype(size(accumulators))::value == 128, "one m64n256 accumulator set per thread");
    const int M = int(get<0>(problem_shape_mnkl));
    const int I = int(get<1>(problem_shape_mnkl)) / 2;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    bf16_raw* D = reinterpret_cast<bf16_raw*>(glu_params.ptr_D[l_coord]);
    const int64_t ld = get<0>(glu_params.dD[l_coord]);
    // Each accumulator's (row, column) in the problem (columns over 2I as the tiles are laid out).
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, 2 * I)), take<0, 2>(blk_shape_MNK),
                           make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    const int col0 = int(n_coord) * 2 * kHalf;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 64; i += 2) {
      const int row = get<0>(tCcD(i)), c = get<1>(tCcD(i)) - col0;  // c < 128, even
      // bf16 rounding as GEMM1's store, then the SwiGLU pass's arithmetic and rounding.
      float x[2];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float g = __bfloat162float(__float2bfloat16_rn(accumulators(i + j)));
        const float u = __bfloat162float(__float2bfloat16_rn(accumulators(i + j + 64)));
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
using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<GluEpilogueOp>;

using Gemm = GemmOf<GluLoads<bf16::Mainloop<Epilogue>>, Epilogue>;

}  // namespace

size_t glu_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, false>(experts, sms); }

void grouped_gemm_bf16_glu(const Grouped& g, cudaStream_t stream) {
  if (!glu_fits(g.N) || g.K % kAlign != 0)
    throw UsageError("cutlass bf16 SwiGLU GEMM: intermediate N=" + std::to_string(g.N) +
                     " must be a multiple of 128 and K=" + std::to_string(g.K) + " of 8");
  if (g.alpha || g.halves || g.swap_ab || g.src)
    throw UsageError("cutlass bf16 SwiGLU GEMM: takes no alpha, halves, swap-AB or source");
  Grouped glu = g;
  glu.glu = true;
  detail::run<Gemm, false>(glu, "bf16 SwiGLU", stream);
}

#else

size_t glu_workspace_bytes(int, int) { return 0; }
void grouped_gemm_bf16_glu(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
