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

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_bf16.cuh"
#include "run/cuda/engine_cutlass_glu.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;

using namespace bf16;  // the bf16 GEMM's tiles and cluster: its bits
constexpr int kHalf = 128;  // intermediate columns per tile
static_assert(size<1>(TileShape{}) == 2 * kHalf && size<0>(ClusterShape{}) == 2 && glu_fits(kHalf));

using Epilogue = glu::Epilogue<kHalf>;
using Gemm = GemmOf<glu::Loads<bf16::Mainloop<Epilogue>>, Epilogue>;

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
