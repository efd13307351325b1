// Weight widening for the CUTLASS engine (see widen.h).
#include "run/cuda/widen.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"

namespace epmoe::cuda::widen {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerExpert = 1024;

// Two e4m3 codes (low byte first) to fp32, exactly (every e4m3 value is an f16 normal or zero).
__device__ __forceinline__ float2 e4m3x2_f32(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One thread widens one group of 16 consecutive weights of a row (cols % 16 == 0, so a group never
// straddles a row, a 128-column fp8 tile or an nvfp4 scale block) into 32 bytes of bf16.
// blockIdx.y = expert within the chunk; the x-grid strides over the expert's groups.
__global__ void __launch_bounds__(kThreads)
    widen_fp8_kernel(const uint8_t* __restrict__ data, const float* __restrict__ scales, int rows, int cols,
                     int row_split, int e0,
                     const int32_t* __restrict__ cnt, bool aligned, bf16_raw* __restrict__ out) {
  const int e = e0 + blockIdx.y;
  if (cnt && cnt[e] == 0) return;
  const int64_t per = int64_t(rows) * cols, groups = per / 16;
  const int rb = fp8_tile_rows(rows, row_split), cb = (cols + 127) / 128;
  const uint8_t* src = data + int64_t(e) * per;
  const float* sc = scales + int64_t(e) * rb * cb;
  uint4* dst = reinterpret_cast<uint4*>(out + int64_t(blockIdx.y) * per);
  for (int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * kThreads) {
    const int64_t i = g * 16;
    const int r = int(i / cols), c = int(i % cols);
    const float s = sc[fp8_tile_row(r, row_split) * cb + c / 128];
    uint8_t b[16];
    if (aligned) {
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(src + i);
    } else {
#pragma unroll
      for (int q = 0; q < 16; ++q) b[q] = src[i + q];
    }
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float2 f = e4m3x2_f32(uint16_t(b[2 * q] | (b[2 * q + 1] << 8)));
      // One rounding: the product is formed in fp32 (no fma to contract into) and rounded once.
      o[q] = pack2(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
    }
    dst[2 * g] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[2 * g + 1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__global__ void __launch_bounds__(kThreads)
    widen_nvfp4_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales, int rows, int cols,
                       int e0, const int32_t* __restrict__ cnt, bool aligned, bf16_raw* __restrict__ out) {
  const int e = e0 + blockIdx.y;
  if (cnt && cnt[e] == 0) return;
  const int64_t per = int64_t(rows) * cols, groups = per / 16;
  const uint8_t* src = data + int64_t(e) * (per / 2);
  const uint8_t* sc = scales + int64_t(e) * groups;  // [rows][cols/16]: one scale per group
  uint4* dst = reinterpret_cast<uint4*>(out + int64_t(blockIdx.y) * per);
  for (int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * kThreads) {
    uint8_t b[8];
    if (aligned) {
      *reinterpret_cast<uint2*>(b) = *reinterpret_cast<const uint2*>(src + g * 8);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) b[q] = src[g * 8 + q];
    }
    const float s = num::e4m3_to_f32(sc[g]);
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 8; ++q)  // element 2q in the low nibble; e2m1 * e4m3 is exact in fp32 and bf16
      o[q] = pack2(__fmul_rn(num::e2m1_to_f32(b[q] & 0xf), s), __fmul_rn(num::e2m1_to_f32(b[q] >> 4), s));
    dst[2 * g] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[2 * g + 1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__global__ void inverse_kernel(const float* __restrict__ gs, int E, float factor, float* __restrict__ inv) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < E) inv[e] = __fmul_rn(factor, __fdiv_rn(1.0f, gs[e]));
}

}  // namespace

size_t expert_bytes(const MatrixView& m) { return size_t(m.rows) * size_t(m.cols) * sizeof(bf16_raw); }

int chunk_experts(size_t scratch_bytes, size_t expert_bytes, int experts) {
  if (experts <= 0 || expert_bytes == 0) return std::max(experts, 0);
  const size_t fit = scratch_bytes / expert_bytes;
  return static_cast<int>(std::clamp<size_t>(fit, 1, size_t(experts)));
}

void to_bf16(const MatrixView& m, int e0, int n, const int32_t* rows, bf16_raw* out, cudaStream_t stream) {
  if (n <= 0) return;
  if (m.format == WeightFormat::bf16)
    throw UsageError("widen: weights are already bf16; pass them to the bf16 GEMM directly");
  if (m.device != DeviceKind::cuda || !m.data || !m.scales)
    throw UsageError("widen: " + std::string(format_name(m.format)) +
                     " weights need data and scales on the CUDA device");
  if (m.cols % 16 != 0)
    throw UsageError("widen: cols=" + std::to_string(m.cols) + " must be a multiple of 16 (one group per thread)");
  if (e0 < 0 || e0 + n > m.experts)
    throw UsageError("widen: experts [" + std::to_string(e0) + ", " + std::to_string(e0 + n) + ") outside [0, " +
                     std::to_string(m.experts) + ")");
  if (n > 65535) throw UsageError("widen: a chunk of " + std::to_string(n) + " experts exceeds 65535");
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) throw UsageError("widen: out must be 16-byte aligned");
  const int64_t groups = int64_t(m.rows) * m.cols / 16;
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>((groups + kThreads - 1) / kThreads, 1, kMaxBlocksPerExpert)),
                  static_cast<unsigned>(n));
  const uint8_t* data = static_cast<const uint8_t*>(m.data);
  if (m.format == WeightFormat::fp8) {
    const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0;
    widen_fp8_kernel<<<grid, kThreads, 0, stream>>>(data, static_cast<const float*>(m.scales), m.rows, m.cols,
                                                    m.row_split, e0, rows,
                                                     aligned, out);
  } else {
    const bool aligned = reinterpret_cast<uintptr_t>(data) % 8 == 0;
    widen_nvfp4_kernel<<<grid, kThreads, 0, stream>>>(data, static_cast<const uint8_t*>(m.scales), m.rows, m.cols, e0,
                                                       rows, aligned, out);
  }
  EPMOE_CUDA_CHECK_LAUNCH();
}

void inverse_scales(const float* gs, int experts, float* inv, cudaStream_t stream, float factor) {
  if (experts <= 0) return;
  if (!gs) throw UsageError("widen: nvfp4 global_scale array is null");
  inverse_kernel<<<(experts + 255) / 256, 256, 0, stream>>>(gs, experts, factor, inv);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda::widen
