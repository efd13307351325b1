// CUTLASS engine, fp8 instantiation (see engine_cutlass.h): e4m3 x e4m3 grouped GEMM with DeepSeek
// block scales, and the fp8 permute that feeds it the dispatched bytes unchanged.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "run/cuda/permute.cuh"

#if defined(EPMOE_WITH_CUTLASS)
#include "run/cuda/engine_cutlass_fp8.cuh"
#endif

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

using namespace cute;
using namespace fp8;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, kAlignD, ElementD,
    cutlass::layout::RowMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
using Mainloop = MainloopFor<Epilogue>;
using Gemm = GemmOf<Epilogue>;

static_assert(!Mainloop::MMajorSFA && !Mainloop::NMajorSFB, "scales are expected K-major");
static_assert(Mainloop::ScaleGranularityM == 1 && Mainloop::ScaleGranularityN == 128 &&
              Mainloop::ScaleGranularityK == 128);

}  // namespace

size_t fp8_workspace_bytes(int experts, int sms) { return detail::workspace_bytes<Gemm, true>(experts, sms); }

void check_fp8(const Grouped& g, const char* what) {
  if (g.K % 16 != 0)
    throw UsageError(std::string("cutlass ") + what + ": K=" + std::to_string(g.K) +
                     " must be a multiple of 16 (16-byte TMA rows of e4m3)");
  if (g.N % 8 != 0)
    throw UsageError(std::string("cutlass ") + what + ": N=" + std::to_string(g.N) +
                     " must be a multiple of 8 (16-byte TMA rows of bf16 output; with halves the up half's "
                     "columns start N in)");
  if (!g.sfa || !g.sfw)
    throw UsageError(std::string("cutlass ") + what + ": activation and weight scales must be non-null");
}

void grouped_gemm_fp8(const Grouped& g, cudaStream_t stream) {
  if (g.scatter.row_pair && (g.swap_ab || g.halves))
    throw UsageError("cutlass fp8 grouped GEMM: scatter has no swap-AB or halves form; clear one of them");
  if (g.swap_ab) return grouped_gemm_fp8_swap(g, stream);
  if (g.scatter.row_pair) return grouped_gemm_fp8_scatter(g, stream);
  check_fp8(g, "fp8 grouped GEMM");
  detail::run<Gemm, true>(g, "fp8", stream);
}

#else  // built without the CUTLASS headers

size_t fp8_workspace_bytes(int, int) { return 0; }
void check_fp8(const Grouped&, const char*) {}
void grouped_gemm_fp8(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

namespace {

// One CTA per slot: claims a row per valid (slot, k) (same rule as the bf16 permute: expert offset
// plus an atomic fill counter) and copies the slot's e4m3 row (16 bytes per thread step) and its
// fp32 block scales (ceil(H/128): the last block may be partial) there.
__global__ void permute_fp8_kernel(const uint8_t* __restrict__ payload, const float* __restrict__ scales,
                                   const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int C, int K,
                                   int E, int H, const int32_t* __restrict__ offsets, int32_t* __restrict__ fill,
                                   int32_t* __restrict__ pair_pos, uint8_t* __restrict__ a8, float* __restrict__ sfa) {
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint4* src = reinterpret_cast<const uint4*>(payload + i * int64_t(H));
  const int nb = fp8_blocks(H);
  const float* ssrc = scales + i * int64_t(nb);
  for (int c = threadIdx.x; c < H / 16; c += blockDim.x) {
    const uint4 v = src[c];
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) reinterpret_cast<uint4*>(a8 + int64_t(pos[k]) * H)[c] = v;
  }
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    const float s = ssrc[b];
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) sfa[int64_t(pos[k]) * nb + b] = s;
  }
}

}  // namespace

void permute_fp8(const uint8_t* payload, const float* scales, const int32_t* ids, const int32_t* counts,
                 int64_t slots, int C, int K, int E, int H, const int32_t* offsets, int32_t* fill,
                 int32_t* pair_pos, uint8_t* a8, float* sfa, cudaStream_t stream) {
  if (slots <= 0) return;
  if (H % 16 != 0) throw UsageError("cutlass fp8 permute: hidden=" + std::to_string(H) + " must be a multiple of 16");
  if (K > 32) throw UsageError("cutlass fp8 permute: top_k=" + std::to_string(K) + " exceeds 32");
  permute_fp8_kernel<<<unsigned(slots), 128, 0, stream>>>(payload, scales, ids, counts, C, K, E, H, offsets, fill,
                                                          pair_pos, a8, sfa);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda::cutlass_engine
