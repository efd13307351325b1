// CPU quantizers (quant.h) against hand-computed blocks: operation order, scale rules, special
// values, layouts. Round trips are checked only on top of exact vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"

namespace {

using namespace epmoe;
using num::e2m1_to_f32;
using num::e4m3_to_f32;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// ---- fp8 blocks --------------------------------------------------------------------------------

TEST(QuantCpu, Fp8BlockHandComputed) {
  std::vector<float> x(128, 0.f);
  x[0] = 2.f;      // amax: scale = 2/448, multiplier 224
  x[1] = 1.f;      // 224, exact
  x[2] = 0.01f;    // 2.24 -> 2.25 (0x41)
  x[3] = -2.f;     // -448
  x[127] = 0.5f;   // 112 = 1.75 * 64 (0x6e)
  std::vector<uint8_t> q(128, 0xaa);
  const float s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 2.f / 448.f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0x76);  // 224 = 1.75 * 2^7
  EXPECT_EQ(q[2], 0x41);
  EXPECT_EQ(q[3], 0xfe);
  EXPECT_EQ(q[4], 0x00);
  EXPECT_EQ(q[127], 0x6e);
}

TEST(QuantCpu, Fp8MultiplierComputedOncePerBlock) {
  // 448/a then x * that is not always x * 448 / a: with a = 3, 1.5 * (448/3) and (1.5 * 448) / 3
  // may differ in the last bit. The format prescribes the first.
  std::vector<float> x(128);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (float& v : x) v = u(rng);
  x[5] = 3.f;
  std::vector<uint8_t> q(128);
  const float s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 3.f / 448.f);
  const float mul = 448.f / 3.f;
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[i], num::f32_to_e4m3(x[i] * mul)) << i;
}

TEST(QuantCpu, Fp8AllEqualAndZeroBlocks) {
  std::vector<float> x(128, 3.f);
  std::vector<uint8_t> q(128);
  float s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 3.f / 448.f);
  for (uint8_t c : q) EXPECT_EQ(c, 0x7e);
  std::fill(x.begin(), x.end(), -3.f);
  quantize_fp8_block(x.data(), 128, false, q.data());
  for (uint8_t c : q) EXPECT_EQ(c, 0xfe);

  std::fill(x.begin(), x.end(), 0.f);
  x[9] = -0.f;
  s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 1e-4f / 448.f);  // a = max(0, 1e-4)
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[i], i == 9 ? 0x80 : 0x00) << i;
}

TEST(QuantCpu, Fp8TinyAmaxUsesFloor) {
  std::vector<float> x(128, 1e-6f);
  std::vector<uint8_t> q(128);
  const float s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 1e-4f / 448.f);
  // 1e-6 * (448 / 1e-4) = 4.48 -> 4.5 (0x49): small values are not blown up to 448.
  for (uint8_t c : q) EXPECT_EQ(c, 0x49);
}

TEST(QuantCpu, Fp8Ue8m0Scales) {
  std::vector<float> x(128, 0.f);
  std::vector<uint8_t> q(128);
  struct Case {
    float amax, scale;
  };
  const Case cases[] = {
      {448.f, 1.f},             // exact power: not rounded up further
      {224.f, 0.5f},
      {896.f, 2.f},
      {449.f, 2.f},             // just above: rounds up
      {300.f, 1.f},
      {1.f, 1.f / 256.f},       // 1/448 lies in (2^-9, 2^-8]
      {0.f, std::ldexp(1.f, -22)},  // a = 1e-4: 1e-4/448 = 2.23e-7 in (2^-23, 2^-22]
  };
  for (const Case& c : cases) {
    x[0] = c.amax;
    x[1] = -c.amax / 2;
    x[2] = c.amax / 3;
    const float s = quantize_fp8_block(x.data(), 128, true, q.data());
    EXPECT_EQ(s, c.scale) << "amax=" << c.amax;
    EXPECT_EQ(q[0], num::f32_to_e4m3(c.amax / c.scale));
    EXPECT_EQ(q[1], num::f32_to_e4m3(-c.amax / 2 / c.scale));
    EXPECT_EQ(q[2], num::f32_to_e4m3(c.amax / 3 / c.scale));
  }
  // With a power-of-two scale rounded up, the block maximum never saturates (it lands in
  // (224, 448]).
  x[0] = 449.f;
  quantize_fp8_block(x.data(), 128, true, q.data());
  EXPECT_EQ(q[0], 0x76);  // 449/2 = 224.5 -> 224 (1.75 * 2^7)
}

TEST(QuantCpu, Fp8NanAndInf) {
  std::vector<float> x(128, 1.f);
  std::vector<uint8_t> q(128);
  x[3] = kNaN;  // ignored by amax, encoded as NaN
  float s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_EQ(s, 1.f / 448.f);
  EXPECT_EQ(q[3], 0x7f);
  EXPECT_EQ(q[0], 0x7e);
  // Inf makes amax infinite: the scale is Inf and the multiplier 0, so the block decodes to
  // non-finite values (documented: Inf in an fp8 block poisons the block instead of hiding).
  x[3] = kInf;
  s = quantize_fp8_block(x.data(), 128, false, q.data());
  EXPECT_TRUE(std::isinf(s));
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[3], 0x7f);  // Inf * 0 = NaN
}

// ---- nvfp4 blocks -------------------------------------------------------------------------------

TEST(QuantCpu, Nvfp4BlockNibbleOrderAndCodes) {
  const float x[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -6.f, -4.f, -3.f, -2.f, -1.5f, -1.f, -0.5f, -0.f};
  uint8_t p[8];
  // amax 6, gs 1: s = e4m3(6*1/6) = 1.0 (0x38); inv = 1; codes are the values themselves.
  const uint8_t s = quantize_nvfp4_block(x, 1.f, p);
  EXPECT_EQ(s, 0x38);
  const uint8_t want[8] = {0x10, 0x32, 0x54, 0x76, 0xef, 0xcd, 0xab, 0x89};  // element 2i in the low nibble
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p[i], want[i]) << i;
}

TEST(QuantCpu, Nvfp4BlockScaleAndInverse) {
  float x[16] = {};
  x[0] = 12.f;
  x[1] = 5.f;
  x[2] = -1.1f;
  uint8_t p[8];
  // gs = 2: s = e4m3((12*2)/6 = 4) = 0x48, inv = 2/4 = 0.5; 12*0.5 = 6 (7), 5*0.5 = 2.5 -> 2 (4),
  // -1.1*0.5 = -0.55 -> -0.5 (0x9).
  EXPECT_EQ(quantize_nvfp4_block(x, 2.f, p), 0x48);
  EXPECT_EQ(p[0], 0x47);
  EXPECT_EQ(p[1], 0x09);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(p[i], 0);

  // A block scale that is not exactly representable: amax 1, gs 2688 -> 448 (0x7e); amax 0.7 ->
  // 313.6 -> 320 (0x7a), inv = 2688/320 = 8.4; 0.7*8.4 = 5.88 -> 6.
  float y[16] = {};
  y[0] = 0.7f;
  y[1] = 0.2f;  // 1.68 -> 1.5 (3)
  EXPECT_EQ(quantize_nvfp4_block(y, 2688.f, p), 0x7a);
  EXPECT_EQ(p[0], 0x37);
}

TEST(QuantCpu, Nvfp4ZeroScaleBlocks) {
  float x[16] = {};
  uint8_t p[8];
  std::memset(p, 0xff, 8);
  EXPECT_EQ(quantize_nvfp4_block(x, 1.f, p), 0x00);
  for (uint8_t b : p) EXPECT_EQ(b, 0);
  // amax*gs/6 below half the smallest e4m3 subnormal: s rounds to 0, so every code is 0 even
  // though the values are not.
  for (int i = 0; i < 16; ++i) x[i] = (i % 2 ? -1.f : 1.f) * 0.005f;
  std::memset(p, 0xff, 8);
  EXPECT_EQ(quantize_nvfp4_block(x, 1.f, p), 0x00);
  for (uint8_t b : p) EXPECT_EQ(b, 0);
}

TEST(QuantCpu, Nvfp4NanAndInf) {
  float x[16] = {};
  x[0] = 6.f;
  x[1] = kNaN;
  uint8_t p[8];
  EXPECT_EQ(quantize_nvfp4_block(x, 1.f, p), 0x38);
  EXPECT_EQ(p[0], 0x07);  // NaN -> 0 in the high nibble
  x[1] = kInf;
  x[2] = -kInf;
  // amax = Inf saturates s to 448: inv = 1/448; the finite 6 becomes 0.0134 -> 0; Inf stays the
  // largest code of its sign.
  EXPECT_EQ(quantize_nvfp4_block(x, 1.f, p), 0x7e);
  EXPECT_EQ(p[0], 0x70);
  EXPECT_EQ(p[1] & 0xf, 0xf);
}

TEST(QuantCpu, Nvfp4GlobalScaleHelper) {
  std::vector<float> x = {0.5f, -2.f, 1.f, kNaN, 0.f};
  EXPECT_EQ(nvfp4_global_scale(x.data(), x.size()), 2688.f / 2.f);
  x.push_back(-kInf);  // calibration skips non-finite values
  EXPECT_EQ(nvfp4_global_scale(x.data(), x.size()), 1344.f);
  std::vector<float> z(10, 0.f);
  EXPECT_EQ(nvfp4_global_scale(z.data(), z.size()), 1.f);
  EXPECT_EQ(nvfp4_global_scale(nullptr, 0), 1.f);
  std::vector<bf16_raw> b = {num::f32_to_bf16(3.f), num::f32_to_bf16(-7.f), num::f32_to_bf16(kNaN)};
  EXPECT_EQ(nvfp4_global_scale_bf16(b.data(), b.size()), 2688.f / 7.f);
  // With gs from the data, the largest block scale is exactly 448 (the top e4m3 code).
  float blk[16] = {};
  blk[4] = -7.f;
  uint8_t p[8];
  EXPECT_EQ(quantize_nvfp4_block(blk, 2688.f / 7.f, p), 0x7e);
}

// ---- rows ------------------------------------------------------------------------------------

std::vector<bf16_raw> random_rows(int64_t T, int H, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<bf16_raw> v(size_t(T) * H);
  for (auto& b : v) b = num::f32_to_bf16(nd(rng));
  return v;
}

TEST(QuantCpu, RowsBf16IsExact) {
  const int H = 48;
  auto in = random_rows(3, H, 1);
  std::vector<uint8_t> payload(3 * payload_bytes(ActFormat::bf16, H));
  quantize_rows(ActFormat::bf16, {}, in.data(), 3, H, payload.data(), nullptr);
  EXPECT_EQ(std::memcmp(payload.data(), in.data(), payload.size()), 0);
  std::vector<float> out(3 * H);
  dequantize_rows(ActFormat::bf16, {}, payload.data(), nullptr, 3, H, out.data());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], num::bf16_to_f32(in[i]));
}

// H = 336 ends on a partial block of 80 (as gpt-oss's 2880 on one of 64): ceil(H/128) scales, the
// last one that block's own, with the same block rule over its 80 values.
TEST(QuantCpu, RowsFp8MatchBlocksAndLayout) {
  const int T = 3;
  for (const int H : {384, 336})
  for (bool ue8m0 : {false, true}) {
    SCOPED_TRACE("H " + std::to_string(H));
    const int nb = (H + 127) / 128;
    ASSERT_EQ(scale_bytes(ActFormat::fp8, H), size_t(nb) * 4);
    auto in = random_rows(T, H, 2);
    in[1 * H + 200] = num::f32_to_bf16(40.f);  // row 1, block 1 gets a large amax
    std::vector<uint8_t> payload(T * payload_bytes(ActFormat::fp8, H)), scales(T * scale_bytes(ActFormat::fp8, H));
    QuantParams p;
    p.ue8m0 = ue8m0;
    quantize_rows(ActFormat::fp8, p, in.data(), T, H, payload.data(), scales.data());
    std::vector<float> out(size_t(T) * H);
    dequantize_rows(ActFormat::fp8, p, payload.data(), scales.data(), T, H, out.data());
    for (int t = 0; t < T; ++t) {
      for (int b = 0; b < nb; ++b) {
        const int n = std::min(128, H - 128 * b);
        float x[128];
        uint8_t q[128];
        for (int i = 0; i < n; ++i) x[i] = num::bf16_to_f32(in[t * H + b * 128 + i]);
        const float s = quantize_fp8_block(x, n, ue8m0, q);
        float stored;
        std::memcpy(&stored, scales.data() + (t * nb + b) * 4, 4);
        ASSERT_EQ(stored, s);
        ASSERT_EQ(std::memcmp(q, payload.data() + t * H + b * 128, n), 0);
        for (int i = 0; i < n; ++i) {
          const float d = out[t * H + b * 128 + i];
          EXPECT_EQ(d, e4m3_to_f32(q[i]) * s);
          // 3 mantissa bits: half-ulp relative error 2^-4, subnormals add at most 2^-10 * scale.
          EXPECT_LE(std::fabs(d - x[i]), std::fabs(x[i]) / 16 + s / 1024 + 1e-12f) << t << " " << b << " " << i;
        }
      }
    }
    float s11;
    std::memcpy(&s11, scales.data() + (1 * nb + 1) * 4, 4);
    EXPECT_EQ(s11, ue8m0 ? 0.125f : 40.f / 448.f);
  }
}

// The partial last block's scale follows its own values only: a large value there sets it, and
// the whole blocks before it keep theirs.
TEST(QuantCpu, RowsFp8PartialLastBlockIsItsOwn) {
  const int H = 2880, nb = 23;
  std::vector<bf16_raw> in(H, num::f32_to_bf16(0.5f));
  in[H - 1] = num::f32_to_bf16(100.f);
  std::vector<uint8_t> payload(H), scales(nb * 4);
  quantize_rows(ActFormat::fp8, {}, in.data(), 1, H, payload.data(), scales.data());
  float first, last;
  std::memcpy(&first, scales.data(), 4);
  std::memcpy(&last, scales.data() + (nb - 1) * 4, 4);
  EXPECT_EQ(first, 0.5f / 448.f);
  EXPECT_EQ(last, 100.f / 448.f);
  std::vector<float> out(H);
  dequantize_rows(ActFormat::fp8, {}, payload.data(), scales.data(), 1, H, out.data());
  EXPECT_EQ(out[H - 1], 100.f);
  EXPECT_EQ(out[0], 0.5f);
}

TEST(QuantCpu, RowsNvfp4MatchBlocksAndLayout) {
  const int H = 64, T = 2;
  auto in = random_rows(T, H, 3, 2.f);
  QuantParams p;
  p.nvfp4_global_scale = nvfp4_global_scale_bf16(in.data(), in.size());
  std::vector<uint8_t> payload(T * payload_bytes(ActFormat::nvfp4, H)), scales(T * scale_bytes(ActFormat::nvfp4, H));
  quantize_rows(ActFormat::nvfp4, p, in.data(), T, H, payload.data(), scales.data());
  std::vector<float> out(size_t(T) * H);
  dequantize_rows(ActFormat::nvfp4, p, payload.data(), scales.data(), T, H, out.data());
  for (int t = 0; t < T; ++t) {
    for (int b = 0; b < H / 16; ++b) {
      float x[16];
      uint8_t q[8];
      for (int i = 0; i < 16; ++i) x[i] = num::bf16_to_f32(in[t * H + b * 16 + i]);
      ASSERT_EQ(scales[t * (H / 16) + b], quantize_nvfp4_block(x, p.nvfp4_global_scale, q));
      ASSERT_EQ(std::memcmp(q, payload.data() + t * (H / 2) + b * 8, 8), 0);
      const float s = e4m3_to_f32(scales[t * (H / 16) + b]);
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = (q[i / 2] >> (4 * (i & 1))) & 0xf;
        EXPECT_EQ(out[t * H + b * 16 + i], (e2m1_to_f32(code) * s) / p.nvfp4_global_scale);
        // Largest e2m1 gap is 2 (4 -> 6): error <= 1 unit of s/gs, plus the scale's own rounding.
        EXPECT_LE(std::fabs(out[t * H + b * 16 + i] - x[i]), amax / 6 * 1.07f + 1e-6f);
      }
    }
  }
}

TEST(QuantCpu, RowsRejectBadArguments) {
  std::vector<bf16_raw> in(100);
  std::vector<uint8_t> a(1000), b(1000);
  EXPECT_THROW(quantize_rows(ActFormat::fp8, {}, in.data(), 1, 100, a.data(), b.data()), UsageError);  // % 16
  EXPECT_THROW(quantize_rows(ActFormat::nvfp4, {}, in.data(), 1, 32, a.data(), b.data()), UsageError);  // gs 0
  try {
    quantize_rows(ActFormat::nvfp4, {}, in.data(), 1, 20, a.data(), b.data());
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("H=20 is not a multiple of 16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_rows(ActFormat::fp8, {}, in.data(), 1, 128, a.data(), nullptr), UsageError);
  EXPECT_THROW(dequantize_rows(ActFormat::fp8, {}, a.data(), nullptr, 1, 128, nullptr), UsageError);
  // T = 0 touches nothing.
  quantize_rows(ActFormat::fp8, {}, nullptr, 0, 128, nullptr, nullptr);
}

// ---- weights ---------------------------------------------------------------------------------

TEST(QuantCpu, MatrixSizes) {
  MatrixView v;
  v.experts = 3;
  v.rows = 256;
  v.cols = 384;
  v.format = WeightFormat::bf16;
  EXPECT_EQ(v.data_bytes(), 3u * 256 * 384 * 2);
  EXPECT_EQ(v.scale_bytes(), 0u);
  v.format = WeightFormat::fp8;
  EXPECT_EQ(v.data_bytes(), 3u * 256 * 384);
  EXPECT_EQ(v.scale_bytes(), 3u * 2 * 3 * 4);
  v.format = WeightFormat::nvfp4;
  EXPECT_EQ(v.data_bytes(), 3u * 256 * 384 / 2);
  EXPECT_EQ(v.scale_bytes(), 3u * 256 * 24);
}

TEST(QuantCpu, MatrixBf16RoundsToNearestEven) {
  std::vector<float> w = {1.f + 1.f / 256, 1.f + 3.f / 256, -2.5f, 0.f};
  HostMatrix m = quantize_matrix(w.data(), 1, 2, 2, WeightFormat::bf16);
  ASSERT_EQ(m.data.size(), 8u);
  std::vector<float> out(4);
  dequantize_matrix_rows(m.view(), 0, 0, 2, out.data());
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], 1.f + 2.f / 128);
  EXPECT_EQ(out[2], -2.5f);
  EXPECT_EQ(m.view().scales, nullptr);
}

TEST(QuantCpu, MatrixFp8TilesAreIndependent) {
  const int E = 2, R = 256, C = 384;
  std::vector<float> w(size_t(E) * R * C);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : w) v = u(rng);
  // One distinct peak per tile, so a scale read from the wrong tile shows.
  auto at = [&](int e, int r, int c) -> float& { return w[(size_t(e) * R + r) * C + c]; };
  for (int e = 0; e < E; ++e)
    for (int bi = 0; bi < 2; ++bi)
      for (int bj = 0; bj < 3; ++bj) at(e, bi * 128 + 17, bj * 128 + 33) = float(2 + e * 6 + bi * 3 + bj);
  HostMatrix m = quantize_matrix(w.data(), E, R, C, WeightFormat::fp8);
  const float* sc = reinterpret_cast<const float*>(m.scales.data());
  for (int e = 0; e < E; ++e)
    for (int bi = 0; bi < 2; ++bi)
      for (int bj = 0; bj < 3; ++bj) {
        const float peak = float(2 + e * 6 + bi * 3 + bj);
        EXPECT_EQ(sc[(e * 2 + bi) * 3 + bj], peak / 448.f);
        EXPECT_EQ(m.data[(size_t(e) * R + bi * 128 + 17) * C + bj * 128 + 33], 0x7e);
      }
  std::vector<float> out(size_t(5) * C);
  dequantize_matrix_rows(m.view(), 1, 126, 5, out.data());  // crosses the row-tile boundary
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < C; ++c) {
      const int gr = 126 + r;
      const float s = sc[(1 * 2 + gr / 128) * 3 + c / 128];
      const float q = e4m3_to_f32(m.data[(size_t(1) * R + gr) * C + c]);
      ASSERT_EQ(out[size_t(r) * C + c], q * s);
      const float peak = float(2 + 6 + (gr / 128) * 3 + c / 128);  // the tile's amax
      ASSERT_EQ(m.data[(size_t(1) * R + gr) * C + c], num::f32_to_e4m3(at(1, gr, c) * (448.f / peak)));
    }
}

// W13 with gate and up tiled apart (row_split = I): the same bytes as quantizing the two halves as
// matrices of their own and stacking them (data, then each expert's gate tiles and up tiles); with
// I % 128 == 0 the same bytes as one grid; dequantization reads each row's own half's tile.
TEST(QuantCpu, MatrixFp8RowSplitTilesHalvesApart) {
  const int E = 2, H = 320;  // 2.5 column tiles
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const int I : {192, 256}) {
    SCOPED_TRACE("I=" + std::to_string(I));
    std::vector<float> w(size_t(E) * 2 * I * H);
    for (float& v : w) v = u(rng);
    for (size_t i = 0; i < w.size(); i += 97) w[i] *= 40.f;  // uneven tile amaxes
    const HostMatrix m = quantize_matrix(w.data(), E, 2 * I, H, WeightFormat::fp8, I);
    EXPECT_EQ(m.row_split, I);
    EXPECT_EQ(m.view().row_split, I);
    const int tI = (I + 127) / 128, tH = (H + 127) / 128;
    ASSERT_EQ(m.scales.size(), size_t(E) * 2 * tI * tH * 4);
    EXPECT_EQ(fp8_tile_rows(2 * I, I), 2 * tI);
    for (int e = 0; e < E; ++e)
      for (int half = 0; half < 2; ++half) {
        const HostMatrix p = quantize_matrix(w.data() + (size_t(e) * 2 + half) * I * H, 1, I, H, WeightFormat::fp8);
        ASSERT_EQ(p.scales.size(), size_t(tI) * tH * 4);
        EXPECT_EQ(0, std::memcmp(p.data.data(), m.data.data() + (size_t(e) * 2 + half) * I * H, p.data.size()));
        EXPECT_EQ(0, std::memcmp(p.scales.data(), m.scales.data() + (size_t(e) * 2 + half) * tI * tH * 4,
                                 p.scales.size()))
            << "expert " << e << " half " << half;
      }
    const HostMatrix one = quantize_matrix(w.data(), E, 2 * I, H, WeightFormat::fp8);
    EXPECT_EQ(one.data == m.data && one.scales == m.scales, I % 128 == 0);
    // Rows I-2 .. I+1 straddle the split: each takes its own half's tile.
    std::vector<float> out(size_t(4) * H);
    dequantize_matrix_rows(m.view(), 1, I - 2, 4, out.data());
    const float* sc = reinterpret_cast<const float*>(m.scales.data());
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < H; ++c) {
        const int gr = I - 2 + r, tr = gr < I ? (gr / 128) : tI + (gr - I) / 128;
        EXPECT_EQ(fp8_tile_row(gr, I), tr);
        ASSERT_EQ(out[size_t(r) * H + c],
                  e4m3_to_f32(m.data[(size_t(1) * 2 * I + gr) * H + c]) * sc[(size_t(1) * 2 * tI + tr) * tH + c / 128]);
      }
  }
  std::vector<float> w(64);
  EXPECT_THROW(quantize_matrix(w.data(), 1, 8, 8, WeightFormat::fp8, 9), UsageError);
  EXPECT_THROW(quantize_matrix(w.data(), 1, 8, 8, WeightFormat::fp8, -1), UsageError);
  // bf16 / nvfp4 keep no split (one layout whatever the rows).
  EXPECT_EQ(quantize_matrix(w.data(), 1, 4, 16, WeightFormat::nvfp4, 2).row_split, 0);
}

TEST(QuantCpu, MatrixNvfp4PerExpertGlobalScale) {
  const int E = 2, R = 4, C = 32;
  std::vector<float> w(size_t(E) * R * C);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : w) v = u(rng);
  w[3] = 5.f;                    // expert 0 amax 5
  w[size_t(R) * C + 70] = -0.5f;  // expert 1 amax 1 or less
  for (size_t i = size_t(R) * C; i < w.size(); ++i) w[i] *= 0.25f;
  HostMatrix m = quantize_matrix(w.data(), E, R, C, WeightFormat::nvfp4);
  ASSERT_EQ(m.global_scale.size(), 2u);
  EXPECT_EQ(m.global_scale[0], 2688.f / 5.f);
  EXPECT_EQ(m.global_scale[1], nvfp4_global_scale(w.data() + R * C, size_t(R) * C));
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < C / 16; ++b) {
        uint8_t q[8];
        const uint8_t s = quantize_nvfp4_block(w.data() + (size_t(e) * R + r) * C + b * 16, m.global_scale[e], q);
        ASSERT_EQ(m.scales[(size_t(e) * R + r) * (C / 16) + b], s);
        ASSERT_EQ(std::memcmp(q, m.data.data() + (size_t(e) * R + r) * (C / 2) + b * 8, 8), 0);
      }
  std::vector<float> out(size_t(R) * C);
  dequantize_matrix_rows(m.view(), 0, 0, R, out.data());
  EXPECT_NEAR(out[3], 5.f, 1e-5f);
  EXPECT_THROW(quantize_matrix(w.data(), 1, 1, 24, WeightFormat::nvfp4), UsageError);
  EXPECT_THROW(dequantize_matrix_rows(m.view(), 2, 0, 1, out.data()), UsageError);
  EXPECT_THROW(dequantize_matrix_rows(m.view(), 0, 3, 2, out.data()), UsageError);
}

}  // namespace
