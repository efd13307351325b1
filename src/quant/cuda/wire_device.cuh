// Device wire encoders of the streaming all-to-all (dispatcher "nvlink", src/dispatch/a2a/units.cuh):
// a warp lane encodes 16 consecutive bf16 elements, held as two 16-byte words, straight into their
// wire form. Rounding is exactly the CPU quantizers' (src/quant/cpu.cpp): fp32 amax that skips
// NaN, the block parameters of quant_device.cuh, e4m3 through the hardware's satfinite RNE
// conversion (equal to num::f32_to_e4m3 on every non-NaN input, and NaN -> 0x7f in both) and an
// e2m1 codec that is a branch-free rewrite of num::f32_to_e2m1 (same thresholds, NaN -> +0).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::cuda::dev {

// bf16 pair word -> two floats (exact).
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 16 bf16 elements in two 16-byte words -> 16 floats (exact).
__device__ __forceinline__ void unpack16(const uint4& a, const uint4& b, float* f) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[2 * i] = bf_lo(w[i]);
    f[2 * i + 1] = bf_hi(w[i]);
  }
}

// num::f32_to_e2m1 without branches: the code is the number of rounding thresholds |f| passes
// (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 with ties to the even code), compared on the bits, which
// orders non-negative floats like the values do. NaN -> +0; the sign of everything else is kept.
__device__ __forceinline__ uint32_t e2m1_code(float f) {
  const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;
  uint32_t c = (a > 0x3e800000u) + (a >= 0x3f400000u) + (a > 0x3fa00000u) + (a >= 0x3fe00000u) +
               (a > 0x40200000u) + (a >= 0x40600000u) + (a > 0x40a00000u);
  c |= (u >> 28) & 8u;
  return a > 0x7f800000u ? 0u : c;
}

// fp8: 16 elements of a 128-block whose other 112 elements are held by the other 7 lanes of this
// lane's group of 8 (lanes 8g .. 8g+7). Every lane of the warp must call it: the block amax is
// reduced by shuffles within the group. Writes 16 e4m3 codes as one 16-byte word and returns
// the block's stored scale.
__device__ __forceinline__ float fp8_encode16(const uint4& a, const uint4& b, bool ue8m0, uint4& out) {
  float f[16];
  unpack16(a, b, f);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(f[i]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  const Fp8Block bp = fp8_block_params(m, ue8m0);
  uint32_t pr[8];
  if (bp.divide) {  // ue8m0: x / scale, as the CPU quantizer does
#pragma unroll
    for (int i = 0; i < 8; ++i) pr[i] = e4m3x2_hw(__fdiv_rn(f[2 * i], bp.mul), __fdiv_rn(f[2 * i + 1], bp.mul));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) pr[i] = e4m3x2_hw(__fmul_rn(f[2 * i], bp.mul), __fmul_rn(f[2 * i + 1], bp.mul));
  }
  out = make_uint4(pr[0] | pr[1] << 16, pr[2] | pr[3] << 16, pr[4] | pr[5] << 16, pr[6] | pr[7] << 16);
  return bp.scale;
}

// nvfp4: one 16-element block (global scale gs); returns its e4m3 scale code and writes the 8
// packed bytes (element 2i in the low nibble of byte i) as two little-endian words.
__device__ __forceinline__ uint32_t nvfp4_encode16(const uint4& a, const uint4& b, float gs, uint32_t& w0,
                                                   uint32_t& w1) {
  float f[16];
  unpack16(a, b, f);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(f[i]));
  const uint8_t s = num::f32_to_e4m3(__fdiv_rn(__fmul_rn(m, gs), 6.0f));
  const float sf = num::e4m3_to_f32(s);
  const bool zero = sf == 0.0f || sf != sf;  // no inverse: the block is all zeros
  const float inv = zero ? 0.f : __fdiv_rn(gs, sf);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i / 8] |= e2m1_code(__fmul_rn(f[i], inv)) << (4 * (i % 8));
  w0 = zero ? 0u : w[0];
  w1 = zero ? 0u : w[1];
  return s;
}

}  // namespace epmoe::cuda::dev
