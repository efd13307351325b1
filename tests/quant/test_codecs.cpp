// Scalar codecs of numeric.h against hand-computed codes, and (when the CUDA headers are on the
// include path) against CUDA's own host conversions over many values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "epmoe/numeric.h"

#if __has_include(<cuda_fp8.h>) && __has_include(<cuda_fp4.h>)
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cstring>
#define EPMOE_TEST_HAVE_CUDA_FP 1
#endif

namespace {

using namespace epmoe::num;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
const float kSub = 0.001953125f;  // 2^-9, the smallest e4m3 subnormal

TEST(QuantCodec, E4m3HandVectors) {
  struct Case {
    float x;
    uint8_t code;
  };
  const Case cases[] = {
      {0.f, 0x00},
      {-0.f, 0x80},
      {1.f, 0x38},
      {-1.f, 0xb8},
      {1.0625f, 0x38},   // tie between 1.0 and 1.125: even mantissa (1.0)
      {1.1875f, 0x3a},   // tie between 1.125 and 1.25: even mantissa (1.25)
      {1.07f, 0x39},     // above the tie: 1.125
      {2.24f, 0x41},     // nearest is 2.25
      {240.f, 0x77},     // 1.875 * 2^7
      {416.f, 0x7d},
      {432.f, 0x7e},     // tie between 416 and 448: even (448)
      {448.f, 0x7e},
      {464.f, 0x7e},     // would round to 480 without saturation
      {1e9f, 0x7e},
      {-1e9f, 0xfe},
      {kInf, 0x7e},
      {-kInf, 0xfe},
      {0.015625f, 0x08},       // 2^-6, smallest normal
      {kSub, 0x01},            // smallest subnormal
      {0.5f * kSub, 0x00},     // subnormal tie: 0 is even
      {0.51f * kSub, 0x01},
      {1.5f * kSub, 0x02},     // tie between 1 and 2: even (2)
      {2.5f * kSub, 0x02},     // tie between 2 and 3: even (2)
      {3.5f * kSub, 0x04},
      {7.5f * kSub, 0x08},     // tie between 7 (odd) and 8 = 2^-6: rounds into the normal range
      {-1.5f * kSub, 0x82},
      {1e-30f, 0x00},
      {-1e-30f, 0x80},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_e4m3(c.x), c.code) << "x=" << c.x;
  }
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7f);
}

TEST(QuantCodec, E4m3DecodeAllCodes) {
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), kSub);
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * kSub);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  // Every non-NaN code survives a decode/encode round trip, and decoded values ascend with the code.
  float prev = -1.f;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_e4m3(v), c) << "code " << c;
    if (c < 0x7f) {
      EXPECT_GT(v, prev) << "code " << c;
      prev = v;
    }
  }
}

TEST(QuantCodec, E2m1HandVectors) {
  struct Case {
    float x;
    uint8_t code;
  };
  const Case cases[] = {
      {0.f, 0}, {0.25f, 0}, {0.26f, 1}, {0.5f, 1}, {0.75f, 2}, {1.f, 2}, {1.25f, 2}, {1.5f, 3},
      {1.75f, 4}, {2.f, 4}, {2.5f, 4}, {3.f, 5}, {3.5f, 6}, {4.f, 6}, {5.f, 6}, {5.01f, 7},
      {6.f, 7}, {7.f, 7}, {100.f, 7}, {kInf, 7}, {-kInf, 0xf}, {-0.f, 0x8}, {-0.75f, 0xa},
      {-5.f, 0xe}, {-1e-20f, 0x8},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_e2m1(c.x), c.code) << "x=" << c.x;
  }
  EXPECT_EQ(f32_to_e2m1(kNaN), 0);  // documented: e2m1 has no NaN, NaN becomes +0
  const float values[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), values[c]);
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 8)), -values[c]);
  }
}

TEST(QuantCodec, Bf16RoundNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.f + 1.f / 256), 0x3f80);       // tie: even (1.0)
  EXPECT_EQ(f32_to_bf16(1.f + 3.f / 256), 0x3f82);       // tie: even (1 + 2/128)
  EXPECT_EQ(f32_to_bf16(1.f + 1.f / 256 + 1.f / 65536), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(-2.f), 0xc000);
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the top: Inf
  const uint16_t nan = f32_to_bf16(kNaN);
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  // A signalling NaN whose payload sits only in the low 16 bits must not become Inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_f32(0x7f800001u)))));
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.f);
}

#if defined(EPMOE_TEST_HAVE_CUDA_FP)

std::vector<float> probe_values() {
  std::vector<float> v;
  // Every e4m3 value, the midpoints between neighbours and one ulp either side of each midpoint:
  // the points where a rounding bug would show.
  std::vector<float> grid;
  for (int c = 0; c < 0x7f; ++c) grid.push_back(e4m3_to_f32(static_cast<uint8_t>(c)));
  grid.push_back(480.f);
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    const float mid = 0.5f * (grid[i] + grid[i + 1]);
    for (float x : {grid[i], mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (float x : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f, 7.f, 1e-30f, 1e30f, kInf}) {
    for (float y : {x, std::nextafter(x, 0.f), std::nextafter(x, 1e9f)}) {
      v.push_back(y);
      v.push_back(-y);
    }
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = bits_f32(bits(rng));
    if (!std::isnan(x)) v.push_back(x);
  }
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 100000; ++i) v.push_back(nd(rng));
  return v;
}

TEST(QuantCodec, E4m3MatchesCudaHostConversion) {
  int mismatches = 0;
  for (float x : probe_values()) {
    const uint8_t ref = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    const uint8_t got = f32_to_e4m3(x);
    if (ref != got && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " (bits 0x" << std::hex << f32_bits(x) << ") cuda=0x" << int(ref) << " epmoe=0x"
                    << int(got);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(f32_to_e4m3(kNaN), static_cast<uint8_t>(__nv_cvt_float_to_fp8(kNaN, __NV_SATFINITE, __NV_E4M3)));
}

TEST(QuantCodec, E2m1MatchesCudaHostConversion) {
  int mismatches = 0;
  for (float x : probe_values()) {
    const uint8_t ref = static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)) & 0xf;
    const uint8_t got = f32_to_e2m1(x);
    if (ref != got && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " cuda=0x" << std::hex << int(ref) << " epmoe=0x" << int(got);
    }
  }
  EXPECT_EQ(mismatches, 0);
  // The one deliberate difference (docs/FORMATS.md): CUDA saturates NaN to 6 (code 7); epmoe maps
  // NaN to 0 so that a NaN activation cannot inject the largest value into a block.
  EXPECT_EQ(static_cast<uint8_t>(__nv_cvt_float_to_fp4(kNaN, __NV_E2M1, cudaRoundNearest)) & 0x7, 7);
  EXPECT_EQ(f32_to_e2m1(kNaN), 0);
}

TEST(QuantCodec, Bf16MatchesCudaHostConversion) {
  int mismatches = 0;
  for (float x : probe_values()) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    uint16_t ref;
    std::memcpy(&ref, &b, 2);
    if (ref != f32_to_bf16(x) && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " cuda=0x" << std::hex << ref << " epmoe=0x" << f32_to_bf16(x);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

#else

TEST(QuantCodec, CudaHostConversionComparison) {
  GTEST_SKIP() << "cuda_fp8.h / cuda_fp4.h not on the include path; the codec comparison against CUDA's host "
                  "conversions runs only in builds with the CUDA toolkit";
}

#endif

}  // namespace
