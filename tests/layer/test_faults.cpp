// Data faults (DESIGN.md §7): what the scan counts, the message, and what MoeLayer does in each
// tuning.fault_check mode on the CPU backend: only the faulty tokens' outputs differ from a clean
// run, the counts say how many, raise mode raises after writing the outputs, off counts nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "layer/faults.h"
#include "layer/stack_model.h"

namespace epmoe {
namespace {

constexpr uint16_t kBf16Nan = 0x7fc0, kBf16Inf = 0x7f80;

TEST(FaultScan, CountsEachKindOncePerToken) {
  const int T = 4, H = 16, E = 8, K = 2;
  std::vector<uint16_t> x(T * H, 0x3f80);  // 1.0
  std::vector<float> logits(T * E, 0.5f);
  std::vector<int32_t> ids(T * K, 1);
  std::vector<float> w(T * K, 0.5f);
  x[1 * H + 3] = kBf16Nan, x[1 * H + 9] = kBf16Inf;  // token 1 twice: counted once
  x[3 * H + 15] = 0xff80;                             // -inf, last element
  logits[2 * E + 7] = std::numeric_limits<float>::infinity();
  w[0 * K + 1] = std::nanf("");
  ids[2 * K + 0] = E, ids[2 * K + 1] = -2, ids[3 * K] = -1;  // two bad entries; -1 is fine
  detail::FaultScan s;
  s.tokens = T, s.hidden = H, s.x = x.data(), s.logits = logits.data(), s.num_experts = E;
  s.ids = ids.data(), s.weights = w.data(), s.top_k = K;
  int64_t c[detail::kFaultKinds] = {};
  detail::scan_faults_host(s, c);
  EXPECT_EQ(c[detail::kNonfiniteHidden], 2);
  EXPECT_EQ(c[detail::kNonfiniteLogits], 1);
  EXPECT_EQ(c[detail::kNonfiniteWeights], 1);
  EXPECT_EQ(c[detail::kBadIds], 2);
  // bf16 logits: the same rule on 16-bit values; null inputs are not scanned.
  std::vector<uint16_t> lb(T * E, 0x3f00);
  lb[5] = kBf16Nan;
  detail::FaultScan s2;
  s2.tokens = T, s2.hidden = H, s2.logits = lb.data(), s2.logits_bf16 = true, s2.num_experts = E;
  int64_t c2[detail::kFaultKinds] = {};
  detail::scan_faults_host(s2, c2);
  EXPECT_EQ(c2[detail::kNonfiniteLogits], 1);
  EXPECT_EQ(c2[detail::kNonfiniteHidden] + c2[detail::kNonfiniteWeights] + c2[detail::kBadIds], 0);
  // Large finite values are not faults.
  x.assign(T * H, 0x7f7f);  // the largest finite bf16
  detail::FaultScan s3;
  s3.tokens = T, s3.hidden = H, s3.x = x.data();
  int64_t c3[detail::kFaultKinds] = {};
  detail::scan_faults_host(s3, c3);
  EXPECT_EQ(c3[detail::kNonfiniteHidden], 0);
}

TEST(FaultScan, MessageNamesEachKindAndCount) {
  const int64_t d[detail::kFaultKinds] = {1, 0, 3, 2};
  EXPECT_EQ(detail::fault_message(d, 64),
            "1 token with NaN/inf in hidden, 3 tokens with NaN/inf routing weights, 2 topk_ids entries outside "
            "[-1, 64)");
  const int64_t none[detail::kFaultKinds] = {};
  EXPECT_EQ(detail::fault_message(none, 64), "");
}

MoeConfig small_config(FaultCheck mode) {
  MoeConfig c;
  c.hidden = 64, c.intermediate = 64, c.num_experts = 8, c.top_k = 2;
  c.capacity = 16, c.dispatcher = "local", c.runner = "reference";
  c.tuning.fault_check = mode;
  return c;
}

struct Outcome {
  std::vector<bf16_raw> out;
  FaultCounts counts;
  std::string error;
};

// One forward (router path) of T tokens with `poison` applied to the inputs.
Outcome run_forward(const MoeConfig& c, const Model& m, const std::vector<bf16_raw>& x, const std::vector<float>& logits) {
  const int64_t T = int64_t(x.size()) / c.hidden;
  auto comm = make_local_comm();
  MoeLayer layer(c, *comm, m.rank_weights(0, 0));
  Outcome r;
  r.out.assign(x.size(), 0x7e7e);
  try {
    layer.forward(TensorView::of(const_cast<bf16_raw*>(x.data()), DType::bf16, {T, c.hidden}),
                  TensorView::of(const_cast<float*>(logits.data()), DType::f32, {T, c.num_experts}),
                  TensorView::of(r.out.data(), DType::bf16, {T, c.hidden}));
  } catch (const UsageError& e) {
    r.error = e.what();
  }
  r.counts = layer.fault_counts();
  return r;
}

TEST(LayerFaults, OnlyTheFaultyTokensDifferAndAreCounted) {
  const int64_t T = 6;
  const MoeConfig c = small_config(FaultCheck::count);
  const Model m(c, 1, 17);
  const std::vector<bf16_raw> x = random_hidden(T, c.hidden, 5);
  std::vector<float> logits(T * c.num_experts);
  m.router_logits(0, x.data(), T, logits.data());
  const Outcome clean = run_forward(c, m, x, logits);
  EXPECT_EQ(clean.counts.total(), 0);
  EXPECT_EQ(clean.error, "");

  std::vector<bf16_raw> xb = x;
  std::vector<float> lb = logits;
  xb[1 * c.hidden + 7] = kBf16Nan;                             // token 1: NaN hidden
  lb[3 * c.num_experts + 2] = std::numeric_limits<float>::infinity();  // token 3: +inf logit -> NaN weights
  lb[4 * c.num_experts + 5] = -1e30f;                         // token 4: finite, huge: not a fault
  const Outcome bad = run_forward(c, m, xb, lb);
  EXPECT_EQ(bad.error, "");
  EXPECT_EQ(bad.counts.nonfinite_hidden, 1);
  EXPECT_EQ(bad.counts.nonfinite_logits, 1);
  EXPECT_EQ(bad.counts.nonfinite_weights, 1);
  EXPECT_EQ(bad.counts.bad_ids, 0);
  for (int64_t t = 0; t < T; ++t) {
    if (t == 1 || t == 3 || t == 4) continue;
    for (int h = 0; h < c.hidden; ++h)
      ASSERT_EQ(bad.out[t * c.hidden + h], clean.out[t * c.hidden + h]) << "token " << t << " changed";
  }
  for (int h = 0; h < c.hidden; ++h) {
    const float v = num::bf16_to_f32(bad.out[4 * c.hidden + h]);
    ASSERT_TRUE(std::isfinite(v)) << "a finite logit of any magnitude gives a finite output";
  }
}

TEST(LayerFaults, RaiseModeRaisesAfterWritingAndOffCountsNothing) {
  const int64_t T = 3;
  const Model m(small_config(FaultCheck::count), 1, 23);
  std::vector<bf16_raw> x = random_hidden(T, 64, 9);
  std::vector<float> logits(T * 8);
  m.router_logits(0, x.data(), T, logits.data());
  x[2 * 64] = kBf16Inf;
  const Outcome raised = run_forward(small_config(FaultCheck::raise), m, x, logits);
  EXPECT_NE(raised.error.find("tuning.fault_check=raise"), std::string::npos) << raised.error;
  EXPECT_NE(raised.error.find("1 token with NaN/inf in hidden"), std::string::npos) << raised.error;
  EXPECT_EQ(raised.counts.nonfinite_hidden, 1);
  EXPECT_NE(raised.out[0], 0x7e7e) << "raise mode writes every output before raising";
  const Outcome off = run_forward(small_config(FaultCheck::off), m, x, logits);
  EXPECT_EQ(off.error, "");
  EXPECT_EQ(off.counts.total(), 0);
}

TEST(LayerFaults, RoutedBadIdsAndResetOnTheCpuBackend) {
  // On the CPU backend a bad id is refused before any work (the ids are host memory); counting
  // happens only for what passed the checks, so this counts NaN weights and resets them.
  const MoeConfig c = small_config(FaultCheck::count);
  const Model m(c, 1, 29);
  const int64_t T = 2;
  auto comm = make_local_comm();
  MoeLayer layer(c, *comm, m.rank_weights(0, 0));
  std::vector<bf16_raw> x = random_hidden(T, c.hidden, 3), out(T * c.hidden);
  std::vector<int32_t> ids = {0, 1, 2, 3};
  std::vector<float> w = {0.5f, std::nanf(""), 0.25f, 0.75f};
  auto call = [&] {
    layer.forward_routed(TensorView::of(x.data(), DType::bf16, {T, c.hidden}),
                         TensorView::of(ids.data(), DType::i32, {T, c.top_k}),
                         TensorView::of(w.data(), DType::f32, {T, c.top_k}),
                         TensorView::of(out.data(), DType::bf16, {T, c.hidden}));
  };
  call();
  call();
  EXPECT_EQ(layer.fault_counts().nonfinite_weights, 2);
  layer.reset_fault_counts();
  EXPECT_EQ(layer.fault_counts().total(), 0);
  ids[3] = 99;
  EXPECT_THROW(call(), UsageError);
  EXPECT_EQ(layer.fault_counts().total(), 0) << "refused input is not counted: nothing ran";
}

}  // namespace
}  // namespace epmoe
