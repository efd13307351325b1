// CUTLASS engine, fp8 weights x bf16 rows (engine_cutlass_fp8w.cuh): the 256-wide token tiles, the
// entry points that check the arguments and pick a width, and the scale expansion.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_fp8w.cuh"

#include <cstdint>
#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

// out[e][k][n] = sfw[e][tile row of n][k]; one thread per 4 consecutive weight rows (N and the
// half boundary are multiples of 8 and of 64, and tile boundaries of 128, so 4 rows from a multiple
// of 4 share a tile), one grid row per (block of K, expert): a 16-byte store per thread, no 64-bit
// divisions (the first form, one thread and a 64-bit div/mod per element, ran at ~0.8 TB/s).
// `half_rows`: W13 stored as two halves whose scale grids restart at row half_rows (= I; N for a
// single grid), so row n is row n % half_rows of half n / half_rows.
__global__ void expand_scales_kernel(const float* __restrict__ sfw, int N, int kb, int half_rows,
                                     float* __restrict__ out) {
  const int n = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (n >= N) return;
  const int k = blockIdx.y, e = blockIdx.z;
  const int tiles_per_half = fp8_blocks(half_rows);
  const int tiles = (N / half_rows) * tiles_per_half;
  const int tile = (n / half_rows) * tiles_per_half + (n % half_rows) / 128;
  const float s = sfw[(int64_t(e) * tiles + tile) * kb + k];
  *reinterpret_cast<float4*>(out + (int64_t(e) * kb + k) * N + n) = make_float4(s, s, s, s);
}

}  // namespace

size_t fp8w_scales_bytes(int E, int N, int K) { return size_t(E) * fp8_blocks(K) * N * sizeof(float); }

void expand_fp8_scales(const float* sfw, int E, int N, int K, int half_rows, float* out, cudaStream_t stream) {
  if (half_rows <= 0 || N % half_rows != 0)
    throw UsageError("expand_fp8_scales: half_rows=" + std::to_string(half_rows) + " must divide N=" +
                     std::to_string(N));
  if (N % 4 != 0 || half_rows % 4 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw UsageError("expand_fp8_scales: N=" + std::to_string(N) + " and half_rows=" + std::to_string(half_rows) +
                     " must be multiples of 4 and out 16-byte aligned (one 16-byte store per 4 rows)");
  if (int64_t(E) * N * K == 0) return;
  const int threads = 256;
  const dim3 grid((N / 4 + threads - 1) / threads, fp8_blocks(K), E);
  expand_scales_kernel<<<grid, threads, 0, stream>>>(sfw, N, fp8_blocks(K), half_rows, out);
  EPMOE_CUDA_CHECK(cudaGetLastError());
}

size_t fp8w_workspace_bytes(int experts, int sms, int tile_n) {
  mixed_check_tile(tile_n, "fp8-weight");
  if (tile_n == 64) return detail::fp8w_n64_workspace_bytes(experts, sms);
  if (tile_n == 128) return detail::fp8w_n128_workspace_bytes(experts, sms);
  return detail::workspace_bytes<fp8w::Gemm<256>::Type, false, false, true, true>(experts, sms);
}

void grouped_gemm_fp8w(const Grouped& g, cudaStream_t stream) {
  mixed_check_shape(g, "fp8-weight");
  const char* what = "fp8-weight grouped GEMM";
  if (!g.sfw) throw UsageError(std::string("cutlass ") + what + ": the row scales (expand_fp8_scales) must be non-null");
  if (g.sfa || g.alpha || g.halves || g.glu || g.src)
    throw UsageError(std::string("cutlass ") + what + ": takes no row scales, alpha, halves, glu or source");
  if (g.swap_tile_n == 64) return detail::grouped_gemm_fp8w_n64(g, stream);
  if (g.swap_tile_n == 128) return detail::grouped_gemm_fp8w_n128(g, stream);
  // The head launch's fill writes its tail's and mid's tables (run_mixed, Grouped::Part): one layout.
  static_assert(detail::same_tables<fp8w::Gemm<256>::Type, fp8w::Gemm<Grouped::kPartTail>::Type, false, false, true,
                                    true>() &&
                detail::same_tables<fp8w::Gemm<256>::Type, fp8w::Gemm<Grouped::kPartMid>::Type, false, false, true,
                                    true>());
  detail::run<fp8w::Gemm<256>::Type, false, false, true, true>(g, "fp8-weight (256-wide token tiles)", stream);
}

#else  // built without the CUTLASS headers

size_t fp8w_scales_bytes(int, int, int) { return 0; }
void expand_fp8_scales(const float*, int, int, int, int, float*, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}
size_t fp8w_workspace_bytes(int, int, int) { return 0; }
void grouped_gemm_fp8w(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
