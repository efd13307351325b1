// The nvfp4 decode engine's bit tricks and K order (engine_wgmma_nvfp4.cu), as plain integer code
// that the host can run too: tests/run/test_nvfp4_layout.cpp checks them against the e2m1 values
// and against a model of wgmma's A-fragment layout without a GPU.
#pragma once

#include <cstdint>

#include "epmoe/numeric.h"  // EPMOE_HD

namespace epmoe::cuda::nvfp4_layout {

// Eight e2m1 codes (nibbles 0-7 of x) -> four bf16x2, d[i] = (nibble i, nibble i + 4), each
// 2^-126 times its value: the code's three magnitude bits go to bf16 bits 8..6 (the two lowest
// exponent bits and the top mantissa bit) and its sign to bit 15. With a zero exponent field the
// bf16 is subnormal, m * 2^-127, which is the e2m1 subnormal (m / 2) times 2^-126 too, so the
// mapping is linear for every code and the block scale's multiply takes the 2^126 back.
EPMOE_HD constexpr void e2m1x8_to_bf16(uint32_t x, uint32_t (&d)[4]) {
  const uint32_t y = x & 0x77777777u;
  d[0] = ((y << 6) & 0x01C001C0u) | ((x << 12) & 0x80008000u);
  d[1] = ((y << 2) & 0x01C001C0u) | ((x << 8) & 0x80008000u);
  d[2] = ((y >> 2) & 0x01C001C0u) | ((x << 4) & 0x80008000u);
  d[3] = ((y >> 6) & 0x01C001C0u) | (x & 0x80008000u);
}

// The prepared layout (engine_wgmma_nvfp4_prepared.cu) stores each 32-bit word of eight codes with its bits
// permuted: bit s of the prepared word is bit prep_src(s) of the natural word. The permutation is
// one found by exhaustive search so that the four bf16x2 of e2m1x8_to_bf16 come out of four
// rotations and six masks (10 integer operations instead of ~20 as compiled for the natural word):
// no tiling of the 32 bits by four shifted copies of the bf16x2 bit pattern {6-8, 15, 22-24, 31}
// exists, so two of the outputs take two masked pieces each.
EPMOE_HD constexpr int prep_src(int s) {
  constexpr int src[32] = {4,  5,  6,  3,  8,  31, 12, 9,  10, 7,  16, 17, 18, 13, 14, 11,
                           20, 21, 22, 19, 24, 15, 28, 25, 26, 23, 0,  1,  2,  29, 30, 27};
  return src[s];
}
EPMOE_HD constexpr uint32_t rotl32(uint32_t x, int r) { return r == 0 ? x : (x << r) | (x >> (32 - r)); }
EPMOE_HD constexpr uint32_t prepare_word(uint32_t natural) {
  uint32_t w = 0;
  for (int s = 0; s < 32; ++s) w |= ((natural >> prep_src(s)) & 1u) << s;
  return w;
}
// e2m1x8_to_bf16 of the natural word x, given w = prepare_word(x): the same four registers.
EPMOE_HD constexpr void e2m1x8_to_bf16_prepared(uint32_t w, uint32_t (&d)[4]) {
  d[0] = rotl32(w, 12) & 0x81C081C0u;
  d[1] = rotl32(w, 6) & 0x81C081C0u;
  d[2] = (rotl32(w, 2) & 0x00400040u) | (w & 0x81808180u);
  d[3] = (rotl32(w, 26) & 0x81808180u) | (w & 0x00400040u);
}

// The decoded weights carry 2^-126 and the block scales 2^118 (2^126 would overflow bf16 for
// scales >= 2), so the products carry 2^-8, which the epilogue multiplies back.
constexpr int kScaleExp = 118;
constexpr float kAccScale = 256.0f;  // 2^(126 - kScaleExp)
static_assert(kAccScale == float(1u << (126 - kScaleExp)), "kAccScale must undo the scales' 2^(kScaleExp - 126)");

// K order inside a 64-K block. Thread t of a quad holds natural K 16t .. 16t+15 (one scale block)
// over the block's four k16 instructions. The decode pairs nibbles (i, i + 4) of each 8-code word
// into one register, so position p of the permuted block holds natural column kperm_src(p):
// within 16t + (0..15), the pair at instruction j, slots (2t, 2t+1) is natural (16t + 8(j/2) +
// 2(j%2), +4) and slots (2t+8, 2t+9) the next code of each.
EPMOE_HD constexpr int kperm_pos(int k) {
  const int k2 = (k & ~7) | ((k & 3) << 1) | ((k >> 2) & 1);  // natural -> decode order within 8
  return 2 * (4 * ((k2 >> 1) & 7) + (k2 >> 4)) + (k2 & 1);
}
EPMOE_HD constexpr int kperm_src(int p) {
  const int s = p & 15;
  const int k2 = 16 * ((s >> 1) & 3) + 4 * (p >> 4) + 2 * (s >> 3) + (s & 1);
  return (k2 & ~7) | ((k2 & 1) << 2) | ((k2 >> 1) & 3);
}
constexpr bool kperm_is_bijection() {
  bool seen[64] = {};
  for (int k = 0; k < 64; ++k) {
    const int p = kperm_pos(k);
    if (p < 0 || p >= 64 || seen[p] || kperm_src(p) != k) return false;
    seen[p] = true;
  }
  return true;
}
static_assert(kperm_is_bijection(), "kperm_src must invert kperm_pos on 0..63");

// One 64-K block of bf16 values, as 32 words of pairs (2j, 2j + 1), into the K order: output word q
// holds natural columns kperm_src(2q) (low half) and kperm_src(2q + 1) (high half). Every index is a
// compile-time constant after unrolling, so on the device each word is one byte permute (the
// permute kernels and the in-place pass share this).
EPMOE_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(a, b, sel);
#else
  const uint64_t x = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
#endif
}
EPMOE_HD void kperm_block(const uint32_t (&w)[32], uint32_t (&o)[32]) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int q = 0; q < 32; ++q) {
    const int a = kperm_src(2 * q), b = kperm_src(2 * q + 1);
    const uint32_t sel = ((a & 1) ? 0x32u : 0x10u) | (((b & 1) ? 0x76u : 0x54u) << 8);
    o[q] = byte_perm(w[a >> 1], w[b >> 1], sel);
  }
}

}  // namespace epmoe::cuda::nvfp4_layout
