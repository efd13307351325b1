// CUTLASS engine, GEMM1's up half with SwiGLU fused into its epilogue (see engine_cutlass.h).
//
// Why two GEMMs and a source: CUTLASS's epilogue works on one output tile, and in W13 the gate and
// up rows of an intermediate column are I rows apart, so a tile of the whole GEMM1 never holds
// both. Run as its gate half (the plain bf16 GEMM, N = I) and then its up half, whose epilogue
// loads the gate as its source tensor C (per-group pointers, TMA, like D) and writes
// bf16(silu(gate) * alpha * acc). Against GEMM1 [rows][2I] + a SwiGLU pass, that moves 6I instead
// of 10I bytes per row through HBM and drops the pass (123 us at M 32768, DeepSeek-V3), but two
// N = I GEMMs and the source load cost more (4.74 ms against 4.71 unfused, bf16 M 32768;
// bench/results/history-runner.md), so the runner uses it only when asked (tuning.fused_swiglu)
// and only where the one-GEMM form (engine_cutlass_glu.cu, I % 128 == 0) does not apply.
// Numerics: the gate is rounded to bf16 as before; the up half is not rounded before the product
// (the unfused pass read it as bf16), as in the decode engines' fused epilogues.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "run/cuda/silu.cuh"

#if defined(EPMOE_WITH_CUTLASS)
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "run/cuda/engine_cutlass_bf16.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;

// silu(gate) * (alpha * acc) in fp32, silu written as every other engine writes it.
template <class T>
struct SwigluFn {
  CUTLASS_HOST_DEVICE T operator()(T const& gate, T const& alpha, T const& acc) const {
#if defined(__CUDA_ARCH__)
    return silu(gate) * (alpha * acc);
#else
    return (gate / (T(1) + expf(-gate))) * (alpha * acc);
#endif
  }
};
template <int N>
struct SwigluFn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& gate,
                                                     cutlass::Array<float, N> const& alpha,
                                                     cutlass::Array<float, N> const& acc) const {
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = silu(gate[i]) * (alpha[i] * acc[i]);
    return out;
  }
};

// Same tiles and cluster as the bf16 GEMM (engine_cutlass_bf16.cuh).
using namespace bf16;

namespace fusion = cutlass::epilogue::fusion;
// Children (source, alpha, accumulator), then the node; make_args fills op_1 (alpha).
using Fusion = fusion::Sm90EVT<fusion::Sm90Compute<SwigluFn, Element, float, cutlass::FloatRoundStyle::round_to_nearest>,
                               fusion::Sm90SrcFetch<Element>,
                               fusion::Sm90ScalarBroadcastPtrArray<float, Stride<_0, _0, int64_t>>,
                               fusion::Sm90AccFetch>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, cutlass::layout::RowMajor*, kAlign, Element,
    cutlass::layout::RowMajor*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

using Gemm = GemmOf<bf16::Mainloop<Epilogue>, Epilogue>;

}  // namespace

size_t swiglu_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, false, true>(experts, sms); }

void grouped_gemm_bf16_swiglu(const Grouped& g, cudaStream_t stream) {
  if (g.swap_ab) throw UsageError("cutlass bf16 SwiGLU grouped GEMM: has no swap-AB form; run it with swap_ab = false");
  if (g.K % kAlign != 0 || g.N % kAlign != 0)
    throw UsageError("cutlass bf16 SwiGLU grouped GEMM: N=" + std::to_string(g.N) + " and K=" + std::to_string(g.K) +
                     " must be multiples of 8 (16-byte TMA rows)");
  detail::run<Gemm, false, true>(g, "bf16 swiglu", stream);
}

#else  // built without the CUTLASS headers

size_t swiglu_workspace_bytes(int, int) { return 0; }
void grouped_gemm_bf16_swiglu(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
