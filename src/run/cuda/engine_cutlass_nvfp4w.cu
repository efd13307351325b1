// CUTLASS engine, nvfp4 weights x bf16 rows from the paired copy (engine_cutlass_nvfp4w.cuh): the
// 256-wide token tiles, the entry points that check the arguments and pick a width, and the
// writer of the paired copy.
#define EPMOE_CUTLASS_GROUPED_IMPL 1
#include "run/cuda/engine_cutlass_nvfp4w.cuh"

#include <cstdint>
#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"

namespace epmoe::cuda::cutlass_engine {

#if defined(EPMOE_WITH_CUTLASS)
namespace {

// One thread per 16-element block: its 8 bytes of codes (element 2q in the low nibble of byte q)
// and its scale become 8 pairs, one 16-byte store. A NaN scale sets *nan_seen. With glu_i > 0 the
// rows (2 * glu_i of them per expert) go to their GLU-order places (nvfp4_paired::glu_row).
__global__ void paired_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales, int64_t blocks,
                              bool aligned, int row_blocks, int glu_i, uint8_t* __restrict__ out,
                              int* __restrict__ nan_seen) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < blocks; g += int64_t(gridDim.x) * blockDim.x) {
    uint8_t b[8];
    if (aligned) {
      *reinterpret_cast<uint2*>(b) = *reinterpret_cast<const uint2*>(data + g * 8);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) b[q] = data[g * 8 + q];
    }
    const uint32_t s = scales[g];
    if (nvfp4_paired::pair_scale(s).nan) atomicOr(nan_seen, 1);
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)  // byte q holds the pair (2q, 2q + 1)
      o[j] = nvfp4_paired::pair_bits(b[2 * j] & 0xfu, b[2 * j] >> 4, s) |
             (nvfp4_paired::pair_bits(b[2 * j + 1] & 0xfu, b[2 * j + 1] >> 4, s) << 16);
    int64_t to = g;
    if (glu_i > 0) {
      const int64_t row = g / row_blocks;  // over all experts
      const int64_t e = row / (2 * glu_i);
      const int s = int(row - e * 2 * glu_i);
      to = (e * 2 * glu_i + nvfp4_paired::glu_row(s, glu_i)) * row_blocks + (g - row * row_blocks);
    }
    reinterpret_cast<uint4*>(out)[to] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace

size_t nvfp4_paired_bytes(const MatrixView& m) { return size_t(m.experts) * size_t(m.rows) * size_t(m.cols); }

void write_nvfp4_paired(const MatrixView& m, uint8_t* out, int* nan_seen, cudaStream_t stream, bool glu_order) {
  if (m.format != WeightFormat::nvfp4 || m.device != DeviceKind::cuda || !m.data || !m.scales)
    throw UsageError("write_nvfp4_paired: needs nvfp4 weights with data and scales on the CUDA device");
  if (m.cols % 16 != 0)
    throw UsageError("write_nvfp4_paired: cols=" + std::to_string(m.cols) + " must be a multiple of 16");
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) throw UsageError("write_nvfp4_paired: out must be 16-byte aligned");
  if (!nan_seen) throw UsageError("write_nvfp4_paired: nan_seen must point at a device int");
  if (glu_order && (m.rows % 16 != 0))
    throw UsageError("write_nvfp4_paired: GLU order needs W13's rows=" + std::to_string(m.rows) +
                     " (2I) to be a multiple of 16, i.e. I a multiple of 8");
  const int64_t blocks = int64_t(m.experts) * m.rows * (m.cols / 16);
  if (blocks == 0) return;
  const uint8_t* data = static_cast<const uint8_t*>(m.data);
  const int threads = 256;
  const int grid = static_cast<int>(std::min<int64_t>((blocks + threads - 1) / threads, 65535));
  paired_kernel<<<grid, threads, 0, stream>>>(data, static_cast<const uint8_t*>(m.scales), blocks,
                                              reinterpret_cast<uintptr_t>(data) % 8 == 0, m.cols / 16,
                                              glu_order ? m.rows / 2 : 0, out, nan_seen);
  EPMOE_CUDA_CHECK_LAUNCH();
}

size_t nvfp4w_workspace_bytes(int experts, int sms, int tile_n, bool glu) {
  mixed_check_tile(tile_n, "nvfp4-weight");
  if (glu) return detail::nvfp4w_glu_workspace_bytes(experts, sms, tile_n);
  if (tile_n == 64) return detail::nvfp4w_n64_workspace_bytes(experts, sms);
  if (tile_n == 128) return detail::nvfp4w_n128_workspace_bytes(experts, sms);
  return detail::workspace_bytes<nvfp4w::Gemm<256>::Type, false, false, true>(experts, sms);
}

void grouped_gemm_nvfp4w(const Grouped& g, cudaStream_t stream) {
  mixed_check_shape(g, "nvfp4-weight");
  const char* what = "nvfp4-weight grouped GEMM";
  if (!g.alpha)
    throw UsageError(std::string("cutlass ") + what + ": alpha (2^8 / global scale per expert) must be non-null");
  if (g.sfa || g.sfw || g.halves || g.src)
    throw UsageError(std::string("cutlass ") + what + ": takes no scales, halves or source");
  if (g.glu) return detail::grouped_gemm_nvfp4w_glu(g, stream);
  if (g.swap_tile_n == 64) return detail::grouped_gemm_nvfp4w_n64(g, stream);
  if (g.swap_tile_n == 128) return detail::grouped_gemm_nvfp4w_n128(g, stream);
  // The head launch's fill writes its tail's and mid's tables (run_mixed, Grouped::Part): one layout.
  static_assert(
      detail::same_tables<nvfp4w::Gemm<256>::Type, nvfp4w::Gemm<Grouped::kPartTail>::Type, false, false, true>() &&
      detail::same_tables<nvfp4w::Gemm<256>::Type, nvfp4w::Gemm<Grouped::kPartMid>::Type, false, false, true>());
  detail::run<nvfp4w::Gemm<256>::Type, false, false, true>(g, "nvfp4-weight (256-wide token tiles)", stream);
}

#else  // built without the CUTLASS headers

size_t nvfp4_paired_bytes(const MatrixView&) { return 0; }
void write_nvfp4_paired(const MatrixView&, uint8_t*, int*, cudaStream_t, bool) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers)");
}
size_t nvfp4w_workspace_bytes(int, int, int, bool) { return 0; }
void grouped_gemm_nvfp4w(const Grouped&, cudaStream_t) {
  throw UsageError("runner cuda: engine cutlass is not available (built without CUTLASS headers; run scripts/setup.sh "
                   "and re-run cmake), use EPMOE_RUNNER_ENGINE=mma or auto");
}

#endif

}  // namespace epmoe::cuda::cutlass_engine
