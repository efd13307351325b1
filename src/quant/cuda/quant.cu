#include "quant/cuda/quant.h"

#include <string>

#include "core/cuda/check.h"
#include "epmoe/error.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool row_skipped(int64_t j, const int32_t* row_map, const int32_t* n_valid,
                                            int64_t* src) {
  if (n_valid && j >= *n_valid) return true;
  *src = row_map ? row_map[j] : j;
  return *src < 0;
}

// One CTA per output row; fp8 uses one warp per 128-block (4 values a lane; in a partial last
// block the lanes past H count 0 towards the amax, as if the block ended there), nvfp4 one thread per
// 16-block, bf16 a 16-byte copy per thread.
__global__ void quantize_kernel(ActFormat f, QuantParams p, const bf16_raw* __restrict__ in,
                                const int32_t* __restrict__ row_map, const int32_t* __restrict__ n_valid,
                                int H, uint8_t* __restrict__ payload, uint8_t* __restrict__ scales) {
  const int64_t j = blockIdx.x;
  int64_t src;
  if (row_skipped(j, row_map, n_valid, &src)) return;
  const bf16_raw* x = in + src * H;
  uint8_t* out = payload + j * static_cast<int64_t>(payload_bytes(f, H));
  uint8_t* sc = scales + j * static_cast<int64_t>(scale_bytes(f, H));
  if (f == ActFormat::bf16) {
    const int chunks = H / 8;  // 16-byte chunks; the tail (H % 8) element-wise
    for (int c = threadIdx.x; c < chunks; c += blockDim.x)
      reinterpret_cast<uint4*>(out)[c] = reinterpret_cast<const uint4*>(x)[c];
    for (int i = chunks * 8 + threadIdx.x; i < H; i += blockDim.x) reinterpret_cast<bf16_raw*>(out)[i] = x[i];
  } else if (f == ActFormat::fp8) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int b = warp; b < fp8_blocks(H); b += warps) {
      const bool on = b * 128 + lane * 4 < H;
      const uint2 raw = on ? *reinterpret_cast<const uint2*>(x + b * 128 + lane * 4) : make_uint2(0, 0);
      float v[4] = {num::bf16_to_f32(raw.x & 0xffff), num::bf16_to_f32(raw.x >> 16),
                    num::bf16_to_f32(raw.y & 0xffff), num::bf16_to_f32(raw.y >> 16)};
      float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
      amax = dev::warp_max(amax);
      const dev::Fp8Block bp = dev::fp8_block_params(amax, p.ue8m0);
      uint32_t q = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) q |= static_cast<uint32_t>(dev::fp8_code(v[i], bp)) << (8 * i);
      if (on) *reinterpret_cast<uint32_t*>(out + b * 128 + lane * 4) = q;
      if (lane == 0) reinterpret_cast<float*>(sc)[b] = bp.scale;
    }
  } else {
    for (int b = threadIdx.x; b < H / 16; b += blockDim.x) {
      float v[16];
      const uint4* src4 = reinterpret_cast<const uint4*>(x + b * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 r = src4[h];
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[h * 8 + 2 * i] = num::bf16_to_f32(w[i] & 0xffff);
          v[h * 8 + 2 * i + 1] = num::bf16_to_f32(w[i] >> 16);
        }
      }
      alignas(8) uint8_t packed[8];
      sc[b] = dev::nvfp4_block(v, p.nvfp4_global_scale, packed);
      *reinterpret_cast<uint2*>(out + b * 8) = *reinterpret_cast<const uint2*>(packed);
    }
  }
}

__global__ void dequantize_kernel(ActFormat f, QuantParams p, const uint8_t* __restrict__ payload,
                                  const uint8_t* __restrict__ scales, int H, float* __restrict__ out) {
  const int64_t j = blockIdx.x;
  const uint8_t* in = payload + j * static_cast<int64_t>(payload_bytes(f, H));
  const uint8_t* sc = scales ? scales + j * static_cast<int64_t>(scale_bytes(f, H)) : nullptr;
  float* o = out + j * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v;
    if (f == ActFormat::bf16) {
      v = num::bf16_to_f32(reinterpret_cast<const bf16_raw*>(in)[i]);
    } else if (f == ActFormat::fp8) {
      v = dev::fp8_dequant(in[i], reinterpret_cast<const float*>(sc)[i / 128]);
    } else {
      const uint8_t byte = in[i / 2];
      v = dev::nvfp4_dequant((i & 1) ? byte >> 4 : byte & 0xf, sc[i / 16], p.nvfp4_global_scale);
    }
    o[i] = v;
  }
}

}  // namespace

void check_quant_args(ActFormat f, const QuantParams& p, int H, const char* who) {
  const int m = hidden_multiple(f);
  if (H <= 0 || H % m != 0)
    throw UsageError(std::string(who) + ": hidden=" + std::to_string(H) + " is not a positive multiple of " +
                     std::to_string(m) + ", which format " + format_name(f) +
                     " requires; use a hidden size that is, or another format");
  if (f == ActFormat::bf16 && H % 8 != 0)
    throw UsageError(std::string(who) + ": hidden=" + std::to_string(H) +
                     " must be a multiple of 8 for the CUDA bf16 path (16-byte rows)");
  if (f == ActFormat::nvfp4 && !(p.nvfp4_global_scale > 0.f))
    throw UsageError(std::string(who) + ": nvfp4_global_scale=" + std::to_string(p.nvfp4_global_scale) +
                     " must be > 0; compute it with nvfp4_global_scale() from calibration data");
}

void quantize_rows_gather(ActFormat f, const QuantParams& p, const bf16_raw* in, const int32_t* row_map,
                          const int32_t* n_valid, int64_t rows, int H, uint8_t* payload, uint8_t* scales,
                          cudaStream_t stream) {
  check_quant_args(f, p, H, "cuda::quantize_rows");
  if (rows <= 0) return;
  quantize_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(f, p, in, row_map, n_valid, H, payload,
                                                                        scales);
  EPMOE_CUDA_CHECK_LAUNCH();
}

void quantize_rows(ActFormat f, const QuantParams& p, const bf16_raw* in, int64_t T, int H, uint8_t* payload,
                   uint8_t* scales, cudaStream_t stream) {
  quantize_rows_gather(f, p, in, nullptr, nullptr, T, H, payload, scales, stream);
}

void dequantize_rows(ActFormat f, const QuantParams& p, const uint8_t* payload, const uint8_t* scales, int64_t T,
                     int H, float* out, cudaStream_t stream) {
  check_quant_args(f, p, H, "cuda::dequantize_rows");
  if (T <= 0) return;
  dequantize_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(f, p, payload, scales, H, out);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
