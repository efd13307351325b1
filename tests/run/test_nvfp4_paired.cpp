// The paired nvfp4 copy (src/run/cuda/nvfp4_paired.h) on the host: every (code, block scale,
// column parity) byte decodes back to its code and scale, the codes land in bf16 as their values
// times 2^-126 without leaking into each other, and code * scale formed as the device forms it
// (bf16 times bf16, the scale carrying 2^kScaleExp) is the exact product times 2^-8.
#include "run/cuda/nvfp4_paired.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "epmoe/numeric.h"
#include "run/cuda/nvfp4_layout.h"

namespace epmoe::test {
namespace {

namespace np = cuda::nvfp4_paired;

// Columns k .. k + 3 (k even) of one row: codes c[i], scale s01 for the first pair, s23 for the second.
uint32_t word(const uint32_t (&c)[4], uint32_t s01, uint32_t s23) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) w |= uint32_t(np::pair_byte(c[i], i < 2 ? s01 : s23, i)) << (8 * i);
  return w;
}

TEST(Nvfp4Paired, EveryCodeAndScaleRoundTrips) {
  std::mt19937 rng(3);
  for (uint32_t s = 0; s < 256; ++s)
    for (uint32_t code = 0; code < 16; ++code)
      for (int pos = 0; pos < 4; ++pos) {
        uint32_t c[4];
        for (uint32_t& v : c) v = rng() & 0xfu;
        c[pos] = code;
        const uint32_t other = rng() & 0xffu;
        const uint32_t w = pos < 2 ? word(c, s, other) : word(c, other, s);
        const uint32_t sc = np::word_scales(w);
        EXPECT_EQ(pos < 2 ? sc & 0xffu : sc >> 8, s) << "scale " << s << " pos " << pos;
        const uint32_t d = np::pair_codes_bf16(np::spread_pair(w, pos / 2));
        const uint32_t half = pos % 2 ? d >> 16 : d & 0xffffu;
        const float got = num::bf16_to_f32(static_cast<uint16_t>(half));
        const float want = std::ldexp(num::e2m1_to_f32(static_cast<uint8_t>(code)), -126);
        EXPECT_EQ(got, want) << "code " << code << " pos " << pos;
        EXPECT_EQ(std::signbit(got), (code & 8u) != 0) << "code " << code << " pos " << pos;
      }
}

// The device multiplies the two bf16 values in bf16: the product must be exact there.
TEST(Nvfp4Paired, ProductWithScaleIsExactTimesTwoToMinus8) {
  for (uint32_t s = 0; s < 256; ++s) {
    const float scale = num::e4m3_to_f32(static_cast<uint8_t>(s));
    if (!std::isfinite(scale)) continue;  // 0x7f / 0xff: NaN, never a block scale
    const float scaled = std::ldexp(scale, cuda::nvfp4_layout::kScaleExp);
    ASSERT_EQ(num::f32_bits(scaled) & 0xffffu, 0u) << "scale " << s << " times 2^118 is not a bf16";
    for (uint32_t code = 0; code < 16; ++code) {
      const uint32_t c[4] = {code, code, code, code};
      const uint32_t d = np::pair_codes_bf16(np::spread_pair(word(c, s, s), 0));
      const float prod = num::bf16_to_f32(static_cast<uint16_t>(d & 0xffffu)) * scaled;
      const float want = num::e2m1_to_f32(static_cast<uint8_t>(code)) * scale / 256.0f;
      EXPECT_EQ(prod, want) << "code " << code << " scale " << s;
      EXPECT_EQ(num::f32_bits(prod) & 0xffffu, 0u) << "code " << code << " scale " << s << ": not exact in bf16";
    }
  }
}

}  // namespace
}  // namespace epmoe::test
