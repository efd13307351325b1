// The paired nvfp4 copy (src/run/cuda/nvfp4_paired.h) on the host: for every pair of codes under
// every block scale, the decode (the integer steps the device runs, and the bf16 x bf16 product
// it forms, done here in float, where it is exact) gives e2m1 * e4m3 * 2^-8 exactly, with the
// sign a zero product has; pairs do not leak into each other; NaN scales are flagged.
#include "run/cuda/nvfp4_paired.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "epmoe/numeric.h"

namespace epmoe::test {
namespace {

namespace np = cuda::nvfp4_paired;

float half_f32(uint32_t x, int hi) { return num::bf16_to_f32(static_cast<uint16_t>(hi ? x >> 16 : x & 0xffffu)); }

TEST(Nvfp4Paired, EveryCodePairAndScaleDecodesExactly) {
  std::mt19937 rng(3);
  int checked = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const bool nan = np::pair_scale(s).nan;
    EXPECT_EQ(nan, std::isnan(num::e4m3_to_f32(static_cast<uint8_t>(s)))) << "scale " << s;
    if (nan) continue;
    const float scale = num::e4m3_to_f32(static_cast<uint8_t>(s));
    for (uint32_t c0 = 0; c0 < 16; ++c0)
      for (uint32_t c1 = 0; c1 < 16; ++c1)
        for (int slot = 0; slot < 2; ++slot) {
          // The pair in `slot` of the register, a random valid pair in the other.
          const uint32_t other = np::pair_bits(rng() & 0xfu, rng() & 0xfu, rng() & 0x7eu);
          const uint32_t me = np::pair_bits(c0, c1, s);
          ASSERT_LT(me, 0x10000u);
          const uint32_t w = slot == 0 ? me | (other << 16) : other | (me << 16);
          const uint32_t codes = np::pair_codes(w, slot), sc = np::pair_scale_bf16x2(w, slot);
          ASSERT_EQ(sc & 0xffffu, sc >> 16) << "the scale is not in both halves";
          const float sf = half_f32(sc, 0);
          ASSERT_EQ(num::f32_bits(sf) & 0xffffu, 0u);
          const uint32_t c[2] = {c0, c1};
          for (int h = 0; h < 2; ++h) {
            const float code = num::e2m1_to_f32(static_cast<uint8_t>(c[h]));
            const float got = half_f32(codes, h) * sf;  // exact: at most 6 significant bits
            const float want = code * scale / 256.0f;
            EXPECT_EQ(num::f32_bits(got) & 0xffffu, 0u) << "not a bf16";
            EXPECT_EQ(got, want) << "code " << c[h] << " scale " << s << " half " << h << " slot " << slot;
            EXPECT_EQ(std::signbit(got), std::signbit(want))
                << "sign of a zero: code " << c[h] << " scale " << s << " half " << h;
            ++checked;
          }
        }
  }
  EXPECT_EQ(checked, 254 * 16 * 16 * 2 * 2);
}

// The decoded codes carry value * 2^-126 (the 2^kScaleExp in the scale brings the product to
// 2^-8), the scale value * 2^kScaleExp, e4m3's subnormals included.
TEST(Nvfp4Paired, CodesAndScalesCarryTheirOffsets) {
  for (uint32_t c = 0; c < 16; ++c) {
    const uint32_t codes = np::pair_codes(np::pair_bits(c, c, 0x38), 0);  // scale 1.0
    const float want = std::ldexp(num::e2m1_to_f32(static_cast<uint8_t>(c)), -126);
    EXPECT_EQ(half_f32(codes, 0), want) << c;
    EXPECT_EQ(half_f32(codes, 1), want) << c;
  }
  for (uint32_t s = 0; s < 0x7f; ++s) {
    if (s == 0) continue;  // zero: the codes carry it
    const uint32_t sc = np::pair_scale_bf16x2(np::pair_bits(2, 2, s), 0);
    EXPECT_EQ(half_f32(sc, 0), std::ldexp(num::e4m3_to_f32(static_cast<uint8_t>(s)), cuda::nvfp4_layout::kScaleExp))
        << "scale " << s;
  }
}

// W13's GLU order: a permutation of the 2I rows in which each 16 rows are 8 gate rows and, 8 rows
// below each, the up row of the same intermediate column; glu_column inverts it.
TEST(Nvfp4Paired, GluOrderPairsGateAndUpRows) {
  for (const int I : {8, 16, 576, 768, 2880}) {
    std::vector<int> seen(2 * size_t(I), 0);
    for (int s = 0; s < 2 * I; ++s) {
      const int r = np::glu_row(s, I);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, 2 * I);
      ++seen[size_t(r)];
      const int j = s < I ? s : s - I;
      EXPECT_EQ(np::glu_column(r), j) << "I " << I << " row " << s;
      EXPECT_EQ(r % 16 >= 8, s >= I) << "I " << I << " row " << s;
      if (s < I) EXPECT_EQ(np::glu_row(s + I, I), r + 8) << "I " << I << ": the up row 8 below its gate";
    }
    for (int r = 0; r < 2 * I; ++r) EXPECT_EQ(seen[size_t(r)], 1) << "I " << I << " row " << r;
  }
}

}  // namespace
}  // namespace epmoe::test
