// The CPU reference runner against the float64 oracle (same dequantized weights and activations)
// and against its own documented per-row arithmetic (bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/received_batch.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "run/oracle.h"
#include "run/reference.h"

namespace epmoe {
namespace {

constexpr bf16_raw kSentinel = 0x7e7e;  // a value the runner never writes by accident

// A random received batch of R = counts.size() source regions (common/received_batch.h).
struct Received : test::ReceivedBatch {
  Received(ActFormat f, std::vector<int32_t> cnt, uint64_t seed) {
    C = 6, H = 256, K = 3, El = 4;
    format = f;
    counts = std::move(cnt);
    R = int(counts.size());
    std::mt19937_64 rng(seed);
    draw(rng);
  }
};

struct Weights {
  std::vector<float> w13, w2;
  HostMatrix q13, q2;
  Weights(int El, int H, int I, WeightFormat f, uint64_t seed) {
    test::random_expert_weights(seed, El, H, I, w13, w2);
    q13 = quantize_matrix(w13.data(), El, 2 * I, H, f, I);
    q2 = quantize_matrix(w2.data(), El, H, I, f);
  }
  ExpertWeights view(int El, int H, int I) const { return ExpertWeights{El, H, I, q13.view(), q2.view()}; }
};

MoeConfig config(int H, int I, WeightFormat wf, IntermediateQuant iq = IntermediateQuant::none) {
  MoeConfig c;
  c.hidden = H, c.intermediate = I, c.weight_format = wf, c.intermediate_quant = iq;
  return c;
}

struct Case {
  ActFormat act;
  WeightFormat wf;
  int I = 128;  // 192: fp8 W13 with gate and up tiled apart at a partial tile (row_split = I)
};

class ReferenceVsOracle : public ::testing::TestWithParam<Case> {};

// Tolerance: y is bf16 (relative rounding <= 2^-9) of an fp32 sum whose rounding error is
// ~1e-6 relative; so per element |y - ref| <= 2^-8 |ref| + 1e-4 max|ref|.
TEST_P(ReferenceVsOracle, MatchesFloat64WithSameDequantizedInputs) {
  const Case c = GetParam();
  const int I = c.I;
  Received rx(c.act, {5, 0, 6}, 7);
  Weights wt(rx.El, rx.H, I, c.wf, 11);
  detail::ReferenceRunner runner(config(rx.H, I, c.wf));
  std::vector<bf16_raw> y(size_t(rx.R) * rx.C * rx.H, kSentinel);
  runner.run(rx.view(), wt.view(rx.El, rx.H, I), y.data(), nullptr);

  const auto dense = oracle::DenseExperts::quantized(wt.w13.data(), wt.w2.data(), rx.El, rx.H, I, c.wf);
  const auto xq = oracle::dispatched_activations(c.act, rx.quant, rx.x.data(), int64_t(rx.R) * rx.C, rx.H);
  std::vector<double> ref(size_t(rx.R) * rx.C * rx.H);
  oracle::moe_forward(dense, xq.data(), int64_t(rx.R) * rx.C, rx.ids.data(), rx.w.data(), rx.K, ref.data());

  double ref_max = 0;
  for (double v : ref) ref_max = std::max(ref_max, std::abs(v));
  ASSERT_GT(ref_max, 0.1);
  for (int s = 0; s < rx.R; ++s) {
    for (int j = 0; j < rx.C; ++j) {
      const size_t base = (size_t(s) * rx.C + j) * rx.H;
      for (int h = 0; h < rx.H; ++h) {
        if (j >= rx.counts[s]) {
          ASSERT_EQ(y[base + h], kSentinel) << "invalid slot (" << s << ", " << j << ") was written";
          continue;
        }
        const double got = num::bf16_to_f32(y[base + h]);
        ASSERT_LE(std::abs(got - ref[base + h]), std::ldexp(std::abs(ref[base + h]), -8) + 1e-4 * ref_max)
            << "slot (" << s << ", " << j << ") h=" << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ReferenceVsOracle,
                         ::testing::Values(Case{ActFormat::bf16, WeightFormat::bf16}, Case{ActFormat::fp8, WeightFormat::fp8},
                                           Case{ActFormat::nvfp4, WeightFormat::nvfp4},
                                           Case{ActFormat::fp8, WeightFormat::nvfp4},
                                           Case{ActFormat::nvfp4, WeightFormat::bf16},
                                           Case{ActFormat::bf16, WeightFormat::fp8, 192}),
                         [](const auto& info) {
                           return std::string(format_name(info.param.act)) + "_w" + format_name(info.param.wf) +
                                  (info.param.I != 128 ? "_I" + std::to_string(info.param.I) : "");
                         });

// The runner batches rows by expert; each slot must still equal the documented per-row sequence.
void expect_matches_per_row(IntermediateQuant iq, bool ue8m0) {
  const int I = 256;
  Received rx(ActFormat::fp8, {6, 2, 0, 4}, 3);
  Weights wt(rx.El, rx.H, I, WeightFormat::fp8, 5);
  MoeConfig cfg = config(rx.H, I, WeightFormat::fp8, iq);
  cfg.fp8_ue8m0 = ue8m0;
  detail::ReferenceRunner runner(cfg);
  std::vector<bf16_raw> y(size_t(rx.R) * rx.C * rx.H, kSentinel);
  runner.run(rx.view(), wt.view(rx.El, rx.H, I), y.data(), nullptr);

  const int H = rx.H;
  std::vector<float> x(H), w13(size_t(2) * I * H), w2(size_t(H) * I), scratch(3 * I), o(H), acc(H);
  for (int s = 0; s < rx.R; ++s) {
    for (int j = 0; j < rx.counts[s]; ++j) {
      const size_t slot = size_t(s) * rx.C + j;
      dequantize_rows(rx.format, rx.quant, rx.payload.data() + slot * H, rx.scales.data() + slot * (H / 32), 1, H, x.data());
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int k = 0; k < rx.K; ++k) {
        const int e = rx.ids[slot * rx.K + k];
        if (e < 0) continue;
        dequantize_matrix_rows(wt.q13.view(), e, 0, 2 * I, w13.data());
        dequantize_matrix_rows(wt.q2.view(), e, 0, H, w2.data());
        detail::expert_ffn_row(w13.data(), w2.data(), H, I, x.data(), iq, ue8m0, scratch.data(), o.data());
        for (int h = 0; h < H; ++h) acc[h] += rx.w[slot * rx.K + k] * o[h];
      }
      for (int h = 0; h < H; ++h) ASSERT_EQ(y[slot * H + h], num::f32_to_bf16(acc[h])) << "slot " << slot << " h " << h;
    }
  }
}

TEST(ReferenceRunner, BitwiseEqualToPerRowArithmetic) { expect_matches_per_row(IntermediateQuant::none, false); }
TEST(ReferenceRunner, IntermediateFp8Reproducible) { expect_matches_per_row(IntermediateQuant::fp8, false); }
TEST(ReferenceRunner, IntermediateFp8Ue8m0Reproducible) { expect_matches_per_row(IntermediateQuant::fp8, true); }

// intermediate_quant auto runs exactly what it resolves to: fp8 for fp8 weights, none for bf16 and
// nvfp4 (bitwise the same output as the explicit value), and it differs from the other choice.
TEST(ReferenceRunner, IntermediateQuantAutoRunsTheResolvedValue) {
  const int I = 256;
  Received rx(ActFormat::fp8, {6, 2, 0, 4}, 3);
  auto run = [&](WeightFormat wf, IntermediateQuant iq) {
    Weights wt(rx.El, rx.H, I, wf, 5);
    detail::ReferenceRunner runner(config(rx.H, I, wf, iq));
    std::vector<bf16_raw> y(size_t(rx.R) * rx.C * rx.H, kSentinel);
    runner.run(rx.view(), wt.view(rx.El, rx.H, I), y.data(), nullptr);
    return y;
  };
  using IQ = IntermediateQuant;
  const std::vector<bf16_raw> fp8_auto = run(WeightFormat::fp8, IQ::automatic);
  EXPECT_EQ(fp8_auto, run(WeightFormat::fp8, IQ::fp8));
  EXPECT_NE(fp8_auto, run(WeightFormat::fp8, IQ::none));
  for (WeightFormat wf : {WeightFormat::bf16, WeightFormat::nvfp4}) {
    const std::vector<bf16_raw> a = run(wf, IQ::automatic);
    EXPECT_EQ(a, run(wf, IQ::none)) << format_name(wf);
    EXPECT_NE(a, run(wf, IQ::fp8)) << format_name(wf);
  }
  // The per-row arithmetic takes the resolved value only.
  std::vector<float> g(128, 1.f), u(128, 1.f), out(128);
  EXPECT_THROW(detail::swiglu_row(g.data(), u.data(), 128, IQ::automatic, false, out.data()), UsageError);
}

TEST(ReferenceRunner, IntermediateFp8RoundsToE4m3Grid) {
  std::vector<float> g(256), u(256), a(256);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int i = 0; i < 256; ++i) g[i] = nd(rng), u[i] = nd(rng);
  detail::swiglu_row(g.data(), u.data(), 256, IntermediateQuant::fp8, false, a.data());
  int changed = 0;
  for (int b = 0; b < 2; ++b) {
    // Re-quantizing an already rounded block must give back the same values.
    uint8_t q[128];
    const float scale = quantize_fp8_block(a.data() + b * 128, 128, false, q);
    for (int i = 0; i < 128; ++i) {
      EXPECT_EQ(num::e4m3_to_f32(q[i]) * scale, a[b * 128 + i]);
      const float exact = (g[b * 128 + i] * num::sigmoid_f32(g[b * 128 + i])) * u[b * 128 + i];
      changed += exact != a[b * 128 + i];
    }
  }
  EXPECT_GT(changed, 100);  // the rounding really happened
}

TEST(ReferenceRunner, NanInOneSlotStaysInThatSlot) {
  const int I = 128;
  Received rx(ActFormat::bf16, {4}, 9);
  for (int k = 0; k < rx.K; ++k) rx.ids[size_t(2) * rx.K + k] = k;  // slot 2 uses experts 0..2
  auto* p = reinterpret_cast<bf16_raw*>(rx.payload.data());
  p[size_t(2) * rx.H + 7] = 0x7fc0;  // NaN
  Weights wt(rx.El, rx.H, I, WeightFormat::bf16, 1);
  detail::ReferenceRunner runner(config(rx.H, I, WeightFormat::bf16));
  std::vector<bf16_raw> y(size_t(rx.C) * rx.H, kSentinel);
  runner.run(rx.view(), wt.view(rx.El, rx.H, I), y.data(), nullptr);
  for (int j = 0; j < 4; ++j) {
    int nans = 0;
    for (int h = 0; h < rx.H; ++h) nans += std::isnan(num::bf16_to_f32(y[size_t(j) * rx.H + h]));
    if (j == 2) EXPECT_EQ(nans, rx.H);
    else EXPECT_EQ(nans, 0) << "slot " << j;
  }
}

TEST(ReferenceRunner, RejectsBadSetup) {
  // The fp8 intermediate takes a partial last block (I % 16 == 0), nothing finer.
  EXPECT_THROW(detail::ReferenceRunner(config(256, 200, WeightFormat::bf16, IntermediateQuant::fp8)), UsageError);
  EXPECT_NO_THROW(detail::ReferenceRunner(config(256, 192, WeightFormat::bf16, IntermediateQuant::fp8)));
  Received rx(ActFormat::bf16, {3}, 2);
  Weights wt(rx.El, rx.H, 128, WeightFormat::bf16, 1);
  detail::ReferenceRunner runner(config(rx.H, 128, WeightFormat::fp8));  // weights are bf16
  std::vector<bf16_raw> y(size_t(rx.C) * rx.H);
  try {
    runner.run(rx.view(), wt.view(rx.El, rx.H, 128), y.data(), nullptr);
    FAIL() << "format mismatch accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("weight_format is fp8"), std::string::npos) << e.what();
  }
  // An fp8 W13 split anywhere but at I (or 0) is refused, naming the field and the fix.
  Weights w8(rx.El, rx.H, 192, WeightFormat::fp8, 1);
  ExpertWeights v = w8.view(rx.El, rx.H, 192);
  v.w13.row_split = 64;
  detail::ReferenceRunner r8(config(rx.H, 192, WeightFormat::fp8));
  try {
    r8.run(rx.view(), v, y.data(), nullptr);
    FAIL() << "row_split 64 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("w13.row_split=64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("or 192"), std::string::npos) << e.what();
  }
  v.w13.row_split = 0;  // one grid over all rows: a layout of its own, taken
  EXPECT_NO_THROW(r8.run(rx.view(), v, y.data(), nullptr));
}

}  // namespace
}  // namespace epmoe
