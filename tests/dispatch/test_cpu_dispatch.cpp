// The "local" and "cpu" dispatchers against the single-process oracle of dispatch_harness.h
// (bitwise), plus their error behaviour: capacity, bad ids, mismatched configurations, a rank that
// never arrives.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "dispatch/dispatch_harness.h"
#include "epmoe/error.h"

namespace epmoe::test {
namespace {

std::vector<int64_t> random_token_counts(int R, int C, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> T(R);
  for (int r = 0; r < R; ++r) T[r] = std::uniform_int_distribution<int>(0, C)(rng);
  if (R > 1) T[1] = 0;      // a rank with no tokens takes part normally
  T[R - 1] = C;             // and one that fills its capacity exactly
  return T;
}

void check_all_ranks(const MoeConfig& cfg, const std::vector<RankInput>& in, const std::string& ctx) {
  const std::vector<Received> got = run_dispatch(cfg, in);
  for (int d = 0; d < cfg.num_ranks; ++d)
    expect_received(cfg, expected_receive(cfg, in, d), got[d], ctx + " rank " + std::to_string(d));
}

TEST(CpuDispatch, RandomizedMatchesOracleOverRanksAndTopK) {
  for (int R : {1, 2, 3, 4, 8}) {
    for (int K : {1, 2, 8}) {
      const uint32_t seed = 1000u * R + K;
      MoeConfig cfg = make_config(R, 24, K, 128, 16);
      const auto in = random_inputs(cfg, random_token_counts(R, cfg.capacity, seed), seed);
      check_all_ranks(cfg, in, "R=" + std::to_string(R) + " K=" + std::to_string(K));
    }
  }
}

TEST(CpuDispatch, QuantizedFormatsMatchOracle) {
  for (ActFormat f : {ActFormat::fp8, ActFormat::nvfp4}) {
    for (int R : {1, 3, 4}) {
      MoeConfig cfg = make_config(R, 24, 2, 256, 8, f);
      cfg.fp8_ue8m0 = R == 3;  // both fp8 scale rules
      const auto in = random_inputs(cfg, random_token_counts(R, cfg.capacity, 7u + R), 7u + R);
      check_all_ranks(cfg, in, std::string(format_name(f)) + " R=" + std::to_string(R));
    }
  }
}

TEST(CpuDispatch, ZeroTokensOnEveryRank) {
  MoeConfig cfg = make_config(4, 16, 2, 128, 8);
  const auto in = random_inputs(cfg, {0, 0, 0, 0}, 3);
  const std::vector<Received> got = run_dispatch(cfg, in);
  for (const Received& r : got) {
    EXPECT_EQ(r.counts, std::vector<int32_t>(4, 0));
    EXPECT_EQ(r.expert_counts, std::vector<int32_t>(4, 0));
    for (int32_t id : r.ids) ASSERT_EQ(id, -1);
  }
  check_all_ranks(cfg, in, "all zero");
}

TEST(CpuDispatch, SeveralExpertsOfATokenOnOneRankMakeOneCopy) {
  MoeConfig cfg = make_config(2, 8, 4, 128, 4);
  auto in = random_inputs(cfg, {2, 1}, 5, 0.0);
  // token 0 of rank 0: experts 0..3, all on rank 0; token 1: 1 and 6 (one per rank) and two -1.
  in[0].ids = {3, 0, 2, 1, 1, -1, 6, -1};
  in[1].ids = {7, 4, 5, 6};  // every expert on rank 1
  const std::vector<Received> got = run_dispatch(cfg, in);
  EXPECT_EQ(got[0].counts, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(got[1].counts, (std::vector<int32_t>{1, 1}));
  const int K = 4, C = 4;
  EXPECT_EQ(std::vector<int32_t>(got[0].ids.begin(), got[0].ids.begin() + K), (std::vector<int32_t>{3, 0, 2, 1}));
  EXPECT_EQ(std::vector<int32_t>(got[0].ids.begin() + K, got[0].ids.begin() + 2 * K),
            (std::vector<int32_t>{1, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(got[1].ids.begin(), got[1].ids.begin() + K), (std::vector<int32_t>{-1, -1, 2, -1}));
  EXPECT_EQ(std::vector<int32_t>(got[1].ids.begin() + C * K, got[1].ids.begin() + C * K + K),
            (std::vector<int32_t>{3, 0, 1, 2}));
  EXPECT_EQ(got[0].expert_counts, (std::vector<int32_t>{1, 2, 1, 1}));
  EXPECT_EQ(got[1].expert_counts, (std::vector<int32_t>{1, 1, 2, 1}));
  check_all_ranks(cfg, in, "same-rank experts");
}

TEST(CpuDispatch, ExplicitRedundantPlacement) {
  // 8 experts on 4 ranks, 3 slots each: expert e at (e/2, e%2); hot expert 0 also on ranks 2 and
  // 3 (slot 2); expert 5 also on rank 0 (slot 2).
  std::vector<std::vector<ExpertCopy>> copies(8);
  for (int e = 0; e < 8; ++e) copies[e].push_back({e / 2, e % 2});
  copies[0].push_back({2, 2});
  copies[0].push_back({3, 2});
  copies[5].push_back({0, 2});
  MoeConfig cfg = make_config(4, 8, 2, 128, 12);
  cfg.placement = ExpertPlacement::explicit_map(4, 3, copies);
  auto in = random_inputs(cfg, {12, 5, 0, 9}, 11, 0.05);
  // Make expert 0 hot so every copy is used.
  for (auto& r : in)
    for (size_t i = 0; i < r.ids.size(); i += 2) r.ids[i] = 0;
  for (auto& r : in)
    for (size_t i = 1; i < r.ids.size(); i += 2)
      if (r.ids[i] == 0) r.ids[i] = 5;
  check_all_ranks(cfg, in, "redundant placement");
  // Rank 1 has no copy of expert 0: its tokens alternate over ranks 0, 2, 3 by (s + t) mod 3.
  const std::vector<Received> got = run_dispatch(cfg, in);
  EXPECT_GT(got[2].counts[1], 0);
  EXPECT_GT(got[3].counts[1], 0);
  EXPECT_EQ(got[2].counts[2], 0);  // rank 2 dispatches nothing
}

TEST(CpuDispatch, MinusOneIdsAndAllMinusOneTokens) {
  MoeConfig cfg = make_config(3, 12, 2, 128, 6);
  auto in = random_inputs(cfg, {6, 6, 6}, 13, 0.5);
  for (int k = 0; k < 2; ++k) in[2].ids[k] = -1;  // token 0 of rank 2 goes nowhere
  check_all_ranks(cfg, in, "minus one");
}

TEST(CpuDispatch, NanAndInfPassThroughBitwise) {
  MoeConfig cfg = make_config(2, 4, 2, 128, 2);
  auto in = random_inputs(cfg, {2, 1}, 17, 0.0);
  const bf16_raw specials[] = {0x7fc0, 0xffc1, 0x7f80, 0xff80, 0x0001, 0x8000, 0x7f81, 0x7f7f};
  for (auto& r : in)
    for (size_t i = 0; i < r.hidden.size(); i += 3) r.hidden[i] = specials[(i / 3) % 8];
  const std::vector<Received> got = run_dispatch(cfg, in);
  check_all_ranks(cfg, in, "nan/inf");
  // And literally the caller's bits: token 0 of rank 0 is at slot 0 of region 0 wherever it went.
  const int d = (in[0].ids[0] / 2 == 0 || in[0].ids[1] / 2 == 0) ? 0 : 1;
  EXPECT_EQ(0, std::memcmp(got[d].payload.data(), in[0].hidden.data(), 2 * 128));
}

TEST(CpuDispatch, BackToBackCallsAreIndependent) {
  for (int R : {2, 8}) {
    MoeConfig cfg = make_config(R, 16, 2, 128, 8, ActFormat::bf16, R == 8 ? ActFormat::fp8 : ActFormat::bf16);
    auto comms = make_cpu_group(R, cfg.timeout_ms);
    std::vector<std::vector<RankInput>> steps;
    for (uint32_t i = 0; i < 20; ++i)
      steps.push_back(random_inputs(cfg, random_token_counts(R, 8, 50 + i), 50 + i));
    std::vector<std::vector<Received>> got(steps.size(), std::vector<Received>(R));
    std::vector<std::vector<std::vector<bf16_raw>>> outs(steps.size(), std::vector<std::vector<bf16_raw>>(R));
    run_ranks(comms, [&](Communicator& comm) {
      const int r = comm.rank();
      auto disp = create_dispatcher(cfg, comm);
      for (size_t i = 0; i < steps.size(); ++i) {
        const DispatchOutput o = disp->dispatch(steps[i][r].view());
        got[i][r] = snapshot(o);
        // Combine in between, as a layer does, so combine and dispatch phases interleave.
        std::vector<bf16_raw> y = fake_run(cfg, o, r);
        outs[i][r].resize(size_t(steps[i][r].T) * cfg.hidden);
        disp->combine(CombineInput{y.data()}, outs[i][r].data());
      }
    });
    for (size_t i = 0; i < steps.size(); ++i)
      for (int d = 0; d < R; ++d) {
        const std::string ctx = "R=" + std::to_string(R) + " step " + std::to_string(i) + " rank " + std::to_string(d);
        expect_received(cfg, expected_receive(cfg, steps[i], d), got[i][d], ctx);
        EXPECT_EQ(expected_combine(cfg, steps[i], d), outs[i][d]) << ctx;
      }
  }
}

TEST(CpuDispatch, OverCapacityFailsOnEveryRankAndSendsNothing) {
  MoeConfig cfg = make_config(4, 16, 2, 128, 16);
  auto comms = make_cpu_group(4, cfg.timeout_ms);
  const auto good = random_inputs(cfg, {16, 3, 16, 0}, 21);  // T = C is fine
  const auto bad = random_inputs(cfg, {1, 16, 17, 4}, 22);   // rank 2: T = C + 1
  std::vector<Received> before(4), after(4);
  std::vector<std::string> errors(4);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    auto disp = create_dispatcher(cfg, comm);
    const DispatchOutput o = disp->dispatch(good[r].view());
    before[r] = snapshot(o);
    try {
      disp->dispatch(bad[r].view());
    } catch (const UsageError& e) {
      errors[r] = e.what();
    }
    after[r] = snapshot(o);  // the views of the good dispatch: nothing may have been written
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("rank 2: T=17 tokens exceeds capacity C=16"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("--capacity"), std::string::npos) << errors[r];
    EXPECT_EQ(before[r].payload, after[r].payload);
    EXPECT_EQ(before[r].ids, after[r].ids);
    EXPECT_EQ(before[r].counts, after[r].counts);
    expect_received(cfg, expected_receive(cfg, good, r), after[r], "after failed dispatch");
  }
}

TEST(CpuDispatch, OutOfRangeIdFailsOnEveryRank) {
  MoeConfig cfg = make_config(3, 12, 2, 128, 4);
  auto in = random_inputs(cfg, {4, 4, 4}, 23);
  in[1].ids[5] = 12;
  in[2].ids[0] = -2;
  auto comms = make_cpu_group(3, cfg.timeout_ms);
  std::atomic<int> thrown{0};
  std::vector<std::string> errors(3);
  run_ranks(comms, [&](Communicator& comm) {
    auto disp = create_dispatcher(cfg, comm);
    try {
      disp->dispatch(in[comm.rank()].view());
    } catch (const UsageError& e) {
      ++thrown;
      errors[comm.rank()] = e.what();
    }
  });
  EXPECT_EQ(thrown.load(), 3);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 1: topk_ids[token 2, k 1] = 12 is outside [-1, E=12)"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 2: topk_ids[token 0, k 0] = -2"), std::string::npos) << e;
  }
}

TEST(CpuDispatch, MismatchedConfigsFailWithoutHanging) {
  MoeConfig cfg = make_config(4, 16, 2, 128, 16);
  cfg.timeout_ms = 20000;  // a hang would show as a slow test, not as a quick timeout
  auto comms = make_cpu_group(4, cfg.timeout_ms);
  std::vector<std::string> errors(4);
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(comms, [&](Communicator& comm) {
    MoeConfig mine = cfg;
    if (comm.rank() == 1) mine.capacity = 32;
    if (comm.rank() == 3) mine.dispatch_format = ActFormat::fp8;
    try {
      create_dispatcher(mine, comm);
    } catch (const UsageError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  for (const auto& e : errors) {
    EXPECT_NE(e.find("MoeConfig differs between ranks"), std::string::npos) << e;
    EXPECT_NE(e.find("ranks 1, 3"), std::string::npos) << e;
  }
}

TEST(CpuDispatch, RankThatNeverCallsIsNamedInTimeout) {
  MoeConfig cfg = make_config(3, 12, 2, 128, 4);
  cfg.timeout_ms = 300;
  auto comms = make_cpu_group(3, cfg.timeout_ms);
  const auto in = random_inputs(cfg, {4, 4, 4}, 29);
  std::vector<std::string> errors(3);
  std::vector<int> missing(3, -1);
  run_ranks(comms, [&](Communicator& comm) {
    auto disp = create_dispatcher(cfg, comm);
    if (comm.rank() == 2) return;  // never dispatches
    try {
      disp->dispatch(in[comm.rank()].view());
    } catch (const TimeoutError& e) {
      errors[comm.rank()] = e.what();
      missing[comm.rank()] = e.rank();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(missing[r], 2);
    EXPECT_NE(errors[r].find("rank 2 did not arrive within 300 ms at dispatch/counts"), std::string::npos)
        << errors[r];
  }
}

TEST(CpuDispatch, WrongCommunicatorOrRankCountIsAUsageError) {
  MoeConfig cfg = make_config(2, 8, 2, 128, 4);
  auto local = make_local_comm();
  EXPECT_THROW(create_dispatcher(cfg, *local), UsageError);  // "cpu" on a local communicator
  MoeConfig one = make_config(1, 8, 2, 128, 4);
  auto group = make_cpu_group(2, 2000);
  std::atomic<int> thrown{0};
  run_ranks(group, [&](Communicator& comm) {
    try {
      create_dispatcher(one, comm);  // "local" on a 2-rank group
    } catch (const UsageError&) {
      ++thrown;
    }
  });
  EXPECT_EQ(thrown.load(), 2);
}

TEST(LocalDispatch, SameBitsAsCpuWithOneRank) {
  MoeConfig local = make_config(1, 8, 2, 256, 8, ActFormat::fp8);
  MoeConfig cpu = local;
  cpu.dispatcher = "cpu";
  const auto in = random_inputs(local, {7}, 31);
  const auto a = run_dispatch(local, in);
  const auto b = run_dispatch(cpu, in);
  expect_received(local, expected_receive(local, in, 0), a[0], "local");
  expect_received(cpu, a[0], b[0], "cpu vs local");
  // Over capacity on the local dispatcher too.
  auto comm = make_local_comm();
  auto disp = create_dispatcher(local, *comm);
  const auto big = random_inputs(local, {9}, 32);
  EXPECT_THROW(disp->dispatch(big[0].view()), UsageError);
}

}  // namespace
}  // namespace epmoe::test
