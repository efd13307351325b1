// The nvfp4 decode engine's integer tricks (src/run/cuda/nvfp4_layout.h), checked on the host, so
// that a change to the decode or the K order fails here before it needs a GPU: every code decodes
// to its value times 2^-126, every (code, block scale) product the engine forms is exact in bf16,
// and the token K order matches where wgmma's A fragment puts each decoded weight.
#include "run/cuda/nvfp4_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "epmoe/numeric.h"

namespace epmoe::test {
namespace {

namespace nl = cuda::nvfp4_layout;

// Exactly representable in bf16: a float whose low 16 bits are zero.
bool exact_bf16(double v) {
  const float f = static_cast<float>(v);
  return static_cast<double>(f) == v && (num::f32_bits(f) & 0xffffu) == 0;
}

TEST(Nvfp4Layout, DecodeIsValueTimesTwoToMinus126) {
  std::mt19937 rng(7);
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t c = 0; c < 16; ++c)
      for (int rep = 0; rep < 4; ++rep) {
        // Code c at nibble `pos`, random codes elsewhere (they must not leak into its half).
        const uint32_t x = (rng() & ~(0xfu << (4 * pos))) | (c << (4 * pos));
        uint32_t d[4];
        nl::e2m1x8_to_bf16(x, d);
        const uint32_t half = pos < 4 ? d[pos] & 0xffffu : d[pos - 4] >> 16;
        const float got = num::bf16_to_f32(static_cast<uint16_t>(half));
        const float want = std::ldexp(num::e2m1_to_f32(static_cast<uint8_t>(c)), -126);
        EXPECT_EQ(got, want) << "code " << c << " at nibble " << pos << ", word 0x" << std::hex << x;
        EXPECT_EQ(std::signbit(got), (c & 8u) != 0) << "sign of code " << c << " at nibble " << pos;
      }
}

TEST(Nvfp4Layout, ScaledProductsAreExactInBf16) {
  // The engine multiplies decoded codes (value * 2^-126) by bf16(scale * 2^118); the bf16 multiply
  // is exact, and the epilogue's 2^8 restores the product bit for bit, only if every such product
  // is a normal bf16 (or zero) and the scaled scale itself is exact in bf16.
  int checked = 0;
  for (int s = 0; s < 0x7f; ++s) {  // non-negative finite e4m3 block scales (0x7f is NaN)
    const double scale = num::e4m3_to_f32(static_cast<uint8_t>(s));
    const double scaled = std::ldexp(scale, nl::kScaleExp);
    ASSERT_TRUE(exact_bf16(scaled) && std::isfinite(static_cast<float>(scaled))) << "scale code " << s;
    for (int c = 0; c < 16; ++c) {
      const double decoded = std::ldexp(static_cast<double>(num::e2m1_to_f32(static_cast<uint8_t>(c))), -126);
      const double prod = decoded * scaled;  // exact in double
      const double want = static_cast<double>(num::e2m1_to_f32(static_cast<uint8_t>(c))) * scale / nl::kAccScale;
      EXPECT_EQ(prod, want) << "scale code " << s << " code " << c;
      EXPECT_TRUE(exact_bf16(prod)) << "product not exact in bf16: scale code " << s << " code " << c;
      EXPECT_TRUE(prod == 0.0 || std::fabs(prod) >= std::ldexp(1.0, -126)) << "subnormal product: scale " << s;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 127 * 16);
}

TEST(Nvfp4Layout, TokenOrderMatchesTheAFragments) {
  // Model of the engine (engine_wgmma_nvfp4.cu): in a 64-K block thread t of a quad loads the 16
  // codes of natural K 16t .. 16t+15 as two words; register i (0-7) of its A set is decode word
  // i / 4, pair i % 4 = codes (i % 4, i % 4 + 4) of that word; instruction j takes registers 2j
  // (K slots 2t, 2t+1) and 2j + 1 (slots 2t+8, 2t+9) of the m64nNk16 A fragment, i.e. position
  // 16j + slot of the permuted block. The tokens must hold the same natural column there.
  for (int p = 0; p < 64; ++p) {
    const int j = p >> 4, slot = p & 15;
    const int t = (slot & 7) >> 1, e = slot & 1;
    const int reg = 2 * j + (slot >> 3);
    const int natural = 16 * t + 8 * (reg >> 2) + (reg & 3) + 4 * e;
    EXPECT_EQ(nl::kperm_src(p), natural) << "position " << p;
    EXPECT_EQ(nl::kperm_pos(natural), p) << "natural column " << natural;
  }
}

TEST(Nvfp4Layout, KpermBlockPutsEveryColumnWhereKpermSrcSays) {
  // kperm_block (the permute kernels and the in-place pass): 64 distinct 16-bit values, as pairs in
  // 32 words, must come out with position p holding natural column kperm_src(p), for any values.
  uint32_t w[32], o[32];
  for (int round = 0; round < 3; ++round) {
    auto value = [&](int k) { return uint16_t(0x1000 * round + 0x0101 * k + 7); };
    for (int j = 0; j < 32; ++j) w[j] = uint32_t(value(2 * j)) | uint32_t(value(2 * j + 1)) << 16;
    nl::kperm_block(w, o);
    for (int p = 0; p < 64; ++p)
      EXPECT_EQ(uint16_t(o[p / 2] >> (16 * (p & 1))), value(nl::kperm_src(p))) << "position " << p;
  }
}

TEST(Nvfp4Layout, PreparedDecodeEqualsNaturalDecode) {
  // The prepared engine decodes words in the prepared bit order with 10 operations; for every word
  // it must give the natural decode's four registers bit for bit (then every product, accumulation
  // and output is the natural engine's). Each code value at each nibble position, then random words.
  bool seen[32] = {};
  for (int s = 0; s < 32; ++s) {
    const int src = nl::prep_src(s);
    ASSERT_GE(src, 0);
    ASSERT_LT(src, 32);
    EXPECT_FALSE(seen[src]) << "prep_src is not a permutation at " << s;
    seen[src] = true;
  }
  auto check = [](uint32_t x) {
    uint32_t a[4], b[4];
    nl::e2m1x8_to_bf16(x, a);
    nl::e2m1x8_to_bf16_prepared(nl::prepare_word(x), b);
    for (int i = 0; i < 4; ++i) {
      if (a[i] != b[i]) {
        ADD_FAILURE() << std::hex << "word 0x" << x << " register " << i << ": natural 0x" << a[i] << ", prepared 0x" << b[i];
        return false;
      }
    }
    return true;
  };
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t c = 0; c < 16; ++c)
      if (!check(c << (4 * pos))) return;
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i)
    if (!check(uint32_t(rng()))) return;
}

}  // namespace
}  // namespace epmoe::test
