// The counter hash that both generators share (harness/counter_hash.h): the host generator is
// exactly it at the documented coordinates, and the hash itself is pinned, so the device generator
// (tests/harness/cuda) compares against fixed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/presets.h"
#include "harness/counter_hash.h"
#include "harness/synthetic.h"

namespace epmoe {
namespace {

MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 64;
  c.intermediate = 48;
  c.num_experts = 4;
  c.top_k = 2;
  c.num_ranks = 2;
  return c;
}

TEST(CounterHash, IsSplitmix64) {
  // The first outputs of splitmix64 from state 0 (Vigna's reference implementation).
  EXPECT_EQ(harness::hash::mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(harness::hash::mix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
}

TEST(CounterHash, HostGeneratorIsTheHashAtItsCoordinates) {
  const MoeConfig c = small_config();
  const uint64_t seed = 42;
  const int l = 3, e = 2, H = c.hidden, I = c.intermediate;
  const harness::ExpertMasters m = harness::expert_masters(c, seed, l, e);
  const uint64_t b13 = harness::hash::matrix_base(seed, l, e, harness::hash::kW13);
  const uint64_t b2 = harness::hash::matrix_base(seed, l, e, harness::hash::kW2);
  const float a13 = harness::hash::stddev_step(harness::hash::row_stddev(H));
  const float a2 = harness::hash::stddev_step(harness::hash::row_stddev(I));
  for (int r = 0; r < 2 * I; ++r)
    for (int col = 0; col < H; ++col) {
      const float want = harness::hash::element(b13, a13, uint64_t(r) * H + col);
      ASSERT_EQ(num::f32_bits(m.w13[size_t(r) * H + col]), num::f32_bits(want)) << r << "," << col;
    }
  for (int r = 0; r < H; ++r)
    for (int col = 0; col < I; ++col) {
      const float want = harness::hash::element(b2, a2, uint64_t(r) * I + col);
      ASSERT_EQ(num::f32_bits(m.w2[size_t(r) * I + col]), num::f32_bits(want)) << r << "," << col;
    }
  // Uniform in [-sqrt(3) s, sqrt(3) s): the step times 2^23 is the amplitude.
  const float amp = float(std::sqrt(3.0) / std::sqrt(double(H)));
  for (float v : m.w13) ASSERT_TRUE(v >= -amp && v < amp) << v;
}

TEST(CounterHash, UniformBf16IsReproducibleAndInRange) {
  const std::vector<bf16_raw> a = harness::uniform_bf16(4096, 2.f, 7), b = harness::uniform_bf16(4096, 2.f, 7);
  const std::vector<bf16_raw> c = harness::uniform_bf16(4096, 2.f, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum = 0, sq = 0;
  for (bf16_raw v : a) {
    const float f = num::bf16_to_f32(v);
    ASSERT_LE(std::fabs(f), 2.f);
    sum += f;
    sq += double(f) * f;
  }
  EXPECT_NEAR(sum / a.size(), 0.0, 0.1);
  EXPECT_NEAR(sq / a.size(), 4.0 / 3.0, 0.1);  // variance of U(-2, 2)
  const uint64_t base = harness::hash::mix64(7);
  EXPECT_EQ(a[5], num::f32_to_bf16(harness::hash::element(base, harness::hash::amplitude_step(2.f), 5)));
}

}  // namespace
}  // namespace epmoe

namespace epmoe::harness {
namespace {

// router_rows: the model's router on random logits, rows kept for the first `local` experts: the
// count asked for, ids in range, reproducible from the seed, a prefix for fewer rows, and a load
// that is uneven (not every expert equal) but touches every local expert.
TEST(RouterRows, ModelRouterOnRandomLogitsKeepsLocalRows) {
  const MoeConfig m = preset("deepseek-v3").config;
  const int local = m.num_experts / 2;
  const std::vector<int32_t> r = router_rows(m, local, 20000, 7);
  ASSERT_EQ(r.size(), 20000u);
  std::vector<int> per(local, 0);
  for (const int32_t e : r) {
    ASSERT_GE(e, 0);
    ASSERT_LT(e, local);
    ++per[e];
  }
  const auto [lo, hi] = std::minmax_element(per.begin(), per.end());
  EXPECT_GT(*lo, 0);
  EXPECT_GT(*hi, *lo);
  EXPECT_EQ(router_rows(m, local, 20000, 7), r);
  const std::vector<int32_t> few = router_rows(m, local, 100, 7);
  EXPECT_TRUE(std::equal(few.begin(), few.end(), r.begin()));
  EXPECT_THROW(router_rows(m, m.num_experts + 1, 10, 7), UsageError);
}

}  // namespace
}  // namespace epmoe::harness
