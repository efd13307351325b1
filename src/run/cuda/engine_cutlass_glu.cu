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

#include "cutlass/cuda_host_adapter.hpp"
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

// The current group as the producer's load needs it to gather A (Grouped::gather): carried as a
// third element of CUTLASS's load inputs, set where the kernel moves to another group.
struct GatherGroup {
  int32_t batch, rows;
};

// The producer: Base's load with slice x of the weight tile taken from gate rows (x = 0) or up
// rows (x = 1) of the tile's 128 intermediate columns. Where the group's rows are gathered
// (Grouped::gather), A is loaded one row at a time: a 2D tensor map over the source rows with a
// box of one row by 64 columns and the 128-byte swizzle, each of the 32 producer lanes loading 4
// of the 128 rows per stage onto the stage's full barrier (rows past the expert's count load row
// -1, which TMA fills with zeros and counts, as it fills rows past the problem in the tiled load).
// The swizzle is a function of the shared address, so a row written at its own offset lands where
// the 128-row box puts it; the barrier expects the same bytes. (cp.async gathers on the 32 lanes
// gave the same bits at 2.6x the GEMM's time, bench/results/history-runner.md, session 28.)
template <class Base>
struct GluLoads : Base {
  using Base::Base;
  static constexpr bool kGathers = true;  // detail::Tables fills gather_src

  struct Arguments : Base::Arguments {
    const int32_t* const* gather_src = nullptr;  // [groups]: first source row index, or null (TMA)
    const void* gather_a = nullptr;              // the source rows [gather_rows][gather_lda] bf16
    int64_t gather_rows = 0, gather_lda = 0;
    int gather_k = 0;
  };
  struct Params : Base::Params {
    const int32_t* const* gather_src = nullptr;
    cute::TmaDescriptor gather_map{};
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    Params p{Base::to_underlying_arguments(shapes, args, workspace)};
    p.gather_src = args.gather_src;
    p.gather_map = {};
    if (args.gather_a) {
      const cuuint64_t dims[2] = {cuuint64_t(args.gather_k), cuuint64_t(args.gather_rows)};
      const cuuint64_t strides[1] = {cuuint64_t(args.gather_lda) * sizeof(Element)};
      const cuuint32_t box[2] = {64, 1}, unit[2] = {1, 1};
      const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
          &p.gather_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(args.gather_a), dims, strides, box,
          unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS)
        throw BackendError("cutlass bf16 SwiGLU GEMM: the gathered rows' tensor map was refused (CUresult " +
                           std::to_string(int(r)) + ", rows " + std::to_string(args.gather_rows) + ", lda " +
                           std::to_string(args.gather_lda) + ")");
    }
    return p;
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params) const {
    auto base = Base::load_init(shape, params);
    return cute::make_tuple(get<0>(base), get<1>(base), GatherGroup{0, 0});
  }
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& in, Params const& params,
                                                     ProblemShape_MNKL shape, int32_t next_batch) {
    InputTensors out = Base::tensors_perform_update(in, params, shape, next_batch);
    get<2>(out) = GatherGroup{next_batch, int32_t(get<0>(shape))};
    return out;
  }

  template <class LoadInputs, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write, LoadInputs const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, typename Base::TensorStorage& shared) {
    const GatherGroup grp = get<2>(load_inputs);
    const int32_t* gsrc = params.gather_src ? params.gather_src[grp.batch] : nullptr;
    const bool leader = elect_one_sync();
    if (!gsrc && !leader) return;
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
    if (!gsrc) {
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
      return;
    }
    constexpr int kRows = size<0>(typename Base::TileShape{}), kCols = size<2>(typename Base::TileShape{});
    static_assert(kRows == 128 && kCols == 64, "a lane's 4 rows assume 128 x 64 bf16 A tiles");
    static_assert(is_same_v<typename Base::SmemLayoutAtomA, decltype(GMMA::Layout_K_SW128_Atom<Element>{})>,
                  "A's stages are 128-byte-swizzled K-major rows of 128 bytes");
    constexpr int kStageElems = kRows * kCols;
    static_assert(cosize(typename Base::SmemLayoutA{}) == kStageElems * Base::DispatchPolicy::Stages);
    const int lane = int(threadIdx.x % 32);
    int32_t src[kRows / 32];  // the source row of tile rows lane + 32j, -1 past the expert's rows
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kRows / 32; ++j) {
      const int r = int(m) * kRows + lane + 32 * j;
      src[j] = r < grp.rows ? __ldg(gsrc + r) : -1;
    }
    Element* const a_rows = shared.smem_A.data() + lane * kCols;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);  // lane 0 (the pipeline's leader) expects A's and B's bytes
      uint64_t* full = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      const int kt = int(*k_tile_iter);
      if (leader)
        copy(params.tma_load_b.with(get<1>(tensormaps), *full, mask_b), tBgB(_, _, _, kt), tBsB(_, _, _, stage));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kRows / 32; ++j)
        SM90_TMA_LOAD_2D::copy(&params.gather_map, full, 0, a_rows + stage * kStageElems + 32 * j * kCols,
                               kt * kCols, src[j]);
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
static_assert(detail::Tables<Gemm, false>::gather, "the tables carry gather_src for this mainloop");

}  // namespace

size_t glu_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, false>(experts, sms); }

void grouped_gemm_bf16_glu(const Grouped& g, cudaStream_t stream) {
  if (!glu_fits(g.N) || g.K % kAlign != 0)
    throw UsageError("cutlass bf16 SwiGLU GEMM: intermediate N=" + std::to_string(g.N) +
                     " must be a multiple of 128 and K=" + std::to_string(g.K) + " of 8");
  if (g.alpha || g.halves || g.swap_ab || g.src)
    throw UsageError("cutlass bf16 SwiGLU GEMM: takes no alpha, halves, swap-AB or source");
  if (g.gather && (g.lda < g.K || g.lda % kAlign != 0 || reinterpret_cast<uintptr_t>(g.A) % 16 != 0 ||
                   g.a_rows <= 0 || g.a_rows > 0x7fffffff))
    throw UsageError("cutlass bf16 SwiGLU GEMM: gathered rows need lda (" + std::to_string(g.lda) + ") >= K (" +
                     std::to_string(g.K) + ") and a multiple of 8, A 16-byte aligned, and 1 to 2^31-1 rows of A (" +
                     std::to_string(g.a_rows) + ")");
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
