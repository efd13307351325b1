// route_cpu: hand-computed cases (ties, renormalization, group selection, bias, scaling, NaN) and a
// bitwise check of the documented operation order that the CUDA router reproduces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"

namespace epmoe {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(const RouterConfig& cfg, std::vector<float> logits, int E, int K, const float* bias = nullptr) {
  const int64_t T = int64_t(logits.size()) / E;
  Routed r{std::vector<int32_t>(T * K), std::vector<float>(T * K)};
  route_cpu(cfg, TensorView::of(logits.data(), DType::f32, {T, E}), bias, K, r.ids.data(), r.w.data());
  return r;
}

RouterConfig softmax(bool renorm) {
  RouterConfig c;
  c.kind = RouterKind::softmax_topk;
  c.renormalize = renorm;
  return c;
}

RouterConfig grouped(int n_group, int topk_group, bool renorm, float scale) {
  RouterConfig c;
  c.kind = RouterKind::sigmoid_grouped_topk;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.renormalize = renorm;
  c.routed_scaling_factor = scale;
  return c;
}

// Logits below about -88.7 make the fp32 sigmoid 0: renormalizing would be 0/0. The weights are
// then the limit of s_k / sum s, a softmax over the chosen logits (DESIGN.md §1.5): finite, summing
// to 1. Without renormalization they are 0 (the token's routed output is 0).
TEST(RouteCpu, SigmoidUnderflowGivesFiniteWeights) {
  const std::vector<float> bias = {0.f, 0.5f, 0.f, 0.2f};  // bias chooses experts 1 and 3
  const Routed r = route(grouped(1, 1, true, 2.f), {-300.f, -201.f, -100.f, -200.f}, 4, 2, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  const double e1 = std::exp(-1.0), z = 1.0 + e1;  // softmax of {-201, -200}
  EXPECT_NEAR(r.w[0], 2.0 * e1 / z, 1e-6);
  EXPECT_NEAR(r.w[1], 2.0 * 1.0 / z, 1e-6);
  for (float x : {-1e30f, -3.4e38f}) {
    const Routed big = route(grouped(1, 1, true, 1.f), {x, x, x, x}, 4, 2);
    for (float w : big.w) EXPECT_EQ(w, 0.5f) << x;  // equal logits: equal shares
  }
  const Routed plain = route(grouped(1, 1, false, 2.f), {-300.f, -201.f, -100.f, -200.f}, 4, 2, bias.data());
  for (float w : plain.w) EXPECT_EQ(w, 0.f);
  // One chosen sigmoid not underflowed: the ordinary renormalization (no fallback).
  const Routed mixed = route(grouped(1, 1, true, 1.f), {-300.f, 0.f, -100.f, -200.f}, 4, 2, bias.data());
  EXPECT_EQ(mixed.w[0], 1.f);
  EXPECT_EQ(mixed.w[1], 0.f);
}

TEST(RouteCpu, SoftmaxTopKPicksLargestWithSoftmaxWeights) {
  const Routed r = route(softmax(false), {1.f, 3.f, 2.f, 0.f}, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_NEAR(r.w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.w[1], std::exp(2.0) / z, 1e-6);
}

TEST(RouteCpu, SoftmaxRenormalizedWeightsSumToOne) {
  const Routed r = route(softmax(true), {1.f, 3.f, 2.f, 0.f}, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.w[0], std::exp(1.0) / (std::exp(1.0) + 1.0), 1e-6);
  EXPECT_NEAR(r.w[1], 1.0 / (std::exp(1.0) + 1.0), 1e-6);
}

TEST(RouteCpu, TiesGoToTheLowerExpertId) {
  const Routed r = route(softmax(false), {0.f, 0.f, 0.f, 0.f}, 4, 3);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  for (float w : r.w) EXPECT_EQ(w, 0.25f);
  const Routed s = route(softmax(true), {-1.f, 2.f, 5.f, 2.f, 5.f}, 5, 4);
  EXPECT_EQ(s.ids, (std::vector<int32_t>{2, 4, 1, 3}));
  EXPECT_EQ(s.w[0], s.w[1]);
}

TEST(RouteCpu, Bf16LogitsAreWidenedExactly) {
  std::vector<float> f = {0.5f, -1.25f, 3.0f, 2.75f, 0.0f, -7.5f, 1.0f, 2.0f};
  std::vector<bf16_raw> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = num::f32_to_bf16(f[i]);
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  route_cpu(softmax(true), TensorView::of(b.data(), DType::bf16, {1, 8}), nullptr, 3, ids.data(), w.data());
  const Routed r = route(softmax(true), f, 8, 3);
  EXPECT_EQ(ids, r.ids);
  EXPECT_EQ(0, std::memcmp(w.data(), r.w.data(), 12));
}

TEST(RouteCpu, NanNeverWinsAndAllNanPicksLowestIds) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Routed r = route(softmax(false), {nan, 1.f, 0.f, nan}, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.w[0], std::exp(1.0) / (std::exp(1.0) + 1.0), 1e-6);  // NaN adds nothing to the sum
  const Routed all = route(softmax(true), {nan, nan, nan}, 3, 2);
  EXPECT_EQ(all.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(std::isnan(all.w[0]) && std::isnan(all.w[1]));
  const Routed g = route(grouped(1, 1, false, 1.f), {nan, -2.f, nan, 3.f}, 4, 3);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{3, 1, 0}));
}

TEST(RouteCpu, GroupSelectionExcludesStrongExpertsOfLosingGroups) {
  // Logits 0 give s = 0.5 exactly; the bias sets c. Groups of 2:
  // c = [1.75, .5 | 1, 1 | .5, .5 | .5, .5] -> group scores 2.25, 2, 1, 1. With topk_group 1 only
  // group 0 survives, so expert 1 (c .5) beats experts 2 and 3 (c 1).
  const std::vector<float> bias = {1.25f, 0.f, 0.5f, 0.5f, 0.f, 0.f, 0.f, 0.f};
  const Routed r = route(grouped(4, 1, false, 1.f), std::vector<float>(8, 0.f), 8, 2, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  // Weights are s, not c.
  EXPECT_EQ(r.w[0], 0.5f);
  EXPECT_EQ(r.w[1], 0.5f);
  // Two groups kept: 0 and 1; top-3 of c inside is 0, then 2 and 3 (tie, lower id first).
  const Routed r2 = route(grouped(4, 2, false, 1.f), std::vector<float>(8, 0.f), 8, 3, bias.data());
  EXPECT_EQ(r2.ids, (std::vector<int32_t>{0, 2, 3}));
}

TEST(RouteCpu, GroupScoreIsSumOfTopTwoAndTiesGoToLowerGroup) {
  // c = [1, .5, .5, .5 | .75, .75, .25, .25]: group scores top1+top2 = 1.5 and 1.5 (tie -> group 0)
  // although group 1 has the larger sum of all four.
  const std::vector<float> bias = {0.5f, 0.f, 0.f, 0.f, 0.25f, 0.25f, -0.25f, -0.25f};
  const Routed r = route(grouped(2, 1, false, 1.f), std::vector<float>(8, 0.f), 8, 2, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  // c = [1, .5, .5, .5 | .75, .875, .25, .25]: group 1 scores 1.625 > 1.5.
  std::vector<float> b2 = bias;
  b2[5] = 0.375f;
  const Routed r2 = route(grouped(2, 1, false, 1.f), std::vector<float>(8, 0.f), 8, 2, b2.data());
  EXPECT_EQ(r2.ids, (std::vector<int32_t>{5, 4}));
}

TEST(RouteCpu, BiasChangesChoiceNotWeightsAndScalingApplies) {
  // s0 = sigmoid(1) > s1 = 0.5, but bias makes c1 = 1.0 > c0.
  const std::vector<float> logits = {1.f, 0.f, -1.f, -2.f};
  const std::vector<float> bias = {0.f, 0.5f, 0.f, 0.f};
  const Routed r = route(grouped(1, 1, false, 1.f), logits, 4, 1, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(r.w[0], 0.5f);
  const Routed k2 = route(grouped(1, 1, false, 2.5f), logits, 4, 2, bias.data());
  EXPECT_EQ(k2.ids, (std::vector<int32_t>{1, 0}));
  const float s0 = num::sigmoid_f32(1.f);
  EXPECT_EQ(k2.w[0], 0.5f * 2.5f);
  EXPECT_EQ(k2.w[1], s0 * 2.5f);
  const Routed n2 = route(grouped(1, 1, true, 2.5f), logits, 4, 2, bias.data());
  const float sum = 0.5f + s0;
  EXPECT_EQ(n2.w[0], (0.5f / sum) * 2.5f);
  EXPECT_EQ(n2.w[1], (s0 / sum) * 2.5f);
  EXPECT_NEAR(n2.w[0] + n2.w[1], 2.5f, 1e-6);
  // Null bias: choice by s.
  const Routed nb = route(grouped(1, 1, false, 1.f), logits, 4, 1);
  EXPECT_EQ(nb.ids, (std::vector<int32_t>{0}));
}

// The documented order, written out again from the comment block of src/route/cpu.cpp.
float documented_softmax_sum(const std::vector<float>& e) {
  std::vector<float> lane(32, 0.0f);
  for (size_t i = 0; i < e.size(); ++i) lane[i % 32] = lane[i % 32] + (std::isnan(e[i]) ? 0.0f : e[i]);
  for (int off = 16; off > 0; off >>= 1) {
    std::vector<float> prev = lane;
    for (int l = 0; l < 32; ++l) lane[l] = prev[l] + prev[l ^ off];
  }
  return lane[0];
}

TEST(RouteCpu, SoftmaxFollowsTheDocumentedOrderBitwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int E : {8, 64, 72, 160, 256}) {
    for (int K : {1, 2, 8}) {
      std::vector<float> x(size_t(E) * 4);
      for (auto& v : x) v = nd(rng);
      for (bool renorm : {false, true}) {
        const Routed r = route(softmax(renorm), x, E, K);
        for (int t = 0; t < 4; ++t) {
          const float* row = x.data() + t * E;
          float m = row[0];
          for (int i = 1; i < E; ++i) m = std::max(m, row[i]);
          std::vector<float> e(E);
          for (int i = 0; i < E; ++i) e[i] = num::exp_f32(row[i] - m);
          const float sum = documented_softmax_sum(e);
          std::vector<float> w(K);
          float wsum = 0.f;
          for (int k = 0; k < K; ++k) {
            w[k] = e[r.ids[t * K + k]] / sum;
            wsum = wsum + w[k];
          }
          for (int k = 0; k < K; ++k) {
            const float want = renorm ? w[k] / wsum : w[k];
            ASSERT_EQ(num::f32_bits(want), num::f32_bits(r.w[t * K + k])) << "E=" << E << " t=" << t << " k=" << k;
            if (k > 0) ASSERT_GE(e[r.ids[t * K + k - 1]], e[r.ids[t * K + k]]);
          }
        }
      }
    }
  }
}

TEST(RouteCpu, BadArgumentsAreUsageErrors) {
  std::vector<float> x(8, 0.f);
  std::vector<int32_t> ids(8);
  std::vector<float> w(8);
  EXPECT_THROW(route_cpu(softmax(true), TensorView::of(x.data(), DType::f32, {2, 4}), nullptr, 5, ids.data(), w.data()),
               UsageError);
  EXPECT_THROW(route_cpu(grouped(3, 1, true, 1.f), TensorView::of(x.data(), DType::f32, {2, 4}), nullptr, 1,
                         ids.data(), w.data()),
               UsageError);  // 3 groups do not divide 4 experts
  EXPECT_THROW(route_cpu(grouped(4, 1, true, 1.f), TensorView::of(x.data(), DType::f32, {2, 4}), nullptr, 2,
                         ids.data(), w.data()),
               UsageError);  // one kept group of 1 expert cannot give 2
  EXPECT_THROW(route_cpu(softmax(true), TensorView::of(x.data(), DType::i32, {2, 4}), nullptr, 1, ids.data(), w.data()),
               UsageError);
}

TEST(CheckTopkIds, NamesTheFirstBadEntry) {
  const std::vector<int32_t> ok = {0, -1, 7, 3};
  EXPECT_NO_THROW(check_topk_ids(ok.data(), 2, 2, 8));
  const std::vector<int32_t> bad = {0, 1, 2, 8, -2, 0};
  try {
    check_topk_ids(bad.data(), 3, 2, 8);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("topk_ids[token 1, k 1] = 8 is outside [-1, E=8)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace epmoe
