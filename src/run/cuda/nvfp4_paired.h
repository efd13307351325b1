// The "paired" copy of nvfp4 weights that CUTLASS's mixed-input GEMM decodes in its main loop
// (engine_cutlass_nvfp4w.cuh): two bytes per pair of weights (k, k + 1), k even, of one row -- the
// pair one bf16x2 register of a wgmma A fragment holds -- carrying both e2m1 codes and their
// 16-element block's scale. So a scale never has to be fetched apart from the codes.
//
// Why not CUTLASS's own scale operand: its Hopper mixed-input mainloop takes one scale per weight
// row and K tile (64 or more of K), and nvfp4 has one per 16. Why not e4m3 codes with a coarser
// scale: e2m1 x e4m3 needs up to 6 significant bits, which bf16 holds exactly and e4m3 does not.
// The price is memory: 1 byte per weight against nvfp4's 0.5625 (tuning.nvfp4_mixed turns it off).
//
// The 16 bits of a pair are placed for the decode, which works on a 32-bit register of two pairs
// (bits 0-15 and 16-31) and must yield, per pair, a bf16x2 of each code's value times 2^-126 --
// magnitude bits at 6..8 and sign at 15 of its half, as nvfp4_layout::e2m1x8_to_bf16 forms them
// (the code 0.5 is the bf16 subnormal 2^-127) -- and the scale as a bf16 in both halves:
//   bits 6..8, 15   the even weight's magnitude and sign: already where its bf16 half wants them;
//   bits 0..2, 9    the odd weight's: shifted left by 22 they land at 22..24 and 31;
//   bits 3..5       the scale's 3 mantissa bits, bits 10..14 its 5-bit exponent (below).
// So each pair's codes are one shift, one byte permute and one mask, and its scale two masks, two
// shifts and one multiply-add that also copies it into both halves; one bf16x2 multiply gives
// code * scale * 2^-8 exactly (the epilogue's alpha takes the 2^8 back).
//
// The scale is written as bf16(scale * 2^kScaleExp) = exponent field (x + 236) and 3 mantissa
// bits, x in 0..17: e4m3's subnormals (m * 2^-9) normalized, so the decode needs no case for them.
// A zero scale keeps x = 0 and clears the pair's magnitudes (each product stays a zero of the
// code's sign, as code * 0 is); a negative scale flips the codes' signs; a NaN scale cannot be
// written (pair_scale says so, and the runner widens such weights instead).
//
// Plain integer code that the host runs too (tests/run/test_nvfp4_paired.cpp checks every code
// pair and scale); the device decode in engine_cutlass_nvfp4w.cuh adds only the bf16x2 multiply.
#pragma once

#include <cstdint>

#include "epmoe/numeric.h"  // EPMOE_HD
#include "run/cuda/nvfp4_layout.h"

namespace epmoe::cuda::nvfp4_paired {

// bf16 exponent field of 2^-9 * 2^kScaleExp, the smallest scale (e4m3's least subnormal).
constexpr uint32_t kExpBase = 127 - 9 + nvfp4_layout::kScaleExp;
static_assert(kExpBase == 236, "the pair layout's 5-bit exponent spans e4m3 from 2^-9 at this offset");

// An e4m3 block scale as the pair stores it: x (5 bits) and the mantissa (3 bits) of
// bf16(|scale| * 2^kScaleExp) = 2^(x + kExpBase - 127) * (1 + mant / 8); negative: the codes' signs
// flip; zero: the magnitudes clear; nan: not representable.
struct PairScale {
  uint32_t x = 0, mant = 0;
  bool negative = false, zero = false, nan = false;
};
EPMOE_HD constexpr PairScale pair_scale(uint32_t s) {
  PairScale p;
  p.negative = (s & 0x80u) != 0;
  const uint32_t e = (s >> 3) & 0xfu, m = s & 7u;
  if (e == 15 && m == 7) {
    p.nan = true;
  } else if (e > 0) {
    p.x = e + 2;  // (1 + m/8) 2^(e-7) * 2^118: exponent field e + 238
    p.mant = m;
  } else if (m == 0) {
    p.zero = true;
  } else {  // m * 2^-9 = (1 + f/8) 2^(j-9): j = floor(log2 m), f = the bits below m's top one, as eighths
    const uint32_t j = m >= 4 ? 2 : m >= 2 ? 1 : 0;
    p.x = j;
    p.mant = ((m << (3 - j)) & 7u);
  }
  return p;
}

// The 16 bits of the pair (even code c0, odd code c1; e2m1, sign in bit 3) under scale s (e4m3).
EPMOE_HD constexpr uint32_t pair_bits(uint32_t c0, uint32_t c1, uint32_t s) {
  const PairScale p = pair_scale(s);
  const uint32_t flip = p.negative ? 8u : 0u, keep = p.zero ? 8u : 15u;
  c0 = (c0 ^ flip) & keep;
  c1 = (c1 ^ flip) & keep;
  return ((c0 & 7u) << 6) | ((c0 >> 3) << 15) | (c1 & 7u) | ((c1 >> 3) << 9) | (p.mant << 3) | (p.x << 10);
}

// Decode, per 32-bit register w of two pairs (pair 0 in bits 0-15): the codes of pair i as a
// bf16x2 (even weight in the low half) of value * 2^-126,
EPMOE_HD uint32_t pair_codes(uint32_t w, int i) {
  return i == 0 ? nvfp4_layout::byte_perm(w, w << 22, 0x7610u) & 0x81c081c0u
                : nvfp4_layout::byte_perm(w, w << 6, 0x7632u) & 0x81c081c0u;
}
// and its scale as a bf16 of scale * 2^kScaleExp in both halves.
EPMOE_HD constexpr uint32_t pair_scale_bf16x2(uint32_t w, int i) {
  const uint32_t v = i == 0 ? w : w >> 16;
  const uint32_t bits = ((v >> 3) & 0xf80u) | ((v << 1) & 0x70u);  // x << 7 | mant << 4
  return bits * 0x10001u + (kExpBase << 7) * 0x10001u;
}

// W13's copy in GLU order (the one-GEMM SwiGLU on the paired copy, engine_cutlass_nvfp4w.cuh):
// row `s` of the 2I rows (gate rows 0..I-1, then the up rows) goes to row glu_row(s, I), so that
// each 16 rows are 8 gate rows and the up rows of the same 8 intermediate columns -- the rows r and
// r + 8 that one thread of a wgmma accumulator fragment holds. Needs I % 8 == 0.
EPMOE_HD constexpr int glu_row(int s, int I) {
  const int j = s < I ? s : s - I;  // the intermediate column
  return (j / 8) * 16 + (s < I ? 0 : 8) + j % 8;
}
// Its inverse: the intermediate column of GLU-order row r is (r / 16) * 8 + r % 8, an up row where
// r % 16 >= 8.
EPMOE_HD constexpr int glu_column(int r) { return (r / 16) * 8 + r % 8; }

}  // namespace epmoe::cuda::nvfp4_paired
