// End-to-end MoeLayer on the cpu fabric against the plain single-process computation.
//
// The expected output is built token by token from the reference runner's documented per-row
// arithmetic (detail::expert_ffn_row), the placement rule and the combine rule:
//   y_d = bf16(sum over k whose chosen copy is on rank d, ascending k, of w_k * FFN(x^))
//   out = bf16(sum over ranks d ascending of y_d), fp32
// so the distributed layer must match it exactly (compared as values: +0 == -0). A float64
// comparison with a stated tolerance is done as well.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"
#include "harness/check.h"
#include "harness/synthetic.h"
#include "layer/stack_model.h"
#include "run/oracle.h"
#include "run/reference.h"

namespace epmoe {
namespace {

using Rows16 = std::vector<std::vector<bf16_raw>>;

MoeConfig base_config(int R, int E, int K, int C) {
  MoeConfig c;
  c.hidden = 128, c.intermediate = 128, c.num_experts = E, c.top_k = K;
  c.num_ranks = R, c.capacity = C;
  c.dispatcher = R == 1 ? "local" : "cpu";
  c.runner = "reference";
  c.timeout_ms = 5000;
  return c;
}

struct Inputs {
  Rows16 x;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> w;
};

// Random tokens and routing rows (distinct experts per token, weights in (0, 1]).
Inputs random_inputs(const MoeConfig& c, const std::vector<int64_t>& T, uint64_t seed) {
  Inputs in;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(0.05f, 1.f);
  for (int r = 0; r < c.num_ranks; ++r) {
    in.x.push_back(random_hidden(T[r], c.hidden, seed * 31 + r));
    std::vector<int32_t> ids(size_t(T[r]) * c.top_k);
    std::vector<float> w(ids.size());
    std::vector<int32_t> perm(c.num_experts);
    for (int64_t t = 0; t < T[r]; ++t) {
      for (int e = 0; e < c.num_experts; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < c.top_k; ++k) ids[t * c.top_k + k] = perm[k], w[t * c.top_k + k] = ud(rng);
    }
    in.ids.push_back(std::move(ids));
    in.w.push_back(std::move(w));
  }
  return in;
}

// forward_routed on every rank of a cpu group (or a local comm for R = 1).
Rows16 run_layer(const MoeConfig& c, const Model& m, const Inputs& in) {
  const int R = c.num_ranks, H = c.hidden, K = c.top_k;
  Rows16 out(R);
  auto body = [&](Communicator& comm) {
    const int r = comm.rank();
    const int64_t T = int64_t(in.x[r].size()) / H;
    MoeLayer layer(c, comm, m.rank_weights(0, r));
    out[r].assign(size_t(T) * H, 0x7e7e);
    layer.forward_routed(TensorView::of(const_cast<bf16_raw*>(in.x[r].data()), DType::bf16, {T, H}),
                         TensorView::of(const_cast<int32_t*>(in.ids[r].data()), DType::i32, {T, K}),
                         TensorView::of(const_cast<float*>(in.w[r].data()), DType::f32, {T, K}),
                         TensorView::of(out[r].data(), DType::bf16, {T, H}));
  };
  if (c.dispatcher == "local") {
    auto comm = make_local_comm();
    body(*comm);
  } else {
    auto comms = make_cpu_group(R, c.timeout_ms);
    run_ranks(comms, body);
  }
  return out;
}

// The plain single-process computation described at the top of this file, for source rank s.
std::vector<float> expected_rank(const MoeConfig& c, const Model& m, int s, const Inputs& in) {
  const int H = c.hidden, I = c.intermediate, K = c.top_k, R = c.num_ranks;
  const ExpertPlacement pl = c.resolved_placement();
  const int64_t T = int64_t(in.x[s].size()) / H;
  std::vector<float> out(size_t(T) * H), x(H), w13(size_t(2) * I * H), w2(size_t(H) * I), scratch(3 * I), o(H);
  std::vector<uint8_t> pay(payload_bytes(c.dispatch_format, H)), sc(scale_bytes(c.dispatch_format, H) + 1);
  for (int64_t t = 0; t < T; ++t) {
    quantize_rows(c.dispatch_format, c.quant_params(), in.x[s].data() + t * H, 1, H, pay.data(), sc.data());
    dequantize_rows(c.dispatch_format, c.quant_params(), pay.data(), sc.data(), 1, H, x.data());
    std::vector<std::vector<float>> acc(R);
    for (int k = 0; k < K; ++k) {
      const int e = in.ids[s][t * K + k];
      if (e < 0) continue;
      const ExpertCopy cp = pl.choose(e, s, t);
      const ExpertWeights ew = m.rank_weights(0, cp.rank);
      dequantize_matrix_rows(ew.w13, cp.slot, 0, 2 * I, w13.data());
      dequantize_matrix_rows(ew.w2, cp.slot, 0, H, w2.data());
      detail::expert_ffn_row(w13.data(), w2.data(), H, I, x.data(), c.effective_intermediate_quant(), c.fp8_ue8m0, scratch.data(),
                             o.data());
      if (acc[cp.rank].empty()) acc[cp.rank].assign(H, 0.f);
      for (int h = 0; h < H; ++h) acc[cp.rank][h] += in.w[s][t * K + k] * o[h];
    }
    for (int h = 0; h < H; ++h) {
      float sum = 0.f;
      for (int d = 0; d < R; ++d)
        if (!acc[d].empty()) sum += num::bf16_to_f32(num::f32_to_bf16(acc[d][h]));
      out[size_t(t) * H + h] = num::bf16_to_f32(num::f32_to_bf16(sum));
    }
  }
  return out;
}

void expect_equal_to_plain(const MoeConfig& c, const Model& m, const Inputs& in, const Rows16& got) {
  for (int s = 0; s < c.num_ranks; ++s) {
    const auto want = expected_rank(c, m, s, in);
    ASSERT_EQ(got[s].size(), want.size()) << "rank " << s;
    for (size_t i = 0; i < want.size(); ++i) {
      const float g = num::bf16_to_f32(got[s][i]);
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(g)) << "rank " << s << " token " << i / c.hidden << " h " << i % c.hidden;
      } else {
        ASSERT_EQ(g, want[i]) << "rank " << s << " token " << i / c.hidden << " h " << i % c.hidden;
      }
    }
  }
}

struct Shape {
  int R, K;
};
class LayerMatrix : public ::testing::TestWithParam<Shape> {};

TEST_P(LayerMatrix, EqualsPlainComputation) {
  const auto [R, K] = GetParam();
  const int E = R == 3 ? 12 : 16, C = 12;
  MoeConfig c = base_config(R, E, K, C);
  std::vector<int64_t> T;
  for (int r = 0; r < R; ++r) T.push_back(r % 3 == 1 ? 0 : (r * 5 + 7) % (C + 1));  // zeros and T = C among them
  if (R > 2) T[2] = C;
  const Model m(c, 1, 42 + R);
  const Inputs in = random_inputs(c, T, 100 + R * 10 + K);
  expect_equal_to_plain(c, m, in, run_layer(c, m, in));
}

INSTANTIATE_TEST_SUITE_P(RanksTopK, LayerMatrix,
                         ::testing::Values(Shape{1, 1}, Shape{1, 2}, Shape{1, 8}, Shape{2, 1}, Shape{2, 2}, Shape{2, 8},
                                           Shape{3, 1}, Shape{3, 2}, Shape{3, 8}, Shape{4, 1}, Shape{4, 2}, Shape{4, 8},
                                           Shape{8, 1}, Shape{8, 2}, Shape{8, 8}),
                         [](const auto& info) {
                           return "R" + std::to_string(info.param.R) + "_K" + std::to_string(info.param.K);
                         });

TEST(Layer, CpuFabricWithOneRank) {
  MoeConfig c = base_config(1, 8, 2, 8);
  c.dispatcher = "cpu";
  const Model m(c, 1, 3);
  const Inputs in = random_inputs(c, {8}, 4);
  expect_equal_to_plain(c, m, in, run_layer(c, m, in));
}

struct Formats {
  ActFormat act;
  WeightFormat wf;
  bool ue8m0;
  IntermediateQuant iq;
};
class LayerFormats : public ::testing::TestWithParam<Formats> {};

TEST_P(LayerFormats, EqualsPlainComputationAndFloat64) {
  const Formats f = GetParam();
  MoeConfig c = base_config(4, 16, 4, 10);
  c.dispatch_format = f.act, c.weight_format = f.wf, c.fp8_ue8m0 = f.ue8m0, c.intermediate_quant = f.iq;
  const std::vector<int64_t> T = {10, 0, 7, 3};
  const Inputs in = random_inputs(c, T, 9);
  if (f.act == ActFormat::nvfp4) {
    std::vector<bf16_raw> all;
    for (const auto& x : in.x) all.insert(all.end(), x.begin(), x.end());
    c.nvfp4_global_scale = nvfp4_global_scale_bf16(all.data(), all.size());
  }
  const Model m(c, 1, 5);
  const Rows16 got = run_layer(c, m, in);
  expect_equal_to_plain(c, m, in, got);

  // float64 with the same dequantized weights and activations. y and out are each rounded to
  // bf16 once (2^-9 relative), fp8 intermediate adds up to 2^-4 relative on the intermediate.
  const auto dense = oracle::DenseExperts::quantized(m.layer(0).w13.data(), m.layer(0).w2.data(), c.num_experts,
                                                      c.hidden, c.intermediate, c.weight_format);
  std::vector<double> ref_all;
  std::vector<bf16_raw> got_all;
  for (int s = 0; s < c.num_ranks; ++s) {
    const auto xq = oracle::dispatched_activations(c.dispatch_format, c.quant_params(), in.x[s].data(), T[s], c.hidden);
    std::vector<double> ref(size_t(T[s]) * c.hidden);
    oracle::moe_forward(dense, xq.data(), T[s], in.ids[s].data(), in.w[s].data(), c.top_k, ref.data());
    ref_all.insert(ref_all.end(), ref.begin(), ref.end());
    got_all.insert(got_all.end(), got[s].begin(), got[s].end());
  }
  const auto err = oracle::compare_bf16(got_all.data(), ref_all.data(), ref_all.size());
  const bool iq8 = f.iq == IntermediateQuant::fp8;
  EXPECT_LT(err.max_rel, iq8 ? 0.1 : 0.01);
  EXPECT_LT(err.one_minus_cos, iq8 ? 2e-3 : 1e-4);
  EXPECT_EQ(err.nonfinite, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Quantized, LayerFormats,
    ::testing::Values(Formats{ActFormat::fp8, WeightFormat::fp8, false, IntermediateQuant::none},
                      Formats{ActFormat::fp8, WeightFormat::fp8, true, IntermediateQuant::none},
                      Formats{ActFormat::nvfp4, WeightFormat::nvfp4, false, IntermediateQuant::none},
                      Formats{ActFormat::fp8, WeightFormat::nvfp4, false, IntermediateQuant::none},
                      Formats{ActFormat::bf16, WeightFormat::fp8, false, IntermediateQuant::fp8},
                      Formats{ActFormat::fp8, WeightFormat::fp8, true, IntermediateQuant::fp8}),
    [](const auto& info) {
      return std::string(format_name(info.param.act)) + "_w" + format_name(info.param.wf) +
             (info.param.ue8m0 ? "_ue8m0" : "") + (info.param.iq == IntermediateQuant::fp8 ? "_iq8" : "");
    });

TEST(Layer, ZeroTokensOnEveryRank) {
  const MoeConfig c = base_config(4, 8, 2, 4);
  const Model m(c, 1, 1);
  const Inputs in = random_inputs(c, {0, 0, 0, 0}, 1);
  const Rows16 got = run_layer(c, m, in);
  for (const auto& g : got) EXPECT_TRUE(g.empty());
}

TEST(Layer, CapacityOverflowFailsOnEveryRank) {
  const MoeConfig c = base_config(3, 6, 2, 5);
  const Model m(c, 1, 1);
  const Inputs in = random_inputs(c, {5, 6, 0}, 2);  // rank 1 has C + 1 tokens
  auto comms = make_cpu_group(3, c.timeout_ms);
  std::vector<std::string> errors(3);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    const int64_t T = int64_t(in.x[r].size()) / c.hidden;
    MoeLayer layer(c, comm, m.rank_weights(0, r));
    std::vector<bf16_raw> out(size_t(T) * c.hidden);
    try {
      layer.forward_routed(TensorView::of(const_cast<bf16_raw*>(in.x[r].data()), DType::bf16, {T, c.hidden}),
                           TensorView::of(const_cast<int32_t*>(in.ids[r].data()), DType::i32, {T, c.top_k}),
                           TensorView::of(const_cast<float*>(in.w[r].data()), DType::f32, {T, c.top_k}),
                           TensorView::of(out.data(), DType::bf16, {T, c.hidden}));
    } catch (const UsageError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(errors[r].empty()) << "rank " << r << " did not fail";
    EXPECT_NE(errors[r].find('5'), std::string::npos) << "message should name C=5: " << errors[r];
  }
}

TEST(Layer, MinusOneIdsAndSeveralExpertsOnOneRank) {
  const MoeConfig c = base_config(2, 8, 4, 6);
  const Model m(c, 1, 8);
  Inputs in = random_inputs(c, {4, 3}, 8);
  const int K = 4;
  // rank 0: token 0 all -1 (zeros), token 1 partly -1, token 2 all on rank 1 (experts 4..7),
  // token 3 three experts on rank 0 and one on rank 1.
  const int32_t rows[4][4] = {{-1, -1, -1, -1}, {3, -1, 6, -1}, {4, 5, 6, 7}, {0, 1, 2, 7}};
  for (int t = 0; t < 4; ++t)
    for (int k = 0; k < K; ++k) in.ids[0][t * K + k] = rows[t][k];
  const Rows16 got = run_layer(c, m, in);
  expect_equal_to_plain(c, m, in, got);
  for (int h = 0; h < c.hidden; ++h) ASSERT_EQ(num::bf16_to_f32(got[0][h]), 0.f);
}

TEST(Layer, ExpertsNotDivisibleByRanks) {
  MoeConfig c = base_config(4, 6, 2, 8);
  // Contiguous placement cannot split 6 experts over 4 ranks.
  auto comms = make_cpu_group(4, c.timeout_ms);
  std::vector<int> failed(4, 0);
  run_ranks(comms, [&](Communicator& comm) {
    ExpertWeights w;
    try {
      MoeLayer layer(c, comm, w);
    } catch (const UsageError& e) {
      failed[comm.rank()] = std::string(e.what()).find("divisible") != std::string::npos ? 1 : 2;
    }
  });
  for (int f : failed) EXPECT_EQ(f, 1);

  // An explicit map with 2 slots per rank: experts 0 and 1 have a second copy.
  c.placement = ExpertPlacement::parse("0:0.0,2.1;1:0.1,3.1;2:1.0;3:1.1;4:2.0;5:3.0", 6, 4, 2);
  ASSERT_TRUE(validate(c).empty());
  const Model m(c, 1, 12);
  const Inputs in = random_inputs(c, {8, 3, 0, 6}, 13);
  expect_equal_to_plain(c, m, in, run_layer(c, m, in));
}

TEST(Layer, NanAndInfStayInTheirToken) {
  const MoeConfig c = base_config(2, 8, 3, 6);
  const Model m(c, 1, 21);
  Inputs in = random_inputs(c, {5, 4}, 22);
  in.x[0][size_t(2) * c.hidden + 5] = 0x7fc0;  // NaN in token 2 of rank 0
  in.x[1][size_t(1) * c.hidden + 9] = 0x7f80;  // +Inf in token 1 of rank 1
  const Rows16 got = run_layer(c, m, in);
  expect_equal_to_plain(c, m, in, got);  // non-finite where the plain computation has it, equal elsewhere
  auto bad_tokens = [&](int r) {
    std::vector<int> v;
    for (size_t t = 0; t < got[r].size() / c.hidden; ++t) {
      bool bad = false;
      for (int h = 0; h < c.hidden; ++h) bad |= !std::isfinite(num::bf16_to_f32(got[r][t * c.hidden + h]));
      if (bad) v.push_back(int(t));
    }
    return v;
  };
  EXPECT_EQ(bad_tokens(0), std::vector<int>{2});
  EXPECT_EQ(bad_tokens(1), std::vector<int>{1});
}

TEST(Layer, ForwardFromLogitsEqualsRoutedEntryPoint) {
  MoeConfig c = base_config(2, 8, 2, 8);
  c.router.kind = RouterKind::sigmoid_grouped_topk;
  c.router.n_group = 4, c.router.topk_group = 2, c.router.routed_scaling_factor = 2.5f;
  const Model m(c, 1, 31);
  Inputs in = random_inputs(c, {7, 5}, 32);
  Rows16 from_logits(2);
  auto comms = make_cpu_group(2, c.timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    const int64_t T = int64_t(in.x[r].size()) / c.hidden;
    std::vector<float> logits(size_t(T) * c.num_experts);
    m.router_logits(0, in.x[r].data(), T, logits.data());
    const TensorView lv = TensorView::of(logits.data(), DType::f32, {T, c.num_experts});
    route_cpu(c.router, lv, m.layer(0).bias.data(), c.top_k, in.ids[r].data(), in.w[r].data());
    MoeLayer layer(c, comm, m.rank_weights(0, r), m.layer(0).bias.data());
    from_logits[r].resize(size_t(T) * c.hidden);
    layer.forward(TensorView::of(in.x[r].data(), DType::bf16, {T, c.hidden}), lv,
                  TensorView::of(from_logits[r].data(), DType::bf16, {T, c.hidden}));
  });
  const Rows16 routed = run_layer(c, m, in);  // ids/weights were overwritten by route_cpu above
  EXPECT_EQ(from_logits, routed);
  expect_equal_to_plain(c, m, in, routed);
}

TEST(Layer, BadInputOnOneRankFailsEveryRank) {
  const MoeConfig c = base_config(2, 8, 2, 8);
  const Model m(c, 1, 41);
  Inputs in = random_inputs(c, {4, 4}, 42);
  in.ids[1][3] = 8;  // out of [-1, E)
  auto comms = make_cpu_group(2, c.timeout_ms);
  std::vector<std::string> errors(2);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    MoeLayer layer(c, comm, m.rank_weights(0, r));
    std::vector<bf16_raw> out(size_t(4) * c.hidden);
    try {
      layer.forward_routed(TensorView::of(in.x[r].data(), DType::bf16, {4, c.hidden}),
                           TensorView::of(in.ids[r].data(), DType::i32, {4, c.top_k}),
                           TensorView::of(in.w[r].data(), DType::f32, {4, c.top_k}),
                           TensorView::of(out.data(), DType::bf16, {4, c.hidden}));
    } catch (const UsageError& e) {
      errors[r] = e.what();
    }
  });
  EXPECT_FALSE(errors[0].empty());
  EXPECT_NE(errors[1].find("8"), std::string::npos) << errors[1];
}

TEST(Layer, RejectsWeightsOfTheWrongShape) {
  const MoeConfig c = base_config(1, 8, 2, 8);
  MoeConfig other = c;
  other.intermediate = 256;
  const Model m(other, 1, 1);
  auto comm = make_local_comm();
  try {
    MoeLayer layer(c, *comm, m.rank_weights(0, 0));
    FAIL() << "accepted weights of intermediate 256 for a layer of intermediate 128";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate=256"), std::string::npos) << e.what();
  }
}

// The stacked driver behind `epmoe run`: error against float64 with unquantized weights. The
// bounds are about 3x what the formats give on this model (measured: bf16 ~1e-5, fp8 ~1e-3,
// nvfp4 ~1.5e-2 in 1 - cosine after 4 layers of the tiny preset).
TEST(Stack, ErrorAgainstFloat64PerFormat) {
  const struct {
    ActFormat act;
    WeightFormat wf;
    double max_one_minus_cos;
  } cases[] = {{ActFormat::bf16, WeightFormat::bf16, 5e-5}, {ActFormat::fp8, WeightFormat::fp8, 4e-3},
               {ActFormat::nvfp4, WeightFormat::nvfp4, 5e-2}};
  for (const auto& k : cases) {
    MoeConfig c = base_config(4, 16, 4, 20);
    c.hidden = 256;
    c.dispatch_format = k.act, c.weight_format = k.wf, c.nvfp4_global_scale = 1.f;
    const Model m(c, 3, 7);
    const StackResult r = run_stack_cpu(m, {20, 0, 13, 0}, 11);
    EXPECT_EQ(r.out[1].size(), 0u);
    EXPECT_EQ(r.error.nonfinite, 0);
    EXPECT_LT(r.error.one_minus_cos, k.max_one_minus_cos) << format_name(k.act);
    EXPECT_GT(r.error.one_minus_cos, 0.0) << "quantized path identical to float64: comparison is not real";
  }
}

// The one synthetic generator: any rank builds exactly the bytes the whole model holds for it,
// and the float64 check that regenerates experts equals the oracle on the whole model.
TEST(Synthetic, RankWeightsAndCheckMatchTheWholeModel) {
  for (WeightFormat wf : {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4}) {
    MoeConfig c = base_config(4, 16, 4, 20);
    c.weight_format = wf;
    c.dispatch_format = ActFormat::bf16;
    const Model m(c, 2, 9);
    for (int l = 0; l < 2; ++l)
      for (int r = 0; r < 4; ++r) {
        const harness::RankWeights w = harness::rank_weights(c, 9, l, r);
        EXPECT_EQ(w.w13.data, m.layer(l).rank_w13[r].data) << format_name(wf) << " layer " << l << " rank " << r;
        EXPECT_EQ(w.w2.scales, m.layer(l).rank_w2[r].scales);
        EXPECT_EQ(w.w13.global_scale, m.layer(l).rank_w13[r].global_scale);
      }
  }
  MoeConfig c = base_config(4, 16, 4, 20);
  const Model m(c, 2, 9);
  const int64_t S = 6;
  const std::vector<bf16_raw> h = random_hidden(S, c.hidden, 3);
  const std::vector<double> x = oracle::widen_bf16(h.data(), h.size());
  std::vector<int32_t> ids = {0, 5, 9, -1, 15, 3, 3, 7, 1, 2, 4, 8, 11, 12, 13, 14, 0, 1, 2, 3, 6, 10, 15, -1};
  std::vector<float> w(ids.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * float(i % 5) + 0.05f;
  std::vector<double> got, want(size_t(S) * c.hidden);
  harness::moe_f64(c, 9, 1, x, S, ids, w, got);
  const auto dense = oracle::DenseExperts::from_fp32(m.layer(1).w13.data(), m.layer(1).w2.data(), 16, c.hidden,
                                                     c.intermediate);
  oracle::moe_forward(dense, x.data(), S, ids.data(), w.data(), c.top_k, want.data());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_DOUBLE_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace epmoe
