// The "paired" copy of nvfp4 weights that CUTLASS's mixed-input GEMM decodes in its main loop
// (engine_cutlass_nvfp4w.cuh): one byte per weight, the e2m1 code in the low nibble and one nibble
// of the weight's 16-element block scale in the high nibble -- the low nibble of the scale on even
// k, the high nibble on odd k. So the two weights (k, k + 1), k even, which one bf16x2 register of
// a wgmma A fragment holds, carry their whole e4m3 scale between them, and a scale never has to be
// fetched apart from the codes.
//
// Why not CUTLASS's own scale operand: its Hopper mixed-input mainloop takes one scale per weight
// row and K tile (64 or more of K), and nvfp4 has one per 16. Why not e4m3 codes with a coarser
// scale: e2m1 x e4m3 needs up to 6 significant bits, which bf16 holds exactly and e4m3 does not.
// The price is memory: 1 byte per weight against nvfp4's 0.5625 (tuning.nvfp4_mixed turns it off).
//
// Plain integer code that the host runs too (tests/run/test_nvfp4_paired.cpp checks every code,
// scale and parity); the device decode in engine_cutlass_nvfp4w.cuh adds the scale's conversion.
#pragma once

#include <cstdint>

#include "epmoe/numeric.h"  // EPMOE_HD

namespace epmoe::cuda::nvfp4_paired {

// The byte of the weight at column k: its e2m1 code (4 bits) and nibble k & 1 of its block scale.
EPMOE_HD constexpr uint8_t pair_byte(uint32_t code, uint32_t scale, int k) {
  return uint8_t((code & 0xfu) | (((k & 1) ? (scale >> 4) : scale) & 0xfu) << 4);
}

// Four bytes (columns k .. k + 3, k even) -> their two block scales: s01 in bits 0-7, s23 in 8-15.
EPMOE_HD constexpr uint32_t word_scales(uint32_t w) {
  const uint32_t y = (w >> 4) & 0x0f0f0f0fu;  // byte i: nibble i & 1 of its pair's scale
  const uint32_t s = y | (y >> 4);            // bytes 0 and 2: whole scales
  return (s & 0xffu) | ((s >> 8) & 0xff00u);
}

// Four bytes -> two bf16x2 (columns (k, k + 1) and (k + 2, k + 3)) of each code's value times
// 2^-126: the code's three magnitude bits go to bf16 bits 8..6 and its sign to bit 15, the mapping
// of nvfp4_layout::e2m1x8_to_bf16 (the code 0.5 is the bf16 subnormal 2^-127), so one bf16x2
// multiply by the scale times 2^kScaleExp gives code * scale * 2^-8 exactly.
EPMOE_HD constexpr uint32_t spread_pair(uint32_t w, int pair) {
  // bytes 2 pair and 2 pair + 1 to bits 0-7 and 16-23
  const uint32_t lo = (w >> (16 * pair)) & 0xffu, hi = (w >> (16 * pair + 8)) & 0xffu;
  return lo | (hi << 16);
}
EPMOE_HD constexpr uint32_t pair_codes_bf16(uint32_t t) {
  return ((t << 6) & 0x01c001c0u) | ((t << 12) & 0x80008000u);
}

}  // namespace epmoe::cuda::nvfp4_paired
