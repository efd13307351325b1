// Device-side activation quantizers (DESIGN.md §2), one fixed operation order shared with the
// CPU reference (src/quant/): every product and quotient is written with an explicit _rn
// intrinsic so that nvcc cannot contract it into an fma, and the codecs are numeric.h's.
// Used by the standalone quantize kernels, the local dispatcher and the fp8 combine payload.
#pragma once
#include <cstdint>

#include "epmoe/numeric.h"
#include "epmoe/tensor.h"  // bf16_raw

namespace epmoe::cuda::dev {

// Two floats to bf16x2 (lo in the low half), bitwise equal to num::f32_to_bf16 on each: the
// hardware conversion is round-to-nearest-even like it for every non-NaN value (subnormals kept,
// overflow to Inf); a NaN keeps its payload with the quiet bit set in num::f32_to_bf16 where the
// hardware returns the canonical NaN, so NaNs take the software path. One F2FP instead of ~12
// integer instructions per pair on the bitwise sums of the combine.
// bf16x2_rn: the hardware conversion alone (a NaN becomes the canonical NaN, as in CUTLASS's
// epilogues), where the GEMM epilogues write their outputs.
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t bf16x2_exact(float lo, float hi) {
  if (__builtin_expect((lo != lo) | (hi != hi), 0))
    return uint32_t(num::f32_to_bf16(lo)) | (uint32_t(num::f32_to_bf16(hi)) << 16);
  return bf16x2_rn(lo, hi);
}

// Two floats -> two e4m3 codes (lo in the low byte) by the hardware's RNE satfinite conversion,
// which equals num::f32_to_e4m3 on every input (NaN -> 0x7f in both; the dispatch kernels and
// their bitwise tests against the CPU quantizer rely on the same equality).
__device__ __forceinline__ uint32_t e4m3x2_hw(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Smallest power of two >= r (r > 0, finite): the ue8m0 scale "2^ceil(log2(r))" computed on the
// bits, so no log2 rounding can pull it one binade low.
__device__ __forceinline__ float pow2_ceil(float r) {
  const uint32_t u = num::f32_bits(r);
  if (u >= 0x7f800000u) return r;                     // Inf (from an Inf amax) propagates
  if ((u & 0x7fffffu) == 0) return r;                 // already a power of two
  if (u < 0x00800000u) return num::bits_f32(0x00800000u);  // subnormal: 2^-126 bounds it
  return num::bits_f32(((u >> 23) + 1u) << 23);
}

// fp8 block scale from the block's amax; returns the stored scale, sets the multiplier (non-ue8m0:
// q = x * mul) or, for ue8m0, the divisor (q = x / div).
struct Fp8Block {
  float scale;
  float mul;
  bool divide;
};
__device__ __forceinline__ Fp8Block fp8_block_params(float amax, bool ue8m0) {
  const float a = fmaxf(amax, 1e-4f);
  Fp8Block b;
  if (ue8m0) {
    b.scale = pow2_ceil(__fdiv_rn(a, 448.0f));
    b.mul = b.scale;
    b.divide = true;
  } else {
    b.scale = __fdiv_rn(a, 448.0f);
    b.mul = __fdiv_rn(448.0f, a);
    b.divide = false;
  }
  return b;
}
__device__ __forceinline__ uint8_t fp8_code(float x, const Fp8Block& b) {
  return num::f32_to_e4m3(b.divide ? __fdiv_rn(x, b.mul) : __fmul_rn(x, b.mul));
}

// NaN-propagating-free amax: fmaxf ignores NaN, matching std::fmax on the CPU side.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// fp8 block b of a bf16 row of n elements, one warp per block: this lane's 4 values into v and the
// block's parameters from the warp-wide amax. The last block is partial when n % 128 != 0 (n % 4 ==
// 0): a lane past n gets zeros, which leave the amax as it is, and `on` false (it stores nothing).
__device__ __forceinline__ Fp8Block fp8_warp_block(const bf16_raw* row, int n, int b, int lane, bool ue8m0,
                                                   float (&v)[4], bool& on) {
  on = b * 128 + lane * 4 < n;
  float amax = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    v[q] = on ? num::bf16_to_f32(row[b * 128 + lane * 4 + q]) : 0.f;
    amax = fmaxf(amax, fabsf(v[q]));
  }
  return fp8_block_params(warp_max(amax), ue8m0);
}

// nvfp4 block of 16 (x in fp32): packed 8 bytes (element 2i low nibble) and the e4m3 scale code.
__device__ __forceinline__ uint8_t nvfp4_block(const float* x, float gs, uint8_t* packed) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const uint8_t s = num::f32_to_e4m3(__fdiv_rn(__fmul_rn(amax, gs), 6.0f));
  const float sf = num::e4m3_to_f32(s);
  const bool zero = sf == 0.0f || sf != sf;  // no inverse: the block is all zeros
  const float inv = zero ? 0.f : __fdiv_rn(gs, sf);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint8_t lo = zero ? 0 : num::f32_to_e2m1(__fmul_rn(x[2 * i], inv));
    const uint8_t hi = zero ? 0 : num::f32_to_e2m1(__fmul_rn(x[2 * i + 1], inv));
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return s;
}

__device__ __forceinline__ float fp8_dequant(uint8_t q, float scale) {
  return __fmul_rn(num::e4m3_to_f32(q), scale);
}
__device__ __forceinline__ float nvfp4_dequant(uint8_t code, uint8_t s, float gs) {
  return __fdiv_rn(__fmul_rn(num::e2m1_to_f32(code), num::e4m3_to_f32(s)), gs);
}

}  // namespace epmoe::cuda::dev
