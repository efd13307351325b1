// Combine: every y goes back to its home rank and is summed in fp32 in ascending rank order
// (DESIGN.md §5), bf16 or fp8 on the way back; checked bitwise against the single-process oracle
// of tests/dispatch/dispatch_harness.h, and the reduction order directly on combine_sum.
#include <gtest/gtest.h>

#include <atomic>

#include "combine/reduce.h"
#include "dispatch/dispatch_harness.h"
#include "dispatch/plan.h"
#include "epmoe/error.h"

namespace epmoe::test {
namespace {

// dispatch -> fake runner -> combine on every rank; returns each rank's out [T, H].
std::vector<std::vector<bf16_raw>> run_step(const MoeConfig& cfg, const std::vector<RankInput>& in) {
  std::vector<std::vector<bf16_raw>> out(cfg.num_ranks);
  std::vector<std::unique_ptr<Communicator>> comms;
  if (cfg.dispatcher == "local")
    comms.push_back(make_local_comm());
  else
    comms = make_cpu_group(cfg.num_ranks, cfg.timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    auto disp = create_dispatcher(cfg, comm);
    const DispatchOutput o = disp->dispatch(in[r].view());
    const std::vector<bf16_raw> y = fake_run(cfg, o, r);
    out[r].assign(size_t(in[r].T) * cfg.hidden, 0xdead);
    disp->combine(CombineInput{y.data()}, out[r].data());
  });
  return out;
}

void expect_combine(const MoeConfig& cfg, const std::vector<RankInput>& in, const std::string& ctx) {
  const auto out = run_step(cfg, in);
  for (int s = 0; s < cfg.num_ranks; ++s) {
    const auto want = expected_combine(cfg, in, s);
    ASSERT_EQ(want.size(), out[s].size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(want[i], out[s][i]) << ctx << " rank " << s << " token " << i / cfg.hidden << " h " << i % cfg.hidden;
  }
}

TEST(Combine, Bf16MatchesOracleOverRanksAndTopK) {
  for (int R : {1, 2, 3, 4, 8}) {
    for (int K : {1, 2, 8}) {
      MoeConfig cfg = make_config(R, 24, K, 128, 8);
      std::vector<int64_t> T(R, 8);
      T[0] = R > 1 ? 0 : 5;
      expect_combine(cfg, random_inputs(cfg, T, 300u + 10u * R + K, 0.15), "R=" + std::to_string(R) + " K=" + std::to_string(K));
    }
  }
}

TEST(Combine, Fp8PayloadMatchesOracle) {
  for (bool ue8m0 : {false, true}) {
    for (int R : {1, 4}) {
      MoeConfig cfg = make_config(R, 16, 4, 256, 6, ActFormat::fp8, ActFormat::fp8);
      cfg.fp8_ue8m0 = ue8m0;
      expect_combine(cfg, random_inputs(cfg, std::vector<int64_t>(R, 6), 400u + R), "fp8 R=" + std::to_string(R));
    }
  }
  // nvfp4 dispatch with fp8 combine.
  MoeConfig cfg = make_config(3, 12, 2, 128, 5, ActFormat::nvfp4, ActFormat::fp8);
  expect_combine(cfg, random_inputs(cfg, {5, 2, 0}, 410), "nvfp4/fp8");
}

TEST(Combine, TokensWithoutExpertsGetZeros) {
  MoeConfig cfg = make_config(2, 8, 2, 128, 4);
  auto in = random_inputs(cfg, {3, 4}, 420, 0.0);
  in[0].ids[2] = in[0].ids[3] = -1;  // token 1 of rank 0 goes nowhere
  in[1].hidden[0] = 0x7fc0;          // a NaN in a token of rank 1 must not leak elsewhere
  const auto out = run_step(cfg, in);
  for (int h = 0; h < cfg.hidden; ++h) ASSERT_EQ(out[0][cfg.hidden + h], 0) << h;
  expect_combine(cfg, in, "zeros");
}

TEST(Combine, CombineWithoutDispatchFailsOnEveryRank) {
  MoeConfig cfg = make_config(3, 12, 2, 128, 4);
  auto comms = make_cpu_group(3, 2000);
  std::atomic<int> thrown{0};
  run_ranks(comms, [&](Communicator& comm) {
    auto disp = create_dispatcher(cfg, comm);
    std::vector<bf16_raw> y(size_t(3) * 4 * 128), out(128);
    try {
      disp->combine(CombineInput{y.data()}, out.data());
    } catch (const UsageError& e) {
      if (std::string(e.what()).find("without a successful dispatch") != std::string::npos) ++thrown;
    }
  });
  EXPECT_EQ(thrown.load(), 3);
}

TEST(CombineSum, AscendingRankOrderInFp32) {
  // One token sent to ranks 0, 1, 2 with y = 1, 2^27, -2^27: in fp32, (0 + 1) + 2^27 rounds to 2^27
  // and the sum is 0; descending order gives (-2^27 + 2^27) + 1 = 1.
  detail::DispatchPlan plan;
  plan.num_ranks = 3;
  plan.top_k = 3;
  plan.num_tokens = 2;
  plan.slot = {0, 0, 0, 1, -1, 1};  // token 1: ranks 0 and 2, slot 1 there
  const int H = 2, C = 2;
  std::vector<bf16_raw> recv(size_t(3) * C * H, 0);
  auto put = [&](int d, int j, float a, float b) {
    recv[(size_t(d) * C + j) * H] = num::f32_to_bf16(a);
    recv[(size_t(d) * C + j) * H + 1] = num::f32_to_bf16(b);
  };
  put(0, 0, 1.f, 1.f);
  put(1, 0, 134217728.f, 2.f);
  put(2, 0, -134217728.f, 3.f);
  put(0, 1, 0.5f, -0.25f);
  put(1, 1, 1000.f, 1000.f);  // token 1 did not go to rank 1: must be ignored
  put(2, 1, 0.25f, 0.25f);
  std::vector<bf16_raw> out(2 * H);
  detail::combine_sum(ActFormat::bf16, QuantParams{}, H, C, plan, reinterpret_cast<const uint8_t*>(recv.data()),
                      nullptr, out.data());
  EXPECT_EQ(num::bf16_to_f32(out[0]), 0.f);
  EXPECT_EQ(num::bf16_to_f32(out[1]), 6.f);
  EXPECT_EQ(num::bf16_to_f32(out[2]), 0.75f);
  EXPECT_EQ(num::bf16_to_f32(out[3]), 0.f);
  EXPECT_THROW(detail::combine_sum(ActFormat::nvfp4, QuantParams{}, 16, C, plan, nullptr, nullptr, out.data()),
               UsageError);
}

}  // namespace
}  // namespace epmoe::test
