// CUTLASS engine, fp8 GEMM1 with SwiGLU in ONE grouped GEMM (see engine_cutlass.h,
// grouped_gemm_fp8_glu): a[rows][I] = bf16(silu(bf16(x W_gate^T)) * bf16(x W_up^T)) from e4m3 rows
// and weights with DeepSeek's block scales, for the fp8 path's intermediate_quant = fp8, whose
// GEMM2 then reads the codes quantize_intermediate makes of it.
//
// Why: unfused, GEMM1 writes [rows][2I] bf16 and the SwiGLU pass reads it back before quantizing;
// here GEMM1 writes [rows][I] and the quantization reads that: half the intermediate bytes written
// and read again. The fp8 GEMM's promotion keeps two accumulator sets, so a 128x256 tile with both
// halves of 128 intermediate columns (the bf16 form's) would need 256 registers per thread; the
// tile is the fp8 GEMM's 128x128 with 64 gate and 64 up columns, the producer and epilogue those of
// the bf16 form (engine_cutlass_glu.cuh). The weight scales then come one per 64 rows
// (glu_fp8_scales' order), since a tile's two halves may lie in different 128-row scale tiles.
// Same bits as grouped_gemm_fp8 (N = 2I) + swiglu with a bf16 intermediate, which the GPU test
// checks. Needs I % 64 == 0, no alpha.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <algorithm>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda/pdl.cuh"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_fp8.cuh"
#include "run/cuda/engine_cutlass_glu.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

namespace {

// Row 2n + h of expert e: the scale tile row of W13's half h that holds intermediate column 64n.
__global__ void glu_scales_kernel(const float* __restrict__ sfw, int E, int I, int kb, float* __restrict__ out) {
  dev::pdl_enter();
  const int nb = fp8_blocks(I), rows = 2 * (I / 64);
  const int64_t total = int64_t(E) * rows * kb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i % kb);
    const int64_t er = i / kb;
    const int e = int(er / rows), r = int(er % rows), h = r & 1, n = r >> 1;
    out[i] = sfw[((int64_t(e) * 2 + h) * nb + (64 * n) / 128) * kb + k];
  }
}

}  // namespace

void glu_fp8_scales(const float* sfw, int E, int I, int K, float* out, cudaStream_t stream, bool pdl) {
  if (!glu_fp8_fits(I))
    throw UsageError("cutlass glu_fp8_scales: intermediate=" + std::to_string(I) + " must be a multiple of 64");
  if (E <= 0) return;
  const int64_t total = int64_t(E) * 2 * (I / 64) * fp8_blocks(K);
  launch_kernel(glu_scales_kernel, unsigned(std::min<int64_t>((total + 255) / 256, 132 * 8)), 256, 0, stream, pdl,
                sfw, E, I, fp8_blocks(K), out);
  EPMOE_CUDA_CHECK_LAUNCH();
}

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;
using namespace fp8;  // the fp8 GEMM's tiles, cluster and K step: its bits

constexpr int kHalf = 64;  // intermediate columns per tile, and weight rows per scale
static_assert(size<1>(TileShape{}) == 2 * kHalf && size<0>(ClusterShape{}) == 2);

using Epilogue = glu::Epilogue<kHalf>;
using Mainloop = fp8::Mainloop<Epilogue, kHalf>;
using Gemm = GemmOf<glu::Loads<Mainloop>, Epilogue>;
static_assert(kScalesAsExpected<Mainloop, kHalf>, "scales K-major, per row and per 64 weight rows");

}  // namespace
}  // namespace epmoe::cuda::cutlass_engine

// The promotion with a row scale and a 64-column weight scale. CUTLASS's generic form (both scales
// per element) asserts that the scale fragments have the accumulator's shape, which the weight
// scale's (8, 2) column groups fail although they index the same elements, and it would multiply
// temp * sa * sb; this form is the one the 128-column GEMM runs (its scale_b folded into sa first):
// accum += temp * (sa * sb), the same roundings, so the halves keep grouped_gemm_fp8's bits.
namespace cutlass::gemm::collective {
using GluAccEngine = cute::ArrayEngine<float, 64>;
using GluAccLayout = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_16>, cute::_1, cute::_1>,
                                  cute::Stride<cute::Stride<cute::_1, cute::_2, cute::_4>, cute::_0, cute::_0>>;
using GluScaleEngine = cute::ArrayEngine<float, 2>;
using GluScaleALayout = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_16>, cute::_1, cute::_1>,
                                     cute::Stride<cute::Stride<cute::_0, cute::_1, cute::_0>, cute::_0, cute::_0>>;
using GluScaleBLayout =
    cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::Shape<cute::_8, cute::_2>>, cute::_1, cute::_1>,
                 cute::Stride<cute::Stride<cute::_0, cute::_0, cute::Stride<cute::_0, cute::_1>>, cute::_0, cute::_0>>;
template <>
template <>
CUTLASS_DEVICE void GmmaFP8Accumulation<GluAccEngine, GluAccLayout>::scale_core<
    GluScaleEngine, GluScaleALayout, GluScaleEngine, GluScaleBLayout>(
    const cute::Tensor<GluScaleEngine, GluScaleALayout>& scale_a,
    const cute::Tensor<GluScaleEngine, GluScaleBLayout>& scale_b) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < cute::size(accum_); ++i) accum_(i) += accum_temp_(i) * (scale_a(i) * scale_b(i));
}
}  // namespace cutlass::gemm::collective

namespace epmoe::cuda::cutlass_engine {

size_t glu_fp8_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, true>(experts, sms); }

void grouped_gemm_fp8_glu(const Grouped& g, cudaStream_t stream) {
  if (!glu_fp8_fits(g.N))
    throw UsageError("cutlass fp8 SwiGLU GEMM: intermediate N=" + std::to_string(g.N) + " must be a multiple of 64");
  if (g.alpha || g.halves || g.swap_ab || g.src)
    throw UsageError("cutlass fp8 SwiGLU GEMM: takes no alpha, halves, swap-AB or source");
  check_fp8(g, "fp8 SwiGLU GEMM");
  Grouped glu = g;
  glu.glu = true;
  detail::run<Gemm, true>(glu, "fp8 SwiGLU", stream);
}

#else  // built without the CUTLASS headers

size_t glu_fp8_workspace_bytes(int, int) { return 0; }
void grouped_gemm_fp8_glu(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
