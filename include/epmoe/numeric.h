// Scalar codecs shared by host and device code: bf16, OCP e4m3 ("fn") and e2m1, all with
// round-to-nearest-even and saturation to the largest finite value. Integer bit manipulation keeps
// them exact and identical on CPU and GPU, which is what makes CPU/GPU quantization bitwise equal.
//
// NaN policy (documented in docs/FORMATS.md): bf16 keeps NaN (quiet); e4m3 maps NaN to 0x7f (NaN);
// e2m1 has no NaN and maps it to +0 (code 0). +-Inf saturate to +-448 (e4m3) and +-6 (e2m1).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EPMOE_HD __host__ __device__ __forceinline__
#else
#define EPMOE_HD inline
#endif

namespace epmoe::num {

EPMOE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

EPMOE_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 ----------------------------------------------------------------------------------
EPMOE_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
EPMOE_HD float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// ---- e4m3 (OCP fn: bias 7, no inf, max 448, NaN = S.1111.111) -------------------------------
constexpr float kE4m3Max = 448.0f;

EPMOE_HD uint8_t f32_to_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;            // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;    // |f| >= 448 (and Inf): saturate
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp < -6) {
    // e4m3 subnormal range: value = m * 2^-9, m in 0..8 (8 rolls into the smallest normal).
    // |f| * 512 is exact (power-of-two scaling of a number < 2^-6) and round-half-even follows.
    const float scaled = bits_f32(a) * 512.0f;
    const uint32_t s = f32_bits(scaled);
    uint32_t m;
    if (s < 0x3f000000u) {            // < 0.5 -> 0, == 0.5 -> 0 (even)
      m = 0;
    } else {
      // integer part and remainder of `scaled` in [0.5, 8)
      const int e = static_cast<int>(s >> 23) - 127;        // -1..2
      const uint32_t mant = (s & 0x7fffffu) | 0x800000u;    // 1.xxx * 2^23
      const int shift = 23 - e;                             // bits below the integer point
      const uint32_t ip = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      m = ip + ((rem > half || (rem == half && (ip & 1u))) ? 1u : 0u);
    }
    return sign | static_cast<uint8_t>(m);
  }
  // normal: keep 3 mantissa bits with RNE; a carry into the exponent is handled by the addition.
  const uint32_t mant = a & 0x7fffffu;
  uint32_t code = (static_cast<uint32_t>(exp + 7) << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) code += 1;
  if (code > 0x7eu) code = 0x7e;  // rounding above 448 saturates
  return sign | static_cast<uint8_t>(code);
}

EPMOE_HD float e4m3_to_f32(uint8_t q) {
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t e = (q >> 3) & 0xfu;
  const uint32_t m = q & 0x7u;
  if (e == 0xf && m == 0x7) return bits_f32(0x7fc00000u | sign);
  float v;
  if (e == 0) {
    v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9
  } else {
    v = bits_f32(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * 1.m
  }
  return bits_f32(f32_bits(v) | sign);
}

// ---- e2m1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign) --------------------------------
constexpr float kE2m1Max = 6.0f;

EPMOE_HD uint8_t f32_to_e2m1(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;  // NaN -> +0 (e2m1 has no NaN)
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const float x = bits_f32(a);
  // Decision points are the midpoints between neighbours; at a midpoint the even code wins.
  uint8_t c;
  if (x <= 0.25f) c = 0;
  else if (x < 0.75f) c = 1;
  else if (x <= 1.25f) c = 2;
  else if (x < 1.75f) c = 3;
  else if (x <= 2.5f) c = 4;
  else if (x < 3.5f) c = 5;
  else if (x <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

EPMOE_HD float e2m1_to_f32(uint8_t q) {
  const uint8_t c = q & 0x7u;
  float v = c < 4 ? 0.5f * static_cast<float>(c) : (c == 4 ? 2.0f : (c == 5 ? 3.0f : (c == 6 ? 4.0f : 6.0f)));
  return (q & 0x8u) ? -v : v;
}

// ---- exp / sigmoid with one fixed operation sequence ------------------------------------------
// Library expf differs between glibc and CUDA in the last bit; the router needs CPU and GPU to
// agree bitwise, so both use this: n = rint(x*log2(e)), r = x - n*ln2 (two fma steps, Cody-Waite),
// Taylor polynomial of degree 7 in Horner form with explicit fma (|r| <= ln2/2 keeps the error
// under 2 ulp), then scaling by 2^n through the exponent bits.
EPMOE_HD float exp_f32(float x) {
  if (x != x) return x;
  if (x > 88.72283935546875f) return bits_f32(0x7f800000u);
  if (x < -103.97208404541016f) return 0.0f;
  const float n = rintf(x * 1.44269502162933349609375f);
  float r = fmaf(-n, 0.693145751953125f, x);          // ln2 high part (exact in 16 bits)
  r = fmaf(-n, 1.428606765330187045e-06f, r);          // ln2 low part
  float p = 1.98412698412698412e-04f;                  // 1/5040
  p = fmaf(p, r, 1.38888888888888889e-03f);            // 1/720
  p = fmaf(p, r, 8.33333333333333333e-03f);            // 1/120
  p = fmaf(p, r, 4.16666666666666667e-02f);            // 1/24
  p = fmaf(p, r, 1.66666666666666667e-01f);            // 1/6
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  int ni = static_cast<int>(n);
  // 2^n may be subnormal: split the scaling so each factor is a normal power of two.
  if (ni < -126) {
    p *= bits_f32(static_cast<uint32_t>(ni + 126 + 127) << 23);
    ni = -126;
  }
  if (ni > 127) {
    p *= 2.0f;
    ni -= 1;
  }
  return p * bits_f32(static_cast<uint32_t>(ni + 127) << 23);
}

EPMOE_HD float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

}  // namespace epmoe::num
